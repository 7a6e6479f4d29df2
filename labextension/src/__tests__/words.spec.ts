import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { describeAction } from '../action';
import { IKernelReport, IStatus } from '../api';
import { plainError } from '../kernelcmd';
import { IHoldableContext, KernelHold } from '../kernelhold';
import { IOffer, restartSentence } from '../offers';
import { displayName, kernelOutcomeText, orderKernels } from '../report';
import { describeStatus, headerLabel } from '../status';
import { trans } from './trans';

function status(partial: Partial<IStatus>): IStatus {
  return { state: 'running', ...partial } as IStatus;
}

const GPU = { type: 'nvidia-l4', count: 1 };
const NONE = { type: 'none', count: 0 };

describe('plain words on a machine without an accelerator', () => {
  it('says what a pause frees, and mentions an accelerator only when there is one', () => {
    for (const state of ['paused', 'running', 'releasing'] as const) {
      const cpu = describeStatus(
        status({ state, accelerator: NONE }),
        null,
        trans
      );
      assert.doesNotMatch(`${cpu.label} ${cpu.tooltip}`, /accelerator/i, state);
      const gpu = describeStatus(
        status({ state, accelerator: GPU }),
        null,
        trans
      );
      assert.match(`${gpu.label} ${gpu.tooltip}`, /accelerator/i, state);
    }
    assert.match(
      describeStatus(status({ state: 'paused' }), null, trans).tooltip,
      /memory is released/
    );
    assert.equal(
      describeStatus(status({ state: 'releasing' }), null, trans).label,
      'Stopping kernels'
    );
    const pause = describeAction(
      status({ accelerator: NONE }),
      null,
      [],
      false,
      trans
    );
    assert.doesNotMatch(pause.tooltip, /accelerator/);
    assert.match(pause.tooltip, /checkpoint of every kernel/);
  });
});

describe('after a kernel restart or death', () => {
  const created = new Date(2026, 11, 1, 10, 42, 0).toISOString();
  const offer: IOffer = {
    id: 'o1',
    kind: 'autosave',
    cause: 'kernel_died',
    path: 'work/a.ipynb',
    checkpoint_id: 'cp1',
    created_at: created,
    variables: 7
  };

  it('the green "Restored from checkpoint" goes away and the offer is said', () => {
    const ready = status({
      state: 'ready',
      outcome: 'restored',
      offers: [offer]
    });
    const v = describeStatus(ready, null, trans);
    assert.equal(v.label, 'Kernel died: state gone');
    assert.equal(v.severity, 'warn');
    assert.match(
      v.tooltip,
      /work\/a\.ipynb: kernel died: its state is gone; restore the state of 10:42 \(7 variables\)\?/
    );
  });

  it('a restart the page saw, with no offer, points to the last checkpoint; a cell run since ends it', () => {
    const ready = status({
      state: 'ready',
      outcome: 'restored',
      last_checkpoint: { id: 'c', created }
    });
    const v = describeStatus(ready, null, trans, [
      { path: 'a.ipynb', used: false }
    ]);
    assert.equal(v.label, 'Kernel restarted: state gone');
    assert.match(
      v.tooltip,
      /kernel restarted: its state is gone; restore the checkpoint of 10:42\?/
    );
    const used = describeStatus(ready, null, trans, [
      { path: 'a.ipynb', used: true }
    ]);
    assert.equal(used.label, 'Workspace running');
    assert.equal(
      describeStatus(ready, null, trans).label,
      'Restored from checkpoint'
    );
  });

  it('a death with nothing saved offers nothing', () => {
    const none = { ...offer, kind: null, checkpoint_id: null };
    assert.equal(
      restartSentence(none, null, trans),
      'kernel died: its state is gone (nothing of it was saved).'
    );
  });
});

describe('Notebook 7 header', () => {
  it('never says "checkpoint" (the header has "Last Checkpoint" for the file save)', () => {
    const saving = describeStatus(
      status({
        state: 'checkpointing',
        step: { name: 'checkpoint', done: 40, total: 100 }
      }),
      null,
      trans
    );
    assert.equal(headerLabel(saving, null, trans), 'Saving state 40%');
    const restored = describeStatus(
      status({ state: 'ready', outcome: 'restored' }),
      null,
      trans
    );
    assert.equal(headerLabel(restored, null, trans), 'State restored');
    const paused = describeStatus(status({ state: 'paused' }), null, trans);
    assert.equal(headerLabel(paused, null, trans), 'Paused');
  });
});

describe('the report', () => {
  const k = (path: string, n: number): IKernelReport => ({
    path,
    outcome: 'restored',
    variables: Array.from({ length: n }, (_, i) => ({
      name: `v${i}`,
      status: 'restored'
    }))
  });

  it('puts the current notebook first, then those with variables', () => {
    const kernels = [
      k('a.ipynb', 0),
      k('b.ipynb', 2),
      k('z.ipynb', 1),
      k('console-1-x', 0)
    ];
    const { first, rest } = orderKernels(kernels, 'z.ipynb');
    assert.deepEqual(
      first.map(x => x.path),
      ['z.ipynb']
    );
    assert.deepEqual(
      rest.map(x => x.path),
      ['b.ipynb', 'a.ipynb', 'console-1-x']
    );
    assert.deepEqual(
      orderKernels(kernels, null).first.map(x => x.path),
      ['b.ipynb']
    );
  });

  it('names kernels as a person knows them', () => {
    assert.equal(
      displayName('work/deep/analysis.ipynb', trans),
      'analysis.ipynb'
    );
    assert.equal(
      displayName('console-1-f632f277-1c2d-4e5f-8a9b-0123456789ab', trans),
      'Console 1'
    );
    assert.equal(
      kernelOutcomeText('restored', trans),
      'its variables were restored into a new kernel'
    );
    assert.doesNotMatch(
      kernelOutcomeText('restored', trans),
      /live process|token/
    );
    assert.equal(
      kernelOutcomeText('restored', trans, 0),
      'a new kernel (it had no variables to restore)'
    );
  });

  it('says a magic error in one plain line', () => {
    assert.equal(
      plainError(
        "UsageError: %restore failed: no checkpoint for 'a.ipynb' in /x/store\nmore"
      ),
      "no checkpoint for 'a.ipynb' in /x/store"
    );
  });
});

describe('KernelHold: kernel changes and restarts', () => {
  class Ctx implements IHoldableContext {
    hasNoKernel = true;
    isReady = true;
    isDisposed = false;
    calls: string[] = [];
    async startKernel() {
      this.calls.push('start');
      return false;
    }
    async changeKernel(options?: unknown) {
      this.calls.push(`change:${JSON.stringify(options)}`);
      return null;
    }
    async restartKernel() {
      this.calls.push('restart');
    }
  }

  it('refuses Change Kernel and Restart while paused, never joining an existing kernel', async () => {
    const refused: string[] = [];
    const hold = new KernelHold({
      onRunWhilePaused: () => undefined,
      onRunWaiting: () => undefined,
      onStartRefused: mode => refused.push(mode)
    });
    const ctx = new Ctx();
    hold.attach(ctx);
    hold.set('paused');
    await ctx.changeKernel({ name: 'python3' });
    await ctx.restartKernel();
    assert.deepEqual(ctx.calls, []);
    assert.deepEqual(refused, ['paused', 'paused']);
    await ctx.changeKernel({ id: 'k1' }); // the resume's reconnect: starts nothing
    assert.deepEqual(ctx.calls, ['change:{"id":"k1"}']);
    hold.set('free');
    await ctx.restartKernel();
    assert.deepEqual(ctx.calls, ['change:{"id":"k1"}', 'restart']);
  });
});
