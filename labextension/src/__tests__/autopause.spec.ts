import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { IPolicy } from '../api';
import { describeAutoPause } from '../autopause';
import { formatClock, formatIdleTime, formatTime } from '../format';
import { trans } from './trans';

function policy(partial: Partial<IPolicy>): IPolicy {
  return {
    enabled: true,
    state: 'announced',
    profile: {
      name: 'gpu-experiment',
      action: 'pause',
      idle_after: 3600,
      grace_period: 300
    },
    deadline: '2026-11-30T07:05:00.000Z',
    seconds_left: 299.4,
    cancellable: true,
    last_decision: { kind: 'announce', reason: 'idle for 60 min' },
    ...partial
  };
}

describe('formatIdleTime', () => {
  it('rounds to what a sentence needs', () => {
    assert.equal(formatIdleTime(2), '2 s');
    assert.equal(formatIdleTime(60), '1 min');
    assert.equal(formatIdleTime(1199), '20 min');
    assert.equal(formatIdleTime(3600), '1 h');
    assert.equal(formatIdleTime(5400), '1 h 30 min');
    assert.equal(formatIdleTime(2 * 86400), '2 days');
    assert.equal(formatIdleTime(undefined), '?');
  });
});

describe('describeAutoPause', () => {
  // A fixed read time: 2026-11-30T07:00:00Z on the browser's clock.
  const READ = Date.parse('2026-11-30T07:00:00.000Z');
  const iso = (ms: number) => new Date(ms).toISOString();

  it('names the clock time of the pause, the idle time and the profile', () => {
    const view = describeAutoPause(policy({ seconds_left: 299 }), READ, trans);
    assert.ok(view);
    assert.equal(view.at, READ + 299_000);
    assert.equal(
      view.message,
      `This workspace will pause at ${formatClock(iso(READ + 299_000))} because it has been idle for 1 h (profile gpu-experiment).`
    );
    assert.equal(view.key, '2026-11-30T07:05:00.000Z');
  });
  it('times the pause on the local clock from seconds_left, never before the read', () => {
    const later = describeAutoPause(
      policy({ seconds_left: 299 }),
      READ + 60_000,
      trans
    );
    assert.equal(later!.at, READ + 359_000); // the browser's clock, not the server's deadline
    assert.equal(
      describeAutoPause(policy({ seconds_left: -3 }), READ, trans)!.at,
      READ
    );
  });
  it('gives seconds only when the pause is under two minutes away', () => {
    const soon = describeAutoPause(policy({ seconds_left: 8 }), READ, trans);
    assert.match(
      soon!.message,
      new RegExp(`pause at ${formatTime(iso(READ + 8000))} `)
    );
    assert.match(soon!.message, /pause at \d\d:\d\d:\d\d /);
    const far = describeAutoPause(policy({ seconds_left: 120 }), READ, trans);
    assert.match(far!.message, /pause at \d\d:\d\d because/);
  });
  it('keeps one key per announcement without a deadline, whatever the read time', () => {
    const a = describeAutoPause(
      policy({ deadline: null, seconds_left: 300 }),
      READ,
      trans
    );
    const b = describeAutoPause(
      policy({ deadline: null, seconds_left: 299 }),
      READ + 1000,
      trans
    );
    assert.equal(a!.key, b!.key);
  });
  it('says "stop its kernels" for a stop profile', () => {
    const p = policy({
      profile: { name: 'cpu-small', action: 'stop', idle_after: 1800 }
    });
    assert.match(
      describeAutoPause(p, READ, trans)!.message,
      /will stop its kernels at \d\d:\d\d .* idle for 30 min \(profile cpu-small\)/
    );
  });
  it('shows nothing unless an auto-pause is announced and cancellable', () => {
    assert.equal(describeAutoPause(null, 0, trans), null);
    assert.equal(
      describeAutoPause(policy({ state: 'watching' }), 0, trans),
      null
    );
    assert.equal(
      describeAutoPause(policy({ state: 'inactive' }), 0, trans),
      null
    );
    assert.equal(
      describeAutoPause(policy({ cancellable: false }), 0, trans),
      null
    );
    assert.equal(describeAutoPause(policy({ enabled: false }), 0, trans), null);
  });
});
