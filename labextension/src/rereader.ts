import { IDisposable } from '@lumino/disposable';

/**
 * Re-reads after a change notice: `invoke()` runs `read` `delay` ms later, one read at a time,
 * and runs it once more after a read that was asked for again while it ran.
 *
 * Lumino's `Throttler` is not enough here: a call made while its function runs is dropped (its
 * poll stays in phase "invoked" until the function settles), so an event that arrives while a
 * read is in flight, a read the server may have answered before that event, was never read:
 * the page kept the older state until the next safety poll.
 */
export class Rereader implements IDisposable {
  constructor(
    private _read: () => Promise<void>,
    private _delay = 250
  ) {}

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** A change happened: a read that starts after now will see it. */
  invoke(): void {
    if (this._isDisposed) {
      return;
    }
    if (this._running) {
      this._again = true; // the read under way may predate the change
      return;
    }
    if (this._timer === null) {
      this._timer = setTimeout(() => void this._run(), this._delay);
    } // else: a read is due and has not started: it will see the change
  }

  dispose(): void {
    this._isDisposed = true;
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private async _run(): Promise<void> {
    this._timer = null;
    this._running = true;
    try {
      await this._read();
    } catch (reason) {
      console.debug('jupyter-pause: re-read failed', reason);
    } finally {
      this._running = false;
      if (this._again) {
        this._again = false;
        this.invoke();
      }
    }
  }

  private _isDisposed = false;
  private _running = false;
  private _again = false;
  private _timer: ReturnType<typeof setTimeout> | null = null;
}
