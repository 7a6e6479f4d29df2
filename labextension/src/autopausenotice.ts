import { Notification } from '@jupyterlab/apputils';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

import { describeAutoPause } from './autopause';
import { PauseController } from './controller';
import { ITrans } from './format';

/**
 * The auto-pause announcement: a notification with a countdown and a Cancel action while the
 * idle policy has announced a pause (`GET policy` state "announced"). Cancel calls
 * `POST policy/cancel`; the notification goes away when the server cancels the announcement
 * (activity came back, someone cancelled elsewhere) or when the pause starts.
 */
export class AutoPauseNotice implements IDisposable {
  constructor(
    private _controller: PauseController,
    private _trans: ITrans
  ) {
    _controller.policyChanged.connect(this._update, this);
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
    this._hide();
  }

  private _update(): void {
    const elapsed = (Date.now() - this._controller.policyReadAt) / 1000;
    const view = describeAutoPause(
      this._controller.policy,
      elapsed,
      this._trans
    );
    if (!view) {
      this._hide();
      return;
    }
    if (this._id && this._key !== view.key) {
      this._hide(); // another announcement: a fresh notification
    }
    if (!this._id) {
      this._key = view.key;
      this._id = Notification.warning(view.message, {
        autoClose: false,
        actions: [
          {
            label: this._trans.__('Cancel'),
            caption: this._trans.__(
              'Keep this workspace running: cancel the auto-pause'
            ),
            displayType: 'accent',
            callback: () => void this._cancel()
          }
        ]
      });
      this._timer = window.setInterval(() => this._update(), 1000);
    } else if (view.message !== this._shown) {
      Notification.update({
        id: this._id,
        message: view.message,
        type: 'warning'
      });
    }
    this._shown = view.message;
  }

  private async _cancel(): Promise<void> {
    this._hide();
    try {
      await this._controller.cancelAutoPause();
    } catch (error) {
      Notification.error(
        this._trans.__(
          'Cannot cancel the auto-pause: %1',
          (error as Error).message
        ),
        { autoClose: 8000 }
      );
    }
  }

  private _hide(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
    if (this._id) {
      Notification.dismiss(this._id);
      this._id = null;
      this._key = null;
      this._shown = null;
    }
  }

  private _id: string | null = null;
  private _key: string | null = null;
  private _shown: string | null = null;
  private _timer: number | null = null;
  private _isDisposed = false;
}
