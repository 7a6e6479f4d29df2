import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import type { IFlight, IUncheckpointable } from '../api';
import {
  describeLoss,
  ILossDialog,
  pauseOrAsk,
  uncheckpointableOf
} from '../pauseanyway';
import { kernelOutcomeText } from '../report';
import { trans } from './trans';

const echo: IUncheckpointable = {
  kernel_id: 'e0e0e0e0-1111-2222-3333-444444444444',
  path: 'notes.ipynb',
  kernel: 'echo',
  language: 'echo',
  why: 'jupyter-pause checkpoints Python kernels; this kernel runs echo',
  install_command: null
};
const bare: IUncheckpointable = {
  kernel_id: 'b0b0b0b0-1111-2222-3333-444444444444',
  path: null,
  kernel: 'other-env',
  language: 'python',
  why: "jupyter-pause-kernel is not installed in this kernel's environment",
  install_command:
    '/envs/other/bin/python -m pip install jupyter-pause-kernel==0.1.0'
};

/** An error shaped as `api.ts`'s APIError (status, JSON body), without loading JupyterLab. */
class APIError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly body: Record<string, unknown> | null = null
  ) {
    super(message);
  }
}

/** The 409 `POST pause` answers, as `requestAPI` throws it. */
const refused = (kernels: IUncheckpointable[]) =>
  new APIError('pausing would lose the state of ...', 409, {
    message: 'pausing would lose the state of ...',
    reason: 'uncheckpointable',
    uncheckpointable: kernels
  });

const flight: IFlight = { id: 'pause-1', kind: 'pause' };

/** A controller whose answers are scripted, and a person whose answers are too. */
function script(answers: Array<IFlight | Error>, choices: boolean[]) {
  const pauses: Array<string[] | undefined> = [];
  const asked: ILossDialog[] = [];
  return {
    pauses,
    asked,
    deps: {
      pause: async (loseState?: string[]) => {
        pauses.push(loseState);
        const next = answers.shift();
        if (next === undefined) {
          throw new Error('no more answers');
        }
        if (next instanceof Error) {
          throw next;
        }
        return next;
      },
      ask: async (dialog: ILossDialog) => {
        asked.push(dialog);
        return choices.shift() ?? false;
      }
    }
  };
}

describe('uncheckpointableOf', () => {
  it('reads the kernels of a 409 uncheckpointable refusal', () => {
    assert.deepEqual(uncheckpointableOf(refused([echo, bare])), [echo, bare]);
  });

  it('is null for any other refusal', () => {
    assert.equal(
      uncheckpointableOf(new APIError('a pause is in progress', 409, {})),
      null
    );
    assert.equal(uncheckpointableOf(new APIError('already paused', 409)), null);
    assert.equal(
      uncheckpointableOf(
        new APIError('no', 400, { reason: 'uncheckpointable' })
      ),
      null
    );
    assert.equal(uncheckpointableOf(new Error('network')), null);
    assert.equal(uncheckpointableOf(null), null);
  });
});

describe('describeLoss', () => {
  it('names each kernel, why, and the command that would fix it', () => {
    const d = describeLoss([echo, bare], trans);
    assert.equal(d.title, 'Pause anyway?');
    assert.match(d.intro, /The state of these kernels will be lost/);
    assert.equal(d.cancel, 'Cancel');
    assert.equal(d.accept, 'Pause anyway');
    assert.deepEqual(d.lines, [
      { name: 'notes.ipynb (echo)', why: echo.why, command: null },
      {
        name: 'kernel b0b0b0b0 (other-env)',
        why: bare.why,
        command: bare.install_command
      }
    ]);
  });

  it('speaks of one kernel in the singular', () => {
    assert.match(
      describeLoss([echo], trans).intro,
      /^The state of this kernel will be lost/
    );
  });
});

describe('pauseOrAsk', () => {
  it('pauses at once when no kernel would lose its state', async () => {
    const s = script([flight], []);
    assert.deepEqual(await pauseOrAsk(s.deps, trans), flight);
    assert.deepEqual(s.pauses, [undefined]);
    assert.equal(s.asked.length, 0);
  });

  it('Cancel sends nothing more: the pause does not happen', async () => {
    const s = script([refused([echo])], [false]);
    assert.equal(await pauseOrAsk(s.deps, trans), null);
    assert.deepEqual(s.pauses, [undefined]);
    assert.equal(s.asked.length, 1);
    assert.equal(s.asked[0].lines[0].name, 'notes.ipynb (echo)');
  });

  it('Pause anyway pauses again allowing exactly the kernels named', async () => {
    const s = script([refused([echo, bare]), flight], [true]);
    assert.deepEqual(await pauseOrAsk(s.deps, trans), flight);
    assert.deepEqual(s.pauses, [undefined, [echo.kernel_id, bare.kernel_id]]);
  });

  it('asks again about a kernel that appeared meanwhile, keeping the first answer', async () => {
    const s = script([refused([echo]), refused([bare]), flight], [true, true]);
    assert.deepEqual(await pauseOrAsk(s.deps, trans), flight);
    assert.deepEqual(s.pauses, [
      undefined,
      [echo.kernel_id],
      [echo.kernel_id, bare.kernel_id]
    ]);
    assert.equal(s.asked.length, 2);
  });

  it('passes any other refusal on', async () => {
    const busy = new APIError('a resume is in progress', 409, {
      message: 'busy'
    });
    const s = script([busy], []);
    await assert.rejects(pauseOrAsk(s.deps, trans), busy);
    assert.equal(s.asked.length, 0);
  });
});

describe('the report of a kernel whose state was not saved', () => {
  it('says why, and never "restored"', () => {
    const text = kernelOutcomeText('fresh', trans, 0, echo.why ?? null);
    assert.equal(text, `started empty: its state was not saved (${echo.why})`);
    assert.doesNotMatch(text, /restored/);
    assert.equal(
      kernelOutcomeText('fresh', trans),
      'started empty: there was no saved state'
    );
  });
});
