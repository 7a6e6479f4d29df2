import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { busyPaths, describeAction } from '../action';
import { IReport, IStatus } from '../api';
import { formatBytes, formatDuration } from '../format';
import {
  durationRows,
  groupVariables,
  hasNewReport,
  reportHeadline
} from '../report';
import { describeStatus, isFlightActive, stepProgress } from '../status';
import { trans } from './trans';

const backend = {
  name: 'local',
  configured: true,
  can_pause: true,
  why_not: null
};

function status(partial: Partial<IStatus>): IStatus {
  return {
    state: 'running',
    outcome: null,
    step: null,
    reason: null,
    hint: null,
    flight: null,
    timeline: [],
    backend,
    kernels: [
      { id: 'k1', name: 'python3', path: 'a.ipynb', execution_state: 'idle' }
    ],
    last_checkpoint: null,
    last_report: null,
    ...partial
  };
}

const report: IReport = {
  flight_id: 'f2',
  outcome: 'restored',
  requested: '2026-11-30T05:00:00Z',
  usable: '2026-11-30T05:00:04.500Z',
  durations: {
    start_kernels_s: 2.5,
    verify_s: 0.2,
    restore_s: 1.6,
    total_s: 4.5
  },
  kernels: [
    {
      path: 'a.ipynb',
      kernel_id: 'k9',
      outcome: 'restored',
      reason: null,
      checkpoint_id: 'cp1',
      variables: [
        { name: 'x', kind: 'int', size: 28, status: 'restored', reason: null },
        {
          name: 'df',
          kind: 'DataFrame',
          size: 2048,
          status: 'restored',
          reason: null
        },
        {
          name: 'gen',
          kind: 'generator',
          size: null,
          status: 'skipped',
          reason: 'generators cannot be pickled',
          recomputable: true,
          cell: { execution_count: 3, source: 'gen = (i for i in range(3))' }
        },
        {
          name: 'sock',
          kind: 'socket',
          status: 'skipped',
          reason: 'open socket',
          recomputable: false
        },
        { name: 'm', kind: 'Module', status: 'failed', reason: 'HMAC mismatch' }
      ]
    }
  ]
};

describe('formatting', () => {
  it('formats bytes in binary units', () => {
    assert.equal(formatBytes(0), '0 B');
    assert.equal(formatBytes(512), '512 B');
    assert.equal(formatBytes(1536), '1.50 KiB');
    assert.equal(formatBytes(12.3 * 1024 * 1024), '12.3 MiB');
    assert.equal(formatBytes(5 * 1024 ** 3), '5.00 GiB');
    assert.equal(formatBytes(null), '?');
    assert.equal(formatBytes(-1), '?');
  });

  it('formats durations', () => {
    assert.equal(formatDuration(0.42), '0.42 s');
    assert.equal(formatDuration(3.14), '3.1 s');
    assert.equal(formatDuration(42.4), '42 s');
    assert.equal(formatDuration(125), '2 min 05 s');
    assert.equal(formatDuration(3720), '1 h 02 min');
    assert.equal(formatDuration(undefined), '?');
  });

  it('formats step progress as bytes for checkpoints, counts otherwise', () => {
    const cp = stepProgress(
      { name: 'checkpoint', done: 1024 * 1024, total: 4 * 1024 * 1024 },
      'checkpointing'
    );
    assert.equal(cp.text, '1.00 MiB / 4.00 MiB');
    assert.equal(cp.fraction, 0.25);
    const kernels = stepProgress(
      { name: 'start_kernels', done: 1, total: 3 },
      'resuming'
    );
    assert.equal(kernels.text, '1 / 3');
    assert.deepEqual(stepProgress(null), { fraction: null, text: '' });
    assert.equal(
      stepProgress({ name: 'checkpoint', done: 5, total: 0 }).fraction,
      null
    );
    // done > total (a total that grew) is clamped
    assert.equal(stepProgress({ name: 'x', done: 9, total: 3 }).fraction, 1);
  });
});

describe('describeStatus', () => {
  it('shows every state with a label, and progress while checkpointing', () => {
    const states: IStatus['state'][] = [
      'running',
      'checkpointing',
      'snapshotting',
      'releasing',
      'paused',
      'resuming',
      'waiting_for_capacity',
      'verifying',
      'restoring',
      'ready',
      'failed'
    ];
    for (const state of states) {
      const view = describeStatus(status({ state }), null, trans);
      assert.equal(view.state, state);
      assert.ok(view.label.length > 0, state);
      assert.ok(view.tooltip.length > 0, state);
    }
    const cp = describeStatus(
      status({
        state: 'checkpointing',
        step: {
          name: 'checkpoint',
          done: 512 * 1024,
          total: 2 * 1024 * 1024,
          message: 'Checkpointing a.ipynb'
        }
      }),
      null,
      trans
    );
    assert.equal(cp.label, 'Checkpointing 512 KiB / 2.00 MiB');
    assert.equal(cp.progress, 0.25);
    assert.match(cp.tooltip, /Checkpointing a\.ipynb/);
    assert.equal(cp.severity, 'busy');
  });

  it('tells live from restored from fresh', () => {
    const live = describeStatus(
      status({ state: 'ready', outcome: 'live' }),
      null,
      trans
    );
    assert.equal(live.label, 'Ready (live)');
    const restored = describeStatus(
      status({ state: 'ready', outcome: 'restored', last_report: report }),
      null,
      trans
    );
    assert.equal(restored.label, 'Restored from checkpoint');
    assert.match(restored.tooltip, /4\.5 s/);
    const fresh = describeStatus(
      status({ state: 'ready', outcome: 'fresh' }),
      null,
      trans
    );
    assert.equal(fresh.label, 'Ready (fresh kernel)');
    assert.equal(fresh.severity, 'warn');
  });

  it('shows the reason and what to do for failures and waiting', () => {
    const failed = describeStatus(
      status({
        state: 'failed',
        reason: 'a.ipynb is busy (running a cell for 30 s)',
        hint: 'Wait for the cell to finish, or pause with interrupt.',
        flight: { id: 'f1', kind: 'pause' }
      }),
      null,
      trans
    );
    assert.equal(failed.label, 'Pause failed');
    assert.match(failed.tooltip, /a\.ipynb is busy/);
    assert.match(failed.tooltip, /What to do: Wait for the cell/);
    assert.equal(failed.severity, 'error');
    const resumeFailed = describeStatus(
      status({
        state: 'failed',
        reason: 'x',
        flight: { id: 'f2', kind: 'resume' }
      }),
      null,
      trans
    );
    assert.equal(resumeFailed.label, 'Resume failed');
    const waiting = describeStatus(
      status({
        state: 'waiting_for_capacity',
        reason: 'no nvidia-l4 node free in us-central1'
      }),
      null,
      trans
    );
    assert.match(waiting.tooltip, /no nvidia-l4 node free/);
  });

  it('says when the server cannot be read', () => {
    const view = describeStatus(
      null,
      'the jupyter_pause server extension is not running',
      trans
    );
    assert.equal(view.state, 'unavailable');
    assert.match(view.tooltip, /not running/);
    assert.equal(describeStatus(null, null, trans).state, 'unknown');
  });

  it('mentions the last checkpoint while running and paused', () => {
    const view = describeStatus(
      status({
        state: 'paused',
        last_checkpoint: {
          id: 'cp7',
          created: '2026-11-30T05:00:00Z',
          bytes_total: 3 * 1024 * 1024,
          kernels: 2
        }
      }),
      null,
      trans
    );
    assert.match(view.tooltip, /cp7/);
    assert.match(view.tooltip, /3\.00 MiB, 2 kernels/);
  });
});

describe('describeAction', () => {
  it('enables Pause when running and nothing is busy', () => {
    const a = describeAction(status({}), null, [], false, trans);
    assert.deepEqual([a.mode, a.enabled, a.label], ['pause', true, 'Pause']);
  });

  it('disables Pause while a cell runs, naming the notebook', () => {
    const a = describeAction(
      status({}),
      null,
      [{ path: 'train.ipynb' }],
      false,
      trans
    );
    assert.equal(a.enabled, false);
    assert.match(a.tooltip, /running in train\.ipynb/);
    const server = describeAction(
      status({
        kernels: [{ id: 'k', path: 'b.ipynb', execution_state: 'busy' }]
      }),
      null,
      [],
      false,
      trans
    );
    assert.equal(server.enabled, false);
    assert.match(server.tooltip, /b\.ipynb/);
    const two = describeAction(
      status({
        kernels: [{ id: 'k', path: 'b.ipynb', execution_state: 'busy' }]
      }),
      null,
      [{ path: 'a.ipynb' }],
      false,
      trans
    );
    assert.match(two.tooltip, /cells are running in a\.ipynb, b\.ipynb/);
  });

  it('disables Pause while a pause runs, and when the backend cannot pause', () => {
    for (const state of [
      'checkpointing',
      'snapshotting',
      'releasing'
    ] as const) {
      const a = describeAction(status({ state }), null, [], false, trans);
      assert.equal(a.enabled, false);
      assert.match(a.tooltip, /already running/);
    }
    const no = describeAction(
      status({
        backend: {
          name: 'gke',
          configured: true,
          can_pause: false,
          why_not: 'no VolumeSnapshotClass'
        }
      }),
      null,
      [],
      false,
      trans
    );
    assert.equal(no.enabled, false);
    assert.match(no.tooltip, /not possible here: no VolumeSnapshotClass/);
    const unconf = describeAction(
      status({ backend: { name: 'gke', configured: false, can_pause: false } }),
      null,
      [],
      false,
      trans
    );
    assert.match(unconf.tooltip, /"gke" is not configured/);
  });

  it('becomes Resume when paused, disabled while a resume runs', () => {
    const paused = describeAction(
      status({ state: 'paused' }),
      null,
      [],
      false,
      trans
    );
    assert.deepEqual(
      [paused.mode, paused.enabled, paused.label],
      ['resume', true, 'Resume']
    );
    for (const state of [
      'resuming',
      'waiting_for_capacity',
      'verifying',
      'restoring'
    ] as const) {
      const a = describeAction(status({ state }), null, [], false, trans);
      assert.deepEqual([a.mode, a.enabled], ['resume', false]);
    }
    // A request in flight: no double click.
    assert.equal(
      describeAction(status({ state: 'paused' }), null, [], true, trans)
        .enabled,
      false
    );
    assert.equal(
      describeAction(status({}), null, [], true, trans).enabled,
      false
    );
  });

  it('offers the right retry after a failure', () => {
    const pauseFailed = describeAction(
      status({
        state: 'failed',
        reason: 'disk full',
        flight: { id: 'f', kind: 'pause' }
      }),
      null,
      [],
      false,
      trans
    );
    assert.deepEqual([pauseFailed.mode, pauseFailed.enabled], ['pause', true]);
    const resumeFailed = describeAction(
      status({
        state: 'failed',
        reason: 'no capacity',
        flight: { id: 'f', kind: 'resume' }
      }),
      null,
      [],
      false,
      trans
    );
    assert.deepEqual(
      [resumeFailed.mode, resumeFailed.enabled],
      ['resume', true]
    );
    assert.match(resumeFailed.tooltip, /no capacity/);
  });

  it('offers the previous checkpoint after an interrupted pause', () => {
    const failed = status({
      state: 'failed',
      reason: 'the server stopped during checkpointing',
      hint: 'Resume to restore the previous checkpoint into fresh kernels, or pause again.',
      kernels: [],
      resume_available: true,
      resume_from: {
        offered: true,
        checkpoints: [{ path: 'a.ipynb', checkpoint_id: 'cp7', age_s: 7260 }]
      }
    });
    const a = describeAction(failed, null, [], false, trans);
    assert.deepEqual([a.mode, a.enabled, a.label], ['resume', true, 'Resume']);
    assert.match(a.tooltip, /a\.ipynb: a checkpoint 2 hours old/);
    // With its time, the checkpoint is named by the time of day: the same in every place.
    const at = new Date(2026, 11, 1, 10, 42, 5).toISOString();
    const withTime = status({
      ...failed,
      resume_from: {
        offered: true,
        checkpoints: [{ path: 'a.ipynb', created: at, age_s: 200 }]
      }
    });
    assert.match(
      describeAction(withTime, null, [], false, trans).tooltip,
      /a\.ipynb: the checkpoint of 10:42/
    );
    const view = describeStatus(failed, null, trans);
    assert.equal(view.state, 'failed');
    assert.match(
      view.tooltip,
      /Resume restores the previous checkpoint: a\.ipynb: a checkpoint 2 hours old/
    );
    // No way back left (no earlier checkpoint): pausing again is the action.
    const none = describeAction(
      status({
        state: 'failed',
        reason: 'kernel died',
        resume_available: false
      }),
      null,
      [],
      false,
      trans
    );
    assert.equal(none.mode, 'pause');
  });

  it('is disabled with the error when the server is unreachable', () => {
    const a = describeAction(null, 'network down', [], false, trans);
    assert.equal(a.enabled, false);
    assert.match(a.tooltip, /network down/);
  });
});

describe('report', () => {
  it('groups variables by what happened to them', () => {
    const g = groupVariables(report.kernels![0].variables);
    assert.deepEqual(
      g.restored.map(v => v.name),
      ['df', 'x']
    );
    assert.deepEqual(
      g.recomputable.map(v => v.name),
      ['gen']
    );
    assert.deepEqual(
      g.skipped.map(v => v.name),
      ['sock']
    );
    assert.deepEqual(
      g.failed.map(v => v.name),
      ['m']
    );
    assert.deepEqual(g.live, []);
    assert.deepEqual(groupVariables(undefined).restored, []);
  });

  it('writes a headline that says restored from checkpoint', () => {
    const text = reportHeadline(report, trans);
    assert.match(text, /restored from checkpoint \(2 variables\)/);
    assert.match(text, /in 4\.5 s/);
    assert.match(text, /3 variables did not come back/);
    const live = reportHeadline(
      {
        flight_id: 'f',
        outcome: 'live',
        kernels: [
          { outcome: 'live', variables: [{ name: 'x', status: 'live' }] }
        ]
      },
      trans
    );
    assert.match(live, /came back live \(1 variable kept\)/);
  });

  it('lists step durations and the total from request to usable', () => {
    const rows = durationRows(report, trans);
    assert.deepEqual(
      rows.map(r => r.label),
      ['Start kernels', 'Verify', 'Restore', 'Resume request → kernel usable']
    );
    assert.equal(rows[rows.length - 1].seconds, 4.5);
    // Without total_s the timestamps give it.
    const noTotal = durationRows({ ...report, durations: {} }, trans);
    assert.equal(noTotal.length, 1);
    assert.equal(noTotal[0].seconds, 4.5);
  });

  it('announces a report once, and never one from before the page loaded', () => {
    const ready = status({
      state: 'ready',
      outcome: 'restored',
      last_report: report
    });
    assert.equal(hasNewReport(null, ready), true);
    assert.equal(hasNewReport('f2', ready), false);
    assert.equal(
      hasNewReport('f1', status({ state: 'restoring', last_report: report })),
      false
    );
  });
});

describe('helpers', () => {
  it('knows when a flight runs', () => {
    assert.equal(isFlightActive(status({ state: 'checkpointing' })), true);
    assert.equal(isFlightActive(status({ state: 'restoring' })), true);
    assert.equal(isFlightActive(status({ state: 'paused' })), false);
    assert.equal(isFlightActive(null), false);
  });

  it('merges busy kernels from both sides without duplicates', () => {
    assert.deepEqual(
      busyPaths(
        status({
          kernels: [{ id: 'k', path: 'a.ipynb', execution_state: 'busy' }]
        }),
        [{ path: 'a.ipynb' }, { path: 'c.ipynb' }]
      ),
      ['a.ipynb', 'c.ipynb']
    );
  });
});
