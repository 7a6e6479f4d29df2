import assert from 'node:assert/strict';
import { afterEach, describe, it } from 'node:test';

import type { Event } from '@jupyterlab/services';
import { Signal } from '@lumino/signaling';

import type {
  IFlight,
  IPauseAPI,
  IPolicy,
  IReportVariable,
  IStatus
} from '../api';
import {
  IFlightRequest,
  LIFECYCLE_SCHEMA,
  PauseController
} from '../controller';
import { IPauseState } from '../tokens';
import { trans } from './trans';

/** A promise the test settles when it wants: answers arrive in the order the test chooses. */
class Deferred<T> {
  promise = new Promise<T>((resolve, reject) => {
    this.resolve = resolve;
    this.reject = reject;
  });
  resolve!: (value: T) => void;
  reject!: (reason: unknown) => void;
}

/** Each call waits in its queue until the test answers it. */
class FakeAPI implements IPauseAPI {
  statusCalls: Deferred<IStatus>[] = [];
  policyCalls: Deferred<IPolicy>[] = [];
  cancelCalls: Deferred<IPolicy>[] = [];
  startCalls: {
    kind: string;
    loseState?: string[];
    answer: Deferred<IFlight>;
  }[] = [];
  recomputeCalls: {
    path: string;
    names: string[];
    answer: Deferred<IReportVariable[]>;
  }[] = [];

  status(): Promise<IStatus> {
    return this._push(this.statusCalls);
  }
  policy(): Promise<IPolicy> {
    return this._push(this.policyCalls);
  }
  cancelAutoPause(): Promise<IPolicy> {
    return this._push(this.cancelCalls);
  }
  start(kind: 'pause' | 'resume', loseState?: string[]): Promise<IFlight> {
    const answer = new Deferred<IFlight>();
    this.startCalls.push({ kind, loseState, answer });
    return answer.promise;
  }
  recompute(path: string, names: string[]): Promise<IReportVariable[]> {
    const answer = new Deferred<IReportVariable[]>();
    this.recomputeCalls.push({ path, names, answer });
    return answer.promise;
  }
  private _push<T>(queue: Deferred<T>[]): Promise<T> {
    const d = new Deferred<T>();
    queue.push(d);
    return d.promise;
  }
}

const status = (
  state: IStatus['state'],
  extra: Partial<IStatus> = {}
): IStatus => ({
  state,
  ...extra
});

const policy = (state: string): IPolicy => ({
  enabled: true,
  state,
  cancellable: true
});

/** Let every settled promise's callbacks run. */
const settle = () => new Promise(resolve => setImmediate(resolve));

const controllers: PauseController[] = [];

function setup() {
  const api = new FakeAPI();
  const events = { stream: new Signal<unknown, Event.Emission>({}) };
  const controller = new PauseController({
    api,
    events: events as unknown as Event.IManager,
    trans
  });
  controllers.push(controller);
  const states: IPauseState[] = [];
  controller.stateChanged.connect((_, s) => void states.push(s));
  const emit = (data: object) =>
    events.stream.emit({
      schema_id: LIFECYCLE_SCHEMA,
      ...data
    } as Event.Emission);
  return { api, controller, states, emit };
}

afterEach(() => {
  // Stops the poll and the throttlers, so no timer outlives the test.
  controllers.splice(0).forEach(c => c.dispose());
});

describe('PauseController status reads', () => {
  it('keeps the newest answer when answers arrive out of order', async () => {
    const { api, controller } = setup();
    const first = controller.refresh();
    const second = controller.refresh();
    api.statusCalls[1].resolve(status('paused'));
    await second;
    api.statusCalls[0].resolve(status('running')); // sent first, answered last: stale
    await first;
    assert.equal(controller.status?.state, 'paused');
  });

  it('drops a failure older than an answer already applied', async () => {
    const { api, controller } = setup();
    const first = controller.refresh();
    const second = controller.refresh();
    api.statusCalls[1].resolve(status('running'));
    await second;
    api.statusCalls[0].reject(new Error('network down'));
    await first;
    assert.equal(controller.error, null);
    assert.equal(controller.status?.state, 'running');
  });

  it('keeps the last status but reports the error of a newer failed read', async () => {
    const { api, controller, states } = setup();
    const ok = controller.refresh();
    api.statusCalls[0].resolve(status('running'));
    await ok;
    const bad = controller.refresh();
    api.statusCalls[1].reject(new Error('the server is away'));
    await bad;
    assert.equal(controller.error, 'the server is away');
    assert.equal(controller.status?.state, 'running');
    assert.equal(controller.statusView.state, 'unavailable');
    assert.deepEqual(
      states.map(s => [s.previous, s.state]),
      [
        [null, 'running'],
        ['running', null]
      ]
    );
  });

  it('drops an event that arrives after a read which already includes it', async () => {
    const { api, controller, emit } = setup();
    const read = controller.refresh();
    api.statusCalls[0].resolve(status('ready', { seq: 12 }));
    await read;
    // emitted before the read was answered (seq 11), delivered after it
    emit({ event: 'progress', state: 'restoring', seq: 11 });
    assert.equal(controller.status?.state, 'ready');
    emit({ event: 'pause_requested', state: 'checkpointing', seq: 13 });
    assert.equal(controller.status?.state, 'checkpointing');
    assert.equal(controller.status?.seq, 13);
  });

  it('reports transitions between reads, not between event patches', async () => {
    const { api, controller, emit } = setup();
    const reads: [string | undefined, string | undefined][] = [];
    controller.statusRead.connect(
      (_, c) => void reads.push([c.previous?.state, c.current?.state])
    );
    const one = controller.refresh();
    api.statusCalls[0].resolve(status('running'));
    await one;
    emit({ event: 'pause_started', state: 'checkpointing' });
    assert.equal(
      controller.status?.state,
      'checkpointing',
      'an event shows at once'
    );
    const two = controller.refresh();
    api.statusCalls[1].resolve(status('paused'));
    await two;
    assert.deepEqual(reads, [
      [undefined, 'running'],
      ['running', 'paused']
    ]);
  });
});

describe('PauseController stateChanged', () => {
  it('fires once per state, from events and reads alike', async () => {
    const { api, controller, states, emit } = setup();
    const one = controller.refresh();
    api.statusCalls[0].resolve(status('running'));
    await one;
    emit({ event: 'pause_started', state: 'checkpointing' });
    emit({
      event: 'progress',
      state: 'checkpointing',
      step: { name: 'checkpoint', done: 1 }
    });
    emit({ event: 'paused', state: 'paused' });
    const two = controller.refresh();
    api.statusCalls[1].resolve(status('paused'));
    await two;
    assert.deepEqual(
      states.map(s => [s.previous, s.state]),
      [
        [null, 'running'],
        ['running', 'checkpointing'],
        ['checkpointing', 'paused']
      ]
    );
    assert.equal(states[2].status?.state, 'paused');
  });

  it('ignores events of other schemas, and events before the first read', () => {
    const { controller, states, emit } = setup();
    emit({ event: 'paused', state: 'paused' }); // nothing read yet: nothing to patch
    assert.equal(controller.status, null);
    assert.deepEqual(states, []);
  });
});

describe('PauseController pause and resume', () => {
  it('says "sent" at once, then "accepted" once the status after it is read', async () => {
    const { api, controller } = setup();
    const log: string[] = [];
    controller.requested.connect(
      (_, r: IFlightRequest) => void log.push(`${r.kind}:${r.phase}`)
    );
    controller.statusRead.connect(
      (_, c) => void log.push(`read:${c.current?.state}`)
    );
    const flight = controller.pause();
    assert.deepEqual(log, ['pause:sent'], 'before any answer');
    assert.equal(controller.pending, true);
    assert.equal(controller.actionView.enabled, false, 'no double click');
    assert.equal(api.startCalls[0].kind, 'pause');
    api.startCalls[0].answer.resolve({ id: 'f1', kind: 'pause' });
    await settle();
    assert.equal(controller.pending, false);
    api.statusCalls[0].resolve(status('checkpointing'));
    assert.deepEqual(await flight, { id: 'f1', kind: 'pause' });
    assert.deepEqual(log, [
      'pause:sent',
      'read:checkpointing',
      'pause:accepted'
    ]);
  });

  it('sends the kernels the person agreed to lose, and only when there are some', async () => {
    const { api, controller } = setup();
    void controller.pause().catch(() => undefined);
    void controller.pause(['k-echo']).catch(() => undefined);
    assert.deepEqual(
      api.startCalls.map(c => [c.kind, c.loseState]),
      [
        ['pause', undefined],
        ['pause', ['k-echo']]
      ]
    );
  });

  it('re-reads the status after a refused request, then says "failed" and rejects', async () => {
    const { api, controller } = setup();
    const log: string[] = [];
    controller.requested.connect(
      (_, r) => void log.push(`${r.kind}:${r.phase}`)
    );
    controller.statusRead.connect(
      (_, c) => void log.push(`read:${c.current?.state}`)
    );
    const flight = controller.resume();
    api.startCalls[0].answer.reject(new Error('nothing to resume'));
    await settle();
    api.statusCalls[0].resolve(status('running'));
    await assert.rejects(flight, /nothing to resume/);
    assert.deepEqual(log, ['resume:sent', 'read:running', 'resume:failed']);
    assert.equal(controller.pending, false);
  });
});

describe('PauseController policy reads', () => {
  it('keeps only the newest read', async () => {
    const { api, controller } = setup();
    const first = controller.refreshPolicy();
    const second = controller.refreshPolicy();
    api.policyCalls[1].resolve(policy('watching'));
    api.policyCalls[0].resolve(policy('announced'));
    await Promise.all([first, second]);
    assert.equal(controller.policy?.state, 'watching');
  });

  it('does not bring back a countdown a cancel ended', async () => {
    const { api, controller } = setup();
    const read = controller.refreshPolicy(); // sent before the cancel
    const cancel = controller.cancelAutoPause();
    api.cancelCalls[0].resolve(policy('watching'));
    await settle();
    api.policyCalls[0].resolve(policy('announced'));
    await read;
    assert.equal(controller.policy?.state, 'watching');
    api.policyCalls[1].resolve(policy('watching')); // the read after the cancel
    await cancel;
    assert.equal(controller.policy?.state, 'watching');
  });
});

describe('PauseController recompute and dispose', () => {
  it('resolves recompute after the report is re-read', async () => {
    const { api, controller } = setup();
    const done = controller.recompute('a.ipynb', ['gen']);
    assert.deepEqual(api.recomputeCalls[0].names, ['gen']);
    api.recomputeCalls[0].answer.resolve([
      { name: 'gen', status: 'recomputed' }
    ]);
    await settle();
    api.statusCalls[0].resolve(status('ready'));
    assert.deepEqual(await done, [{ name: 'gen', status: 'recomputed' }]);
    assert.equal(controller.status?.state, 'ready');
  });

  it('ignores answers that arrive after dispose', async () => {
    const { api, controller, states } = setup();
    const read = controller.refresh();
    controller.dispose();
    api.statusCalls[0].resolve(status('paused'));
    await read;
    assert.equal(controller.status, null);
    assert.deepEqual(states, []);
    assert.equal(controller.isDisposed, true);
  });
});

describe('PauseController re-reads after events', () => {
  /** Wait until `cond()` holds (a re-read starts 250 ms after an event), or fail. */
  async function until(cond: () => boolean, what: string): Promise<void> {
    const deadline = Date.now() + 3000;
    while (!cond()) {
      if (Date.now() > deadline) {
        assert.fail(`not within 3 s: ${what}`);
      }
      await new Promise(resolve => setTimeout(resolve, 10));
    }
  }

  /** Answer the poll's first status read (and any other made so far). */
  async function answered(api: FakeAPI, seq: number): Promise<number> {
    await until(() => api.statusCalls.length > 0, "the poll's first read");
    api.statusCalls.forEach(c => c.resolve(status('running', { seq })));
    await settle();
    return api.statusCalls.length;
  }

  it('reads the policy again for an event that came while a read was in flight', async () => {
    const { api, controller, emit } = setup();
    emit({ event: 'auto_pause_announced' });
    await until(() => api.policyCalls.length === 1, 'the read after the event');
    // The server answered this read before it cancelled; the cancel's event comes first.
    emit({ event: 'auto_pause_cancelled' });
    api.policyCalls[0].resolve(policy('announced'));
    await settle();
    assert.equal(controller.policy?.state, 'announced');
    await until(() => api.policyCalls.length === 2, 'a read after the cancel');
    api.policyCalls[1].resolve(policy('watching'));
    await settle();
    assert.equal(controller.policy?.state, 'watching');
  });

  it('reads the status again for an event that came while a read was in flight', async () => {
    const { api, controller, emit } = setup();
    const n = await answered(api, 1);
    emit({ event: 'kernel_died' });
    await until(
      () => api.statusCalls.length === n + 1,
      'the read after the event'
    );
    emit({ event: 'offer_dismissed' });
    api.statusCalls[n].resolve(status('running', { seq: 2 }));
    await until(
      () => api.statusCalls.length === n + 2,
      'a read after the second event'
    );
    api.statusCalls[n + 1].resolve(status('running', { seq: 3 }));
    await settle();
    assert.equal(controller.status?.seq, 3);
  });

  it('makes one read for a burst of events', async () => {
    const { api, emit } = setup();
    const n = await answered(api, 1);
    for (let i = 0; i < 5; i++) {
      emit({ event: 'auto_pause_announced' });
    }
    await until(
      () => api.statusCalls.length === n + 1,
      'the read after the burst'
    );
    api.statusCalls[n].resolve(status('running', { seq: 2 }));
    await new Promise(resolve => setTimeout(resolve, 400));
    assert.equal(api.statusCalls.length, n + 1);
  });
});
