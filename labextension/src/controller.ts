import { Event, ServerConnection } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { Poll, Throttler } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  describeAction,
  describeStatus,
  IActionView,
  IBusyKernel,
  IFlight,
  IPolicy,
  IReportVariable,
  isFlightActive,
  IStatus,
  IStatusView,
  ITrans
} from './model';
import { requestAPI } from './request';

/** The server's lifecycle events (contract §3). */
export const LIFECYCLE_SCHEMA = 'https://events.jupyter.org/jupyter_pause/lifecycle/v1';

/** Seconds between safety polls while a pause or resume runs (events are the main source). */
const FLIGHT_POLL_S = 2;

export interface IStatusChange {
  previous: IStatus | null;
  current: IStatus | null;
}

/**
 * Holds the workspace state as the server reports it. Refreshed when a lifecycle event
 * arrives (throttled), by a slow safety poll (faster only while a flight runs), and after
 * each request this UI sends.
 */
export class PauseController implements IDisposable {
  constructor(options: PauseController.IOptions) {
    this._settings = options.serverSettings;
    this._trans = options.trans;
    this._idleInterval = Math.max(5, options.pollInterval ?? 30) * 1000;
    this._throttler = new Throttler(() => this.refresh(), { limit: 250, edge: 'trailing' });
    this._policyThrottler = new Throttler(() => this.refreshPolicy(), {
      limit: 250,
      edge: 'trailing'
    });
    this._poll = new Poll({
      name: 'jupyter-pause:status',
      factory: async () => {
        await this.refresh();
        if (this._error) {
          throw new Error(this._error); // lets the poll back off while the server is away
        }
      },
      frequency: { interval: this._idleInterval, backoff: true, max: 10 * this._idleInterval },
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

  /** Emitted after each successful read of `GET status`, with the previous value. */
  get statusRead(): ISignal<this, IStatusChange> {
    return this._statusRead;
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

  get pending(): boolean {
    return this._pending;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  get statusView(): IStatusView {
    return describeStatus(this._status, this._error, this._trans);
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
      status = await requestAPI<IStatus>('status', {}, this._settings);
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
      policy = await requestAPI<IPolicy>('policy', {}, this._settings);
    } catch (reason) {
      console.debug('jupyter-pause: no policy state', reason);
    }
    if (this._isDisposed || seq !== this._policySeq) {
      return; // a newer read is under way
    }
    this._policy = policy;
    this._policyReadAt = Date.now();
    this._policyChanged.emit(policy);
  }

  /** `POST policy/cancel`: the person is here; the auto-pause must not happen. */
  async cancelAutoPause(): Promise<void> {
    try {
      this._policy = await requestAPI<IPolicy>(
        'policy/cancel',
        { method: 'POST', body: '{}' },
        this._settings
      );
      this._policyReadAt = Date.now();
      this._policySeq++;
      this._policyChanged.emit(this._policy);
    } finally {
      void this.refreshPolicy();
    }
  }

  /** `POST pause`; resolves with the flight, rejects with the server's one-line message. */
  async pause(): Promise<IFlight> {
    return this._start('pause', { trigger: 'manual', interrupt: false });
  }

  /** `POST resume`. */
  async resume(): Promise<IFlight> {
    return this._start('resume', { trigger: 'manual' });
  }

  /**
   * `POST recompute`: re-run the recorded cells of skipped variables of one notebook. The
   * server marks them in its `last_report`; resolves once that report has been re-read.
   */
  async recompute(path: string, names: string[]): Promise<IReportVariable[]> {
    try {
      const reply = await requestAPI<{ variables: IReportVariable[] }>(
        'recompute',
        { method: 'POST', body: JSON.stringify({ path, names }) },
        this._settings
      );
      return reply.variables ?? [];
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
    this._throttler.dispose();
    this._policyThrottler.dispose();
    Signal.clearData(this);
  }

  private async _start(kind: 'pause' | 'resume', body: object): Promise<IFlight> {
    this._pending = true;
    this._changed.emit();
    try {
      const reply = await requestAPI<{ flight: IFlight }>(
        kind,
        { method: 'POST', body: JSON.stringify(body) },
        this._settings
      );
      return reply.flight;
    } finally {
      this._pending = false;
      await this.refresh();
    }
  }

  private _onEvent(_: Event.IManager, event: Event.Emission): void {
    if (event.schema_id !== LIFECYCLE_SCHEMA) {
      return;
    }
    // Show the new state at once; the throttled re-read fills in the rest (timeline, report).
    const data = event as any;
    if (data.event && data.event !== 'progress' && this._policy?.enabled !== false) {
      // auto_pause_announced / _cancelled, and any transition (a pause starting ends the
      // announcement): the event carries no countdown, GET policy has it.
      void this._policyThrottler.invoke();
    }
    if (this._status && typeof data.state === 'string') {
      this._status = {
        ...this._status,
        state: data.state,
        outcome: data.outcome ?? this._status.outcome,
        step: data.step !== undefined ? data.step : this._status.step,
        reason: data.reason !== undefined ? data.reason : this._status.reason
      };
      this._changed.emit();
    }
    void this._throttler.invoke();
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

  private _settings: ServerConnection.ISettings;
  private _trans: ITrans;
  private _idleInterval: number;
  private _poll: Poll;
  private _throttler: Throttler;
  private _policyThrottler: Throttler;
  private _policy: IPolicy | null = null;
  private _policyReadAt = 0;
  private _policySeq = 0;
  private _policyChanged = new Signal<this, IPolicy | null>(this);
  private _events: Event.IManager | null = null;
  private _status: IStatus | null = null;
  private _lastRead: IStatus | null = null;
  private _error: string | null = null;
  private _pending = false;
  private _busy = new Map<string, IBusyKernel>();
  private _seq = 0;
  private _applied = 0;
  private _isDisposed = false;
  private _changed = new Signal<this, void>(this);
  private _statusRead = new Signal<this, IStatusChange>(this);
}

export namespace PauseController {
  export interface IOptions {
    serverSettings: ServerConnection.ISettings;
    events?: Event.IManager | null;
    trans: ITrans;
    /** Seconds between safety polls when nothing is happening. */
    pollInterval?: number;
  }
}
