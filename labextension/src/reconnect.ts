/**
 * Points each open notebook at the kernel the server now has for its path. Pausing stops the
 * kernels, and jupyter_server then forgets their sessions; the resume recreates them, but a
 * notebook whose session was dropped meanwhile would stay on "No Kernel".
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import {
  ServerConnection,
  ServiceManager,
  Session,
  SessionAPI
} from '@jupyterlab/services';

/** How long the sessions are read again, while the server does not answer, before giving up. */
const SESSION_READ_DEADLINE_MS = 30_000;
const SESSION_READ_RETRY_MS = 1_000;

/**
 * Re-read the server's sessions and kernels, then follow them in every open notebook.
 * `paused`: the pause stopped every kernel, so a session the server no longer has is let go.
 */
export async function reconnectNotebooks(
  services: ServiceManager.IManager,
  tracker: INotebookTracker | null,
  paused = false
): Promise<void> {
  await Promise.all([
    services.sessions.refreshRunning(),
    services.kernels.refreshRunning()
  ]);
  if (!tracker) {
    return;
  }
  // The sessions are read directly rather than taken from running(): a refresh whose read
  // fails resolves all the same and leaves running() on its old list (JupyterLab's poll then
  // backs off for tens of seconds); following that list after a pause would keep the stopped
  // kernel's session (or adopt it again), so a cell would run on a kernel that is gone.
  const models = await readSessions(services);
  if (!models) {
    return; // the server did not answer: JupyterLab's own poll follows it later
  }
  const sessionByPath = new Map<string, Session.IModel>();
  const live = new Set<string>();
  for (const model of models) {
    live.add(model.id);
    if (model.kernel) {
      sessionByPath.set(model.path, model);
    }
  }
  const work: Promise<unknown>[] = [];
  tracker.forEach(panel => {
    const context = panel.sessionContext;
    if (
      paused &&
      context.session &&
      !live.has(context.session.id) &&
      !context.isDisposed
    ) {
      // SessionManager.requestRunning() disposes the connections of sessions that ended only
      // when the list differs from the one it cached; a session started just before the pause
      // may never have been in that cache, and its connection would then stay ("Disconnected")
      // instead of the notebook showing "No Kernel".
      context.session.dispose();
    }
    const model = sessionByPath.get(panel.context.path);
    const kernelId = model?.kernel?.id;
    if (
      !model ||
      !kernelId ||
      context.isDisposed ||
      context.session?.kernel?.id === kernelId
    ) {
      return;
    }
    if (!context.session && adoptSession(services, context, model)) {
      return;
    }
    work.push(context.changeKernel({ id: kernelId }));
  });
  await Promise.all(work);
}

/**
 * Connect a notebook that lost its session (its kernel was stopped by the pause) to the
 * session the server now has for its path, as JupyterLab does when it opens a notebook.
 * changeKernel() would start a second session on the same kernel: without a session it
 * POSTs under a temporary path and only then renames it to the notebook's path.
 * SessionContext has no public way to adopt an existing session, so this uses the method
 * its own initialization uses, and falls back to changeKernel() if that ever goes away.
 * The kernel hold keeps JupyterLab from starting a session of its own meanwhile, whose
 * completion would shut down the adopted one.
 */
function adoptSession(
  services: ServiceManager.IManager,
  context: ISessionContext,
  model: Session.IModel
): boolean {
  const handle = (
    context as unknown as {
      _handleNewSession?: (session: Session.ISessionConnection) => unknown;
    }
  )._handleNewSession;
  if (typeof handle !== 'function') {
    return false;
  }
  handle.call(context, services.sessions.connectTo({ model }));
  return true;
}

/**
 * The server's sessions now, read again each second while the server cannot answer (a dropped
 * connection, a proxy's 502/503/504, JupyterHub's 424 while it starts the server); null on any
 * other error (a 500 is the server's own answer: asking again gets the same) or once the
 * deadline passes.
 */
async function readSessions(
  services: ServiceManager.IManager
): Promise<Session.IModel[] | null> {
  const deadline = Date.now() + SESSION_READ_DEADLINE_MS;
  for (;;) {
    try {
      return await SessionAPI.listRunning(services.serverSettings);
    } catch (reason) {
      if (!transient(reason) || Date.now() + SESSION_READ_RETRY_MS > deadline) {
        console.warn('jupyter-pause: could not read the sessions', reason);
        return null;
      }
      await new Promise(resolve => setTimeout(resolve, SESSION_READ_RETRY_MS));
    }
  }
}

function transient(reason: unknown): boolean {
  if (reason instanceof ServerConnection.NetworkError) {
    return true;
  }
  const status =
    reason instanceof ServerConnection.ResponseError
      ? reason.response.status
      : 0;
  return [424, 502, 503, 504].includes(status);
}
