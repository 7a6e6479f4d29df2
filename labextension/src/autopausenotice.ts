import { Notification } from '@jupyterlab/apputils';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

import { describeAutoPause } from './autopause';
import { PauseController } from './controller';
import { ITrans } from './format';

/**
 * The auto-pause announcement: a notification naming when the pause happens, with a Cancel
 * action, while the idle policy has announced a pause (`GET policy` state "announced"). Cancel
 * calls `POST policy/cancel`; the notification goes away when the server cancels the
 * announcement (activity came back, someone cancelled elsewhere) or when the pause starts.
 *
 * Its text is fixed for one announcement and never passed to `Notification.update`: JupyterLab
 * hands an update to react-toastify 9, whose `toast.update` applies it a timer later and re-adds
 * the toast to the displayed ones even when `toast.dismiss` ran in between (the toast stays in
 * its collection until the exit animation ends). An update shortly before a dismissal left the
 * countdown this notice used to show on screen after the server had cancelled the pause, with
 * nothing left to dismiss it. A new announcement (another deadline) gets a new notification.
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
    const view = describeAutoPause(
      this._controller.policy,
      this._controller.policyReadAt,
      this._trans
    );
    if (!view) {
      this._hide();
      return;
    }
    if (this._id && this._key === view.key) {
      return; // shown; its text stays as it is (see above)
    }
    this._hide(); // another announcement: a fresh notification
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
    if (this._id) {
      Notification.dismiss(this._id);
      this._id = null;
      this._key = null;
    }
  }

  private _id: string | null = null;
  private _key: string | null = null;
  private _isDisposed = false;
}
