/**
 * What the page does when the workspace state changes: notebooks follow the server's kernels,
 * the kernel hold follows the state, and notifications say what happened (paused, a failure,
 * the resume report).
 */

import { Notification } from '@jupyterlab/apputils';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

import type { IStatus } from './api';
import { IFlightRequest, IStatusChange, PauseController } from './controller';
import { ITrans } from './format';
import { holdModeOf, KernelHold } from './kernelhold';
import { hasNewReport, isIncomplete, reportHeadline } from './report';
import {
  canRestoreOffer,
  capitalise,
  fileName,
  restartSentence
} from './offers';
import { freedText } from './status';

/** States after which the server has stopped or started kernels. */
const SETTLED: ReadonlySet<string> = new Set([
  'paused',
  'ready',
  'running',
  'failed'
]);

export class StateFollower implements IDisposable {
  constructor(options: StateFollower.IOptions) {
    this._controller = options.controller;
    this._hold = options.hold;
    this._trans = options.trans;
    this._reconnect = options.reconnect;
    this._showReport = options.showReport;
    this._controller.statusRead.connect(this._onRead, this);
    this._controller.requested.connect(this._onRequest, this);
    this._controller.changed.connect(this._onChanged, this);
  }

  /** A kernel restarted since the resume: "Resumed: restored …" no longer says how it is. */
  private _onChanged(): void {
    if (this._reportNote && this._controller.restarts.some(r => !r.used)) {
      Notification.dismiss(this._reportNote);
      this._reportNote = null;
    }
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    Signal.disconnectReceiver(this);
    if (this._pausedNote) {
      Notification.dismiss(this._pausedNote);
    }
  }

  private _onRequest(_: PauseController, request: IFlightRequest): void {
    this._hold.followRequest(
      request.kind,
      request.phase,
      this._controller.status
    );
  }

  private _onRead(_: PauseController, change: IStatusChange): void {
    const { previous, current } = change;
    if (!current) {
      return;
    }
    if (this._seenReport === undefined) {
      this._seenReport = current.last_report?.flight_id ?? null;
    }
    const synced = this._followTransition(previous, current);
    this._followHold(current, synced);
    this._announceFailure(previous, current);
    this._announceReport(current, synced);
    this._announceOffers(current);
  }

  /**
   * A kernel that died (or a server that was killed) and the saved state the server offers
   * back: one notification per offer, with Restore when there is something to restore.
   */
  private _announceOffers(current: IStatus): void {
    const offers = current.offers ?? [];
    const live = new Set(offers.map(o => o.id));
    for (const [id, note] of this._offerNotes) {
      if (!live.has(id)) {
        Notification.dismiss(note); // restored, dismissed or superseded (maybe in another tab)
        this._offerNotes.delete(id);
      }
    }
    const trans = this._trans;
    for (const offer of offers) {
      if (this._offerNotes.has(offer.id)) {
        continue;
      }
      const message = `${fileName(offer.path)}: ${capitalise(restartSentence(offer, null, trans))}`;
      const actions: Notification.IAction[] = [];
      if (canRestoreOffer(offer)) {
        actions.push({
          label: trans.__('Restore'),
          callback: () =>
            void this._controller
              .restoreOffer(offer.path, offer.id)
              .then(vars =>
                Notification.success(
                  trans._n(
                    '%2: restored %1 variable.',
                    '%2: restored %1 variables.',
                    vars.length,
                    fileName(offer.path)
                  ),
                  { autoClose: 8000 }
                )
              )
              .catch(error =>
                Notification.error(
                  trans.__(
                    '%1 was not restored: %2',
                    fileName(offer.path),
                    (error as Error).message
                  ),
                  { autoClose: 10000 }
                )
              )
        });
        actions.push({
          label: trans.__('Dismiss'),
          callback: () =>
            void this._controller
              .dismissOffer(offer.path, offer.id)
              .catch(() => undefined)
        });
      }
      this._offerNotes.set(
        offer.id,
        Notification.warning(message, { actions, autoClose: false })
      );
    }
  }

  /** On a state change: reconnect notebooks and say "Paused". Resolves once reconnected. */
  private _followTransition(
    previous: IStatus | null,
    current: IStatus
  ): Promise<unknown> {
    const prevState = previous?.state;
    if (!prevState || prevState === current.state) {
      return Promise.resolve();
    }
    let synced: Promise<unknown> = Promise.resolve();
    if (SETTLED.has(current.state)) {
      // Follow at once rather than at the next session poll, so the first cell after a
      // resume reaches the restored kernel.
      synced = this._reconnect(current.state === 'paused').catch(reason =>
        console.warn('jupyter-pause: could not reconnect notebooks', reason)
      );
    }
    if (prevState === 'paused' && this._pausedNote) {
      Notification.dismiss(this._pausedNote); // stale once a resume starts
      this._pausedNote = null;
    }
    if (current.state === 'paused') {
      this._pausedNote = Notification.info(
        this._trans.__(
          "Paused: the notebooks' state is saved; %1. Resume when you are ready.",
          freedText(current, this._trans)
        ),
        { autoClose: 6000 }
      );
    }
    return synced;
  }

  /**
   * Held while paused or in a flight; freed only once the notebooks follow the server's
   * kernels, and only if no newer answer started another flight meanwhile.
   */
  private _followHold(current: IStatus, synced: Promise<unknown>): void {
    const mode = this._hold.modeFor(current);
    if (mode !== 'free') {
      this._hold.set(mode);
      return;
    }
    void synced.then(() => {
      if (holdModeOf(this._controller.status) === 'free') {
        this._hold.set('free');
      }
    });
  }

  private _announceFailure(previous: IStatus | null, current: IStatus): void {
    if (current.state !== 'failed') {
      this._notifiedFailure = null;
      return;
    }
    const key = `${current.flight?.id ?? ''}:${current.reason ?? ''}`;
    if (!previous || this._notifiedFailure === key) {
      this._notifiedFailure = key; // a failure from before the page loaded stays in the status bar
      return;
    }
    this._notifiedFailure = key;
    const trans = this._trans;
    const what =
      current.flight?.kind === 'resume'
        ? trans.__('Resume failed')
        : trans.__('Pause failed');
    // The hint (what to do) is in the status tooltip and behind "Details": toasts are short.
    const reason = (current.reason || trans.__('no reason given')).replace(
      /\.$/,
      ''
    );
    Notification.error(`${what}: ${reason}.`, {
      actions: [
        { label: trans.__('Details'), callback: () => this._showReport() }
      ],
      autoClose: false
    });
  }

  /** A new resume report: its headline, once the notebooks are on the resumed kernels. */
  private _announceReport(current: IStatus, synced: Promise<unknown>): void {
    const report = current.last_report;
    if (!report || !hasNewReport(this._seenReport ?? null, current)) {
      return;
    }
    this._seenReport = report.flight_id;
    if (report.outcome === 'failed') {
      return; // announced by _announceFailure
    }
    const actions = [
      {
        label: this._trans.__('Show report'),
        callback: () => this._showReport()
      }
    ];
    const headline = reportHeadline(report, this._trans);
    const incomplete = isIncomplete(report);
    void synced.then(() => {
      this._reportNote = incomplete
        ? Notification.warning(headline, { actions, autoClose: false })
        : Notification.success(headline, { actions, autoClose: 15000 });
    });
  }

  private _controller: PauseController;
  private _hold: KernelHold;
  private _trans: ITrans;
  private _reconnect: (paused: boolean) => Promise<void>;
  private _showReport: () => void;
  /** Flight id of the last report announced; undefined until the first read. */
  private _seenReport: string | null | undefined = undefined;
  private _notifiedFailure: string | null = null;
  private _pausedNote: string | null = null;
  /** The last resume's notification, while it may be up. */
  private _reportNote: string | null = null;
  /** Offer id -> its notification. */
  private _offerNotes = new Map<string, string>();
  private _isDisposed = false;
}

export namespace StateFollower {
  export interface IOptions {
    controller: PauseController;
    hold: KernelHold;
    trans: ITrans;
    /** Point the open notebooks at the server's kernels. */
    /** Follow the server's sessions; `paused`: every kernel was stopped. */
    reconnect: (paused: boolean) => Promise<void>;
    /** Open the details / report dialog. */
    showReport: () => void;
  }
}
