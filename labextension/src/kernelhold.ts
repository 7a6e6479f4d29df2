/**
 * Keeps notebooks from starting kernels of their own while the workspace is paused or a pause
 * or resume is under way.
 *
 * Why: a notebook without a kernel starts one when a cell runs (the cell executor calls
 * `SessionContext.startKernel()`) or when it is opened. While paused, such a kernel would hold
 * the accelerator the pause gave back. During a resume it races the restored kernel:
 * `SessionContext._changeKernel()` without a session POSTs a session under a temporary path,
 * and when it completes it shuts down whatever session the notebook adopted meanwhile, which
 * is the restored kernel's.
 *
 * How: `attach()` wraps each notebook's `startKernel()`. While held, a cell run during a
 * pause or resume waits until the workspace is free and the notebooks are reconnected, then
 * lets the cell executor go on (onto the restored kernel). While paused, it does not run, and
 * the person is told to resume. No JupyterLab imports, so it is unit-tested in Node.
 *
 * While held, `hasNoKernel` also reads true. Why: JupyterLab drops a stopped kernel's session
 * only at its next session poll (every 10 s), so right after a pause the notebook may still hold
 * the stopped kernel's connection. The cell executor would then skip `startKernel()` and execute
 * on that connection, and the poll that follows disposes it, which cancels the execution
 * silently: a cell run right after Resume would not run at all.
 */

import type { IStatus } from './api';
import { isFlightActive } from './status';

/** The part of `ISessionContext` the hold uses. */
export interface IHoldableContext {
  startKernel(): Promise<boolean>;
  /** Kernel > Change Kernel, the toolbar's kernel selector, and a restart without a kernel. */
  changeKernel?(options?: unknown): Promise<unknown>;
  /** Kernel > Restart Kernel on a running kernel. */
  restartKernel?(): Promise<void>;
  readonly hasNoKernel: boolean;
  readonly isReady: boolean;
  readonly isDisposed: boolean;
}

/** `free`: kernels may start. `busy`: a pause or resume is running. `paused`: kernels are stopped. */
export type HoldMode = 'free' | 'busy' | 'paused';

export interface IKernelHoldOptions {
  /** A cell was run while paused: it did not run; tell the person to resume. */
  onRunWhilePaused: () => void;
  /** A cell was run during a pause or resume: it waits; tell the person it will run after. */
  onRunWaiting: () => void;
  /** A kernel change or restart was refused (held): say why. */
  onStartRefused?: (mode: HoldMode) => void;
  /** The mode changed (e.g. to `free` once a resume is done: its notices are stale). */
  onModeChanged?: (mode: HoldMode) => void;
}

/** The hold a workspace status calls for. */
export function holdModeOf(status: IStatus | null): HoldMode {
  if (!status) {
    return 'free';
  }
  if (status.state === 'paused') {
    return 'paused';
  }
  return isFlightActive(status) ? 'busy' : 'free';
}

const WRAPPED = Symbol('jupyter-pause:kernel-hold');

export class KernelHold {
  constructor(options: IKernelHoldOptions) {
    this._options = options;
  }

  get mode(): HoldMode {
    return this._mode;
  }

  /**
   * Set the mode. Leaving `busy` wakes the cell runs that wait; callers set `free` only once
   * the notebooks are reconnected to the server's kernels, so a woken run finds its kernel.
   */
  set(mode: HoldMode): void {
    if (mode === this._mode) {
      return;
    }
    this._mode = mode;
    this._options.onModeChanged?.(mode);
    if (mode !== 'busy') {
      const wake = this._waiters;
      this._waiters = [];
      wake.forEach(resolve => resolve());
    }
  }

  /**
   * A resume was requested (the click): hold from now on. Until the server answers with a
   * state other than paused, `modeFor()` keeps holding: a status read sent before the click
   * may still answer "paused", and a cell run then must wait, not be refused.
   */
  expectResume(): void {
    this._resumeRequested = true;
    this.set('busy');
  }

  /** The resume request failed: follow the server's state again. */
  cancelResume(status: IStatus | null): void {
    this._resumeRequested = false;
    this.set(holdModeOf(status));
  }

  /**
   * Follow a `POST pause` / `POST resume` this page sent: hold from the click on (the server's
   * answer may come after a cell run); a refused resume follows the server's state again.
   */
  followRequest(
    kind: 'pause' | 'resume',
    phase: 'sent' | 'accepted' | 'failed',
    status: IStatus | null
  ): void {
    if (phase === 'sent') {
      if (kind === 'pause') {
        this.set('busy');
      } else {
        this.expectResume();
      }
    } else if (phase === 'failed' && kind === 'resume') {
      this.cancelResume(status);
    }
  }

  /** The hold a status read calls for, given a resume this page requested. */
  modeFor(status: IStatus): HoldMode {
    if (status.state !== 'paused') {
      this._resumeRequested = false;
    }
    return this._resumeRequested ? 'busy' : holdModeOf(status);
  }

  /** The server refused a kernel start this page did not hold (it had not seen the pause). */
  refusedByServer(): void {
    this._options.onStartRefused?.('paused');
  }

  /**
   * True (and the person is told why) when a kernel must not start now. For the paths that
   * start a kernel at once rather than on a cell run: a kernel change or restart, a console.
   */
  refuse(): boolean {
    if (this._mode === 'free') {
      return false;
    }
    this._options.onStartRefused?.(this._mode);
    return true;
  }

  /**
   * Wrap the context's `startKernel()`, `changeKernel()` and `restartKernel()` (once per
   * context). A change or restart while held does nothing: it would start a kernel (JupyterLab
   * restarts a notebook without a kernel by `changeKernel({name: prevKernelName})`).
   */
  attach(context: IHoldableContext): void {
    const marked = context as IHoldableContext & { [WRAPPED]?: boolean };
    if (marked[WRAPPED]) {
      return;
    }
    marked[WRAPPED] = true;
    const original = context.startKernel.bind(context);
    context.startKernel = () => this._startKernel(context, original);
    if (typeof context.changeKernel === 'function') {
      const change = context.changeKernel.bind(context);
      // `{id}` joins a kernel that exists (how the notebooks follow the resumed kernels):
      // that starts nothing, so it is never held.
      // One the server refused because the workspace is paused was told in one line already
      // (softenPausedRefusal): it must not end as an unhandled error as well.
      context.changeKernel = (options?: unknown) =>
        !joinsExisting(options) && this.refuse()
          ? Promise.resolve(null)
          : change(options).catch(error => {
              if (isPausedRefusal((error as Error)?.message)) {
                return null;
              }
              throw error;
            });
    }
    if (typeof context.restartKernel === 'function') {
      const restart = context.restartKernel.bind(context);
      context.restartKernel = () =>
        this.refuse() ? Promise.resolve() : restart();
    }
    shadowHasNoKernel(context, () => this._mode !== 'free');
  }

  private async _startKernel(
    context: IHoldableContext,
    original: () => Promise<boolean>
  ): Promise<boolean> {
    // While the context initializes (a notebook opened now), say nothing: it shows "No Kernel"
    // and starts one on its first cell run once the workspace is free.
    const quiet = !context.isReady;
    if (this._mode === 'busy') {
      if (!quiet) {
        this._options.onRunWaiting();
      }
      await new Promise<void>(resolve => this._waiters.push(resolve));
    }
    if (context.isDisposed) {
      return false;
    }
    if (this._mode === 'paused') {
      if (!quiet) {
        this._options.onRunWhilePaused();
      }
      return false; // false: no kernel dialog; the cell executor then leaves the cell unrun
    }
    if (!context.hasNoKernel) {
      return false; // reconnected to the restored kernel while waiting: the cell runs there
    }
    return original();
  }

  private _mode: HoldMode = 'free';
  private _resumeRequested = false;
  private _options: IKernelHoldOptions;
  private _waiters: Array<() => void> = [];
}

/** The server's refusal of a kernel start (server/kernelguard.py answers 409 with it). */
const PAUSED_REFUSAL =
  /workspace is (paused|pausing|resuming)|resume it first/i;

/** Whether an error message is the server's "the workspace is paused" refusal. */
export function isPausedRefusal(message: unknown): boolean {
  return PAUSED_REFUSAL.test(String(message ?? ''));
}

/** Whether kernel-change options name a running kernel (`{id}`) rather than a kernel to start. */
function joinsExisting(options: unknown): boolean {
  return (
    !!options &&
    typeof options === 'object' &&
    !!(options as { id?: unknown }).id
  );
}

/**
 * Make `context.hasNoKernel` read true while `held()`, and as before otherwise. JupyterLab
 * defines it as a getter on `SessionContext.prototype`; an own property shadows it.
 */
function shadowHasNoKernel(
  context: IHoldableContext,
  held: () => boolean
): void {
  let desc: PropertyDescriptor | undefined;
  for (
    let o: object | null = context;
    o && !desc;
    o = Object.getPrototypeOf(o)
  ) {
    desc = Object.getOwnPropertyDescriptor(o, 'hasNoKernel');
  }
  const getter = desc?.get;
  let value: boolean = desc?.value ?? false;
  const actual = getter ? () => Boolean(getter.call(context)) : () => value;
  Object.defineProperty(context, 'hasNoKernel', {
    configurable: true,
    enumerable: true,
    get: () => held() || actual(),
    set: (v: boolean) => {
      value = v; // a plain data property (the unit tests' contexts) stays writable
    }
  });
}
