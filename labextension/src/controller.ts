import type { Event } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { describeAction, IActionView, IBusyKernel } from './action';
import type {
  IFlight,
  IPauseAPI,
  IPolicy,
  IReportVariable,
  IStatus,
  WorkspaceState
} from './api';
import { ITrans } from './format';
import type { IRestart } from './offers';
import { Rereader } from './rereader';
import { describeStatus, isFlightActive, IStatusView } from './status';
import type { IPauseController, IPauseState } from './tokens';

/** The server's lifecycle events (contract §3). */
export const LIFECYCLE_SCHEMA =
  'https://events.jupyter.org/jupyter_pause/lifecycle/v1';

/** Seconds between safety polls while a pause or resume runs (events are the main source). */
const FLIGHT_POLL_S = 2;

export interface IStatusChange {
  previous: IStatus | null;
  current: IStatus | null;
}

/** A `POST pause` / `POST resume` this page sent: `sent` at once, then how it ended. */
export interface IFlightRequest {
  kind: 'pause' | 'resume';
  phase: 'sent' | 'accepted' | 'failed';
}

/**
 * Holds the workspace state as the server reports it. Refreshed when a lifecycle event
 * arrives (a re-read shortly after, and one more for an event that came during a read:
 * `rereader.ts`), by a slow safety poll (faster only while a flight runs), and after each
 * request this UI sends. Answers are applied in the order the reads were sent: an
 * answer older than one already applied is dropped.
 */
export class PauseController implements IPauseController {
  constructor(options: PauseController.IOptions) {
    this._api = options.api;
    this._trans = options.trans;
    this._idleInterval = Math.max(5, options.pollInterval ?? 30) * 1000;
    this._rereader = new Rereader(() => this.refresh());
    this._policyRereader = new Rereader(() => this.refreshPolicy());
    this._poll = new Poll({
      name: 'jupyter-pause:status',
      factory: async () => {
        await this.refresh();
        if (this._error) {
          throw new Error(this._error); // lets the poll back off while the server is away
        }
      },
      frequency: {
        interval: this._idleInterval,
        backoff: true,
        max: 10 * this._idleInterval
      },
      standby: 'when-hidden'
    });
    if (options.events) {
      this._events = options.events;
      this._events.stream.connect(this._onEvent, this);
    }
  }

  /** Emitted whenever anything shown may have changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Emitted when the workspace state changes (from an event or a read). */
  get stateChanged(): ISignal<this, IPauseState> {
    return this._stateChanged;
  }

  /** Emitted after each successful read of `GET status`, with the previous read. */
  get statusRead(): ISignal<this, IStatusChange> {
    return this._statusRead;
  }

  /** Emitted when this page sends `POST pause/resume` and when the answer has been applied. */
  get requested(): ISignal<this, IFlightRequest> {
    return this._requested;
  }

  get status(): IStatus | null {
    return this._status;
  }

  /** The idle policy's state (`GET policy`), null until read or without the policy module. */
  get policy(): IPolicy | null {
    return this._policy;
  }

  /** `Date.now()` when `policy` was read (its `seconds_left` counts from then). */
  get policyReadAt(): number {
    return this._policyReadAt;
  }

  /** Emitted after each read of `GET policy`. */
  get policyChanged(): ISignal<this, IPolicy | null> {
    return this._policyChanged;
  }

  get error(): string | null {
    return this._error;
  }

  /** True from a `POST pause/resume` until its answer (and the status after it) is in. */
  get pending(): boolean {
    return this._pending;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  get statusView(): IStatusView {
    return describeStatus(
      this._status,
      this._error,
      this._trans,
      this.restarts
    );
  }

  /** Notebooks whose kernel restarted (or died) since the last workspace transition. */
  get restarts(): IRestart[] {
    return Array.from(this._restarts.values());
  }

  /**
   * A notebook's kernel restarted (Kernel > Restart, or JupyterLab's restart after the
   * kernel died): its state is gone, whatever the last resume restored.
   */
  noteRestart(path: string): void {
    this._restarts.set(path, { path, used: false });
    this._changed.emit();
    this._rereader.invoke(); // the server's offer for it, if the death made one
  }

  /** A cell ran in that notebook's new kernel: it is in use again. */
  noteUsed(path: string): void {
    const restart = this._restarts.get(path);
    if (restart && !restart.used) {
      restart.used = true;
      this._changed.emit();
    }
  }

  /** `POST offers/restore`: bring the notebook's saved state back into its new kernel. */
  async restoreOffer(path: string, id?: string): Promise<IReportVariable[]> {
    if (!this._api.restoreOffer) {
      throw new Error("this server cannot restore a dead kernel's state");
    }
    try {
      const reply = await this._api.restoreOffer(path, id);
      this._restarts.delete(path);
      return reply.variables ?? [];
    } finally {
      await this.refresh();
    }
  }

  /** `POST offers/dismiss`: the person does not want the saved state back. */
  async dismissOffer(path: string, id?: string): Promise<void> {
    try {
      await this._api.dismissOffer?.(path, id);
      this._restarts.delete(path);
    } finally {
      await this.refresh();
    }
  }

  /** The authentic checkpoints in the store (`GET checkpoints`); [] without the call. */
  checkpoints(): ReturnType<NonNullable<IPauseAPI['checkpoints']>> {
    return this._api.checkpoints
      ? this._api.checkpoints()
      : Promise.resolve([]);
  }

  get actionView(): IActionView {
    return describeAction(
      this._status,
      this._error,
      Array.from(this._busy.values()),
      this._pending,
      this._trans
    );
  }

  /** Seconds between safety polls when no flight runs (from the settings). */
  setPollInterval(seconds: number): void {
    this._idleInterval = Math.max(5, seconds || 30) * 1000;
    this._adjustPoll();
  }

  /** Record whether a kernel the frontend watches (a notebook panel's) is running a cell. */
  setBusy(key: string, path: string, busy: boolean): void {
    const was = this._busy.has(key);
    if (busy) {
      this._busy.set(key, { path });
    } else {
      this._busy.delete(key);
    }
    if (was !== busy) {
      this._changed.emit();
    }
  }

  /** Re-read `GET status`. Never throws: a failure is kept in `error`. */
  async refresh(): Promise<void> {
    if (this._isDisposed) {
      return;
    }
    const seq = ++this._seq;
    let status: IStatus | null = null;
    let error: string | null = null;
    try {
      status = await this._api.status();
    } catch (reason) {
      error = (reason as Error).message || String(reason);
    }
    if (this._isDisposed || seq < this._applied) {
      return; // a newer answer already arrived
    }
    this._applied = seq;
    // Transitions are judged between server answers: events already patched _status.
    const previous = this._lastRead;
    if (status) {
      this._status = status;
      this._lastRead = status;
      this._error = null;
    } else {
      this._error = error;
    }
    this._adjustPoll();
    this._changed.emit();
    this._emitState();
    if (status) {
      this._statusRead.emit({ previous, current: status });
    }
    if (this._policy?.enabled) {
      void this.refreshPolicy(); // an announcement whose event this page missed
    }
  }

  /** Re-read `GET policy` (auto-pause state). Never throws: a failure hides the countdown. */
  async refreshPolicy(): Promise<void> {
    if (this._isDisposed) {
      return;
    }
    const seq = ++this._policySeq;
    let policy: IPolicy | null = null;
    try {
      policy = await this._api.policy();
    } catch (reason) {
      console.debug('jupyter-pause: no policy state', reason);
    }
    if (this._isDisposed || seq !== this._policySeq) {
      return; // a newer read is under way
    }
    this._setPolicy(policy);
  }

  /** `POST policy/cancel`: the person is here; the auto-pause must not happen. */
  async cancelAutoPause(): Promise<void> {
    try {
      const policy = await this._api.cancelAutoPause();
      this._policySeq++; // a read sent before the cancel must not bring the countdown back
      this._setPolicy(policy);
    } finally {
      void this.refreshPolicy();
    }
  }

  /**
   * `POST pause`; resolves with the flight, rejects with the server's one-line message (an
   * `APIError`; see `pauseanyway.ts` for the kernels a 409 names). `loseState`: the kernels
   * the person agreed to lose the state of.
   */
  pause(loseState?: string[]): Promise<IFlight> {
    return this._start('pause', loseState);
  }

  /** `POST resume`. */
  resume(): Promise<IFlight> {
    return this._start('resume');
  }

  /**
   * `POST recompute`: re-run the recorded cells of skipped variables of one notebook. The
   * server marks them in its `last_report`; resolves once that report has been re-read.
   */
  async recompute(path: string, names: string[]): Promise<IReportVariable[]> {
    try {
      return await this._api.recompute(path, names);
    } finally {
      await this.refresh();
    }
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._events?.stream.disconnect(this._onEvent, this);
    this._poll.dispose();
    this._rereader.dispose();
    this._policyRereader.dispose();
    Signal.clearData(this);
  }

  /**
   * Send the request, then re-read the status before saying how it ended, so that listeners
   * of `requested` see the state the server answered with.
   */
  private async _start(
    kind: 'pause' | 'resume',
    loseState?: string[]
  ): Promise<IFlight> {
    this._pending = true;
    this._changed.emit();
    this._requested.emit({ kind, phase: 'sent' });
    let flight: IFlight | null = null;
    let failure: unknown = null;
    try {
      flight = await (loseState
        ? this._api.start(kind, loseState)
        : this._api.start(kind));
    } catch (reason) {
      failure = reason ?? new Error('request failed');
    }
    this._pending = false;
    await this.refresh();
    this._requested.emit({
      kind,
      phase: failure === null ? 'accepted' : 'failed'
    });
    if (failure !== null) {
      throw failure;
    }
    return flight as IFlight;
  }

  private _setPolicy(policy: IPolicy | null): void {
    this._policy = policy;
    this._policyReadAt = Date.now();
    this._policyChanged.emit(policy);
  }

  /** Emit `stateChanged` when the state differs from the one last announced. */
  private _emitState(): void {
    const state = this._error ? null : (this._status?.state ?? null);
    if (state === this._shownState) {
      return;
    }
    const previous = this._shownState;
    this._shownState = state;
    if (previous !== null && state !== null) {
      this._restarts.clear(); // a pause or resume since: the kernels are its kernels now
    }
    this._stateChanged.emit({ state, previous, status: this._status });
  }

  private _onEvent(_: Event.IManager, event: Event.Emission): void {
    if (event.schema_id !== LIFECYCLE_SCHEMA) {
      return;
    }
    // Show the new state at once; the re-read fills in the rest (timeline, report).
    const data = event as any;
    if (
      data.event &&
      data.event !== 'progress' &&
      this._policy?.enabled !== false
    ) {
      // auto_pause_announced / _cancelled, and any transition (a pause starting ends the
      // announcement): the event carries no countdown, GET policy has it.
      this._policyRereader.invoke();
    }
    // An event can arrive after a read that already includes it (the event stream and the
    // reads are separate connections): applying it then would show an older state again.
    const stale =
      typeof data.seq === 'number' &&
      typeof this._status?.seq === 'number' &&
      data.seq <= this._status.seq;
    if (this._status && typeof data.state === 'string' && !stale) {
      this._status = {
        ...this._status,
        seq: typeof data.seq === 'number' ? data.seq : this._status.seq,
        state: data.state as WorkspaceState,
        outcome: data.outcome ?? this._status.outcome,
        step: data.step !== undefined ? data.step : this._status.step,
        reason: data.reason !== undefined ? data.reason : this._status.reason
      };
      this._changed.emit();
      this._emitState();
    }
    this._rereader.invoke();
  }

  /** Poll every couple of seconds during a flight, slowly otherwise. */
  private _adjustPoll(): void {
    const active = isFlightActive(this._status) || this._pending;
    const interval = active ? FLIGHT_POLL_S * 1000 : this._idleInterval;
    if (this._poll.frequency.interval !== interval) {
      this._poll.frequency = {
        interval,
        backoff: !active,
        max: active ? interval : 10 * this._idleInterval
      };
    }
  }

  private _api: IPauseAPI;
  private _trans: ITrans;
  private _idleInterval: number;
  private _poll: Poll;
  private _rereader: Rereader;
  private _policyRereader: Rereader;
  private _policy: IPolicy | null = null;
  private _policyReadAt = 0;
  private _policySeq = 0;
  private _policyChanged = new Signal<this, IPolicy | null>(this);
  private _events: Event.IManager | null = null;
  private _status: IStatus | null = null;
  private _lastRead: IStatus | null = null;
  private _shownState: WorkspaceState | null = null;
  private _error: string | null = null;
  private _pending = false;
  private _busy = new Map<string, IBusyKernel>();
  private _restarts = new Map<string, IRestart>();
  private _seq = 0;
  private _applied = 0;
  private _isDisposed = false;
  private _changed = new Signal<this, void>(this);
  private _stateChanged = new Signal<this, IPauseState>(this);
  private _statusRead = new Signal<this, IStatusChange>(this);
  private _requested = new Signal<this, IFlightRequest>(this);
}

export namespace PauseController {
  export interface IOptions {
    /** The REST client (`PauseAPI` on the app's server settings). */
    api: IPauseAPI;
    /** The server's event stream; lifecycle events update the state at once. */
    events?: Event.IManager | null;
    trans: ITrans;
    /** Seconds between safety polls when nothing is happening. */
    pollInterval?: number;
  }
}
