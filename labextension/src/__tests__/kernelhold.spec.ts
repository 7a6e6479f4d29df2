import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { holdModeOf, IHoldableContext, KernelHold } from '../kernelhold';
import { IStatus } from '../api';

/** A notebook's session context as the hold sees it: counts the kernels it really starts. */
class Context implements IHoldableContext {
  constructor(public isReady = true) {}
  hasNoKernel = true;
  isDisposed = false;
  started = 0;
  async startKernel(): Promise<boolean> {
    this.started += 1;
    this.hasNoKernel = false;
    return false;
  }
}

function setup() {
  const calls = { paused: 0, waiting: 0 };
  const hold = new KernelHold({
    onRunWhilePaused: () => (calls.paused += 1),
    onRunWaiting: () => (calls.waiting += 1)
  });
  return { hold, calls };
}

/** Whether a promise is still pending after the microtasks queued so far have run. */
async function pending(p: Promise<unknown>): Promise<boolean> {
  const marker = Symbol('pending');
  const first = await Promise.race([
    p,
    new Promise(r => setImmediate(() => r(marker)))
  ]);
  return first === marker;
}

describe('KernelHold', () => {
  it('lets kernels start when the workspace is free', async () => {
    const { hold } = setup();
    const ctx = new Context();
    hold.attach(ctx);
    assert.equal(await ctx.startKernel(), false);
    assert.equal(ctx.started, 1);
  });

  it('refuses a cell run while paused and tells the person to resume', async () => {
    const { hold, calls } = setup();
    const ctx = new Context();
    hold.attach(ctx);
    hold.set('paused');
    assert.equal(await ctx.startKernel(), false);
    assert.equal(ctx.started, 0);
    assert.equal(calls.paused, 1);
  });

  it('starts nothing for a notebook opened while paused, and says nothing', async () => {
    const { hold, calls } = setup();
    const ctx = new Context(false); // initializing: not ready yet
    hold.attach(ctx);
    hold.set('paused');
    assert.equal(await ctx.startKernel(), false);
    assert.equal(ctx.started, 0);
    assert.deepEqual(calls, { paused: 0, waiting: 0 });
  });

  it('holds a cell run during a resume and lets it run on the reconnected kernel', async () => {
    const { hold, calls } = setup();
    const ctx = new Context();
    hold.attach(ctx);
    hold.set('busy');
    const run = ctx.startKernel();
    assert.equal(await pending(run), true, 'the run waits while busy');
    assert.equal(calls.waiting, 1);
    ctx.hasNoKernel = false; // the resume's reconnect adopted the restored kernel's session
    hold.set('free');
    assert.equal(await run, false);
    assert.equal(
      ctx.started,
      0,
      'no kernel of its own: the cell runs on the restored one'
    );
  });

  it('starts a kernel after the resume for a notebook that has none', async () => {
    const { hold } = setup();
    const ctx = new Context();
    hold.attach(ctx);
    hold.set('busy');
    const run = ctx.startKernel();
    hold.set('free');
    assert.equal(await run, false);
    assert.equal(ctx.started, 1);
  });

  it('turns a waiting run into a refusal when the pause ends in paused', async () => {
    const { hold, calls } = setup();
    const ctx = new Context();
    hold.attach(ctx);
    hold.set('busy');
    const run = ctx.startKernel();
    hold.set('paused');
    assert.equal(await run, false);
    assert.equal(ctx.started, 0);
    assert.deepEqual(calls, { paused: 1, waiting: 1 });
  });

  it('wraps a context once', async () => {
    const { hold } = setup();
    const ctx = new Context();
    hold.attach(ctx);
    hold.attach(ctx);
    hold.set('paused');
    await ctx.startKernel();
    hold.set('free');
    await ctx.startKernel();
    assert.equal(ctx.started, 1);
  });
});

const status = (state: string) => ({ state }) as unknown as IStatus;

describe('KernelHold resume requests', () => {
  it('keeps holding through a stale "paused" read after the Resume click', async () => {
    const { hold, calls } = setup();
    const ctx = new Context();
    hold.attach(ctx);
    hold.set(hold.modeFor(status('paused')));
    hold.expectResume();
    hold.set(hold.modeFor(status('paused'))); // a read sent before the click
    const run = ctx.startKernel();
    assert.equal(await pending(run), true, 'waits instead of being refused');
    hold.set(hold.modeFor(status('restoring')));
    ctx.hasNoKernel = false;
    hold.set(hold.modeFor(status('ready')));
    assert.equal(await run, false);
    assert.deepEqual(calls, { paused: 0, waiting: 1 });
    // Once the server moved on, "paused" means paused again.
    assert.equal(hold.modeFor(status('paused')), 'paused');
  });

  it('follows the server again when the request fails', async () => {
    const { hold, calls } = setup();
    const ctx = new Context();
    hold.attach(ctx);
    hold.expectResume();
    const run = ctx.startKernel();
    hold.cancelResume(status('paused'));
    assert.equal(await run, false);
    assert.deepEqual(calls, { paused: 1, waiting: 1 });
  });
});

describe('KernelHold.followRequest', () => {
  it('holds from the Pause click on', async () => {
    const { hold, calls } = setup();
    const ctx = new Context();
    hold.attach(ctx);
    hold.followRequest('pause', 'sent', status('running'));
    const run = ctx.startKernel();
    assert.equal(
      await pending(run),
      true,
      'a cell run right after the click waits'
    );
    hold.followRequest('pause', 'accepted', status('checkpointing'));
    assert.equal(hold.mode, 'busy');
    hold.set(hold.modeFor(status('paused')));
    assert.equal(await run, false);
    assert.deepEqual(calls, { paused: 1, waiting: 1 });
  });

  it('holds from the Resume click on, and lets go when the request is refused', async () => {
    const { hold } = setup();
    hold.set(hold.modeFor(status('paused')));
    hold.followRequest('resume', 'sent', status('paused'));
    assert.equal(hold.mode, 'busy');
    assert.equal(
      hold.modeFor(status('paused')),
      'busy',
      'a stale "paused" read keeps holding'
    );
    hold.followRequest('resume', 'failed', status('paused'));
    assert.equal(hold.mode, 'paused');
    assert.equal(hold.modeFor(status('paused')), 'paused');
  });

  it('reads "no kernel" while held, so a stopped kernel\'s stale connection is not used', async () => {
    // As JupyterLab's SessionContext: `hasNoKernel` is a getter on the prototype, and right
    // after a pause the notebook may still hold the stopped kernel's session (false here).
    class SessionLike {
      stale = true;
      isReady = true;
      isDisposed = false;
      started = 0;
      get hasNoKernel(): boolean {
        return !this.stale;
      }
      async startKernel(): Promise<boolean> {
        this.started += 1;
        return false;
      }
    }
    const { hold, calls } = setup();
    const ctx = new SessionLike();
    hold.attach(ctx);
    assert.equal(ctx.hasNoKernel, false, 'free: as JupyterLab says');
    hold.set('paused');
    assert.equal(
      ctx.hasNoKernel,
      true,
      'paused: the executor must go through startKernel()'
    );
    hold.followRequest('resume', 'sent', status('paused'));
    assert.equal(ctx.hasNoKernel, true);
    const run = ctx.startKernel(); // what the cell executor does when hasNoKernel is true
    assert.equal(await pending(run), true, 'the run waits for the resume');
    hold.set(hold.modeFor(status('ready'))); // reconnected to the restored kernel
    assert.equal(await run, false);
    assert.equal(
      ctx.hasNoKernel,
      false,
      'the executor then runs the cell on that kernel'
    );
    assert.equal(ctx.started, 0);
    assert.deepEqual(calls, { paused: 0, waiting: 1 });
  });
});

describe('holdModeOf', () => {
  it('maps states to holds', () => {
    assert.equal(holdModeOf(null), 'free');
    assert.equal(holdModeOf(status('running')), 'free');
    assert.equal(holdModeOf(status('ready')), 'free');
    assert.equal(holdModeOf(status('failed')), 'free');
    assert.equal(holdModeOf(status('paused')), 'paused');
    const flights = ['checkpointing', 'snapshotting', 'releasing', 'resuming'];
    for (const s of [
      ...flights,
      'waiting_for_capacity',
      'verifying',
      'restoring'
    ]) {
      assert.equal(holdModeOf(status(s)), 'busy', s);
    }
  });
});
