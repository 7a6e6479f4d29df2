import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { IPolicy } from '../api';
import { describeAutoPause } from '../autopause';
import { formatCountdown, formatIdleTime } from '../format';
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

describe('formatCountdown', () => {
  it('shows minutes and zero-padded seconds, rounding up', () => {
    assert.equal(formatCountdown(299.4), '5:00');
    assert.equal(formatCountdown(299), '4:59');
    assert.equal(formatCountdown(7), '0:07');
    assert.equal(formatCountdown(0.2), '0:01');
    assert.equal(formatCountdown(0), '0:00');
    assert.equal(formatCountdown(-3), '0:00');
  });
  it('shows hours when there are any', () => {
    assert.equal(formatCountdown(3723), '1:02:03');
  });
  it('is "?" without a number', () => {
    assert.equal(formatCountdown(null), '?');
    assert.equal(formatCountdown(NaN), '?');
  });
});

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
  it('announces the pause with a countdown, the idle time and the profile', () => {
    const view = describeAutoPause(policy({ seconds_left: 299 }), 0, trans);
    assert.ok(view);
    assert.equal(
      view.message,
      'This workspace will pause in 4:59 because it has been idle for 1 h (profile gpu-experiment).'
    );
    assert.equal(view.key, '2026-11-30T07:05:00.000Z');
  });
  it('counts down on the local clock from seconds_left, never below zero', () => {
    const p = policy({ seconds_left: 299 });
    assert.match(describeAutoPause(p, 60, trans)!.message, /pause in 3:59 /);
    assert.equal(describeAutoPause(p, 60, trans)!.secondsLeft, 239);
    assert.match(describeAutoPause(p, 1000, trans)!.message, /pause in 0:00 /);
  });
  it('says "stop its kernels" for a stop profile', () => {
    const p = policy({
      profile: { name: 'cpu-small', action: 'stop', idle_after: 1800 }
    });
    assert.match(
      describeAutoPause(p, 0, trans)!.message,
      /will stop its kernels in 5:00 .* idle for 30 min \(profile cpu-small\)/
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
