/**
 * The service this extension provides to other JupyterLab extensions: the workspace's
 * pause/resume state, a signal when it changes, and the Pause and Resume actions.
 */

import { Token } from '@lumino/coreutils';
import { IDisposable } from '@lumino/disposable';
import { ISignal } from '@lumino/signaling';

import type { IFlight, IStatus, WorkspaceState } from './api';

/** One change of the workspace state. */
export interface IPauseState {
  /** The state now; null while unknown (not read yet, or the server cannot be reached). */
  readonly state: WorkspaceState | null;
  /** The state before this change. */
  readonly previous: WorkspaceState | null;
  /** The server's `GET status` answer, patched by the lifecycle events read since. */
  readonly status: IStatus | null;
}

/** The pause/resume state of this workspace, and the actions that change it. */
export interface IPauseController extends IDisposable {
  /** The last known `GET status` answer (null until read). */
  readonly status: IStatus | null;
  /** Why the state cannot be read now (the server extension is away), or null. */
  readonly error: string | null;
  /**
   * Emitted when the workspace state changes (e.g. `running` -> `checkpointing` ->
   * `paused`), as soon as the server's lifecycle event arrives or a read shows it.
   */
  readonly stateChanged: ISignal<IPauseController, IPauseState>;
  /** `POST pause`; resolves with the flight, rejects with the server's one-line message. */
  pause(): Promise<IFlight>;
  /** `POST resume`; resolves with the flight, rejects with the server's one-line message. */
  resume(): Promise<IFlight>;
  /** Re-read `GET status` now. Never throws: a failure is kept in `error`. */
  refresh(): Promise<void>;
}

/** The token of the pause/resume service (plugin `jupyter-pause:plugin`). */
export const IPauseController = new Token<IPauseController>(
  'jupyter-pause:IPauseController',
  'The workspace pause/resume state, its changes, and the Pause and Resume actions.'
);
