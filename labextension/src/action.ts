/**
 * The Pause/Resume action for a `GET status` answer: which one, whether it can run now, and
 * why (or why not). No JupyterLab imports, so it is unit-tested in Node.
 */

import type { IStatus } from './api';
import { ITrans } from './format';
import { describeOffer, hasAccelerator, isPausing, isResuming } from './status';

/** What the toolbar button (and the Pause / Resume commands) show. */
export interface IActionView {
  mode: 'pause' | 'resume';
  enabled: boolean;
  label: string;
  tooltip: string;
}

/** A kernel the frontend knows to be running a cell right now. */
export interface IBusyKernel {
  path: string;
}

/** Kernels that are running a cell, from the frontend's own view and the server's list. */
export function busyPaths(
  status: IStatus | null,
  local: IBusyKernel[]
): string[] {
  const paths = new Set<string>();
  for (const k of local) {
    paths.add(k.path);
  }
  for (const k of status?.kernels ?? []) {
    if (k.execution_state === 'busy') {
      paths.add(k.path || k.id);
    }
  }
  return Array.from(paths).sort();
}

function pauseView(
  trans: ITrans,
  enabled: boolean,
  tooltip: string
): IActionView {
  return { mode: 'pause', enabled, label: trans.__('Pause'), tooltip };
}

function resumeView(
  trans: ITrans,
  enabled: boolean,
  tooltip: string
): IActionView {
  return { mode: 'resume', enabled, label: trans.__('Resume'), tooltip };
}

/** Resume when it is on offer (paused, or a failure that left a way back); null otherwise. */
function resumeOffer(
  status: IStatus,
  pending: boolean,
  trans: ITrans
): IActionView | null {
  const lastFailure = () =>
    trans.__(
      'Resume again. The last attempt failed: %1',
      status.reason || trans.__('no reason given')
    );
  const sending = trans.__('Sending the request…');
  if (status.state === 'paused') {
    const why = trans.__(
      'Resume: bring the kernels back, live if they survived, otherwise restored from the checkpoint.'
    );
    return resumeView(trans, !pending, pending ? sending : why);
  }
  if (status.state !== 'failed') {
    return null;
  }
  if (status.resume_available) {
    const offer = describeOffer(status, trans);
    const why = offer
      ? trans.__(
          'Resume: restore the previous checkpoint into fresh kernels (%1).',
          offer
        )
      : lastFailure();
    return resumeView(trans, !pending, pending ? sending : why);
  }
  if (status.flight?.kind === 'resume') {
    return resumeView(trans, !pending, lastFailure());
  }
  return null;
}

/** Why Pause cannot run now (the backend, or cells running), or null when it can. */
function pauseBlocker(
  status: IStatus,
  local: IBusyKernel[],
  trans: ITrans
): string | null {
  const backend = status.backend;
  if (backend && (!backend.configured || !backend.can_pause)) {
    const why =
      backend.why_not ||
      (backend.configured
        ? trans.__('the backend cannot pause')
        : trans.__('the backend "%1" is not configured', backend.name));
    return trans.__('Pausing is not possible here: %1', why);
  }
  const busy = busyPaths(status, local);
  if (busy.length > 0) {
    return trans._n(
      'Cannot pause while a cell is running in %2. Wait for it to finish or interrupt the kernel.',
      'Cannot pause while cells are running in %2. Wait for them to finish or interrupt the kernels.',
      busy.length,
      busy.join(', ')
    );
  }
  return null;
}

/**
 * The Pause/Resume action: which one, whether it can run now, and a tooltip saying why
 * (or why not). `pending`: a request this page sent has not been answered yet.
 */
export function describeAction(
  status: IStatus | null,
  error: string | null,
  local: IBusyKernel[],
  pending: boolean,
  trans: ITrans
): IActionView {
  if (error) {
    return pauseView(trans, false, trans.__('Pause is unavailable: %1', error));
  }
  if (!status) {
    return pauseView(trans, false, trans.__('Reading the pause/resume state…'));
  }
  if (isPausing(status)) {
    return pauseView(trans, false, trans.__('A pause is already running.'));
  }
  if (isResuming(status)) {
    return resumeView(trans, false, trans.__('A resume is already running.'));
  }
  const resume = resumeOffer(status, pending, trans);
  if (resume) {
    return resume;
  }
  if (pending) {
    return pauseView(trans, false, trans.__('Sending the request…'));
  }
  const blocker = pauseBlocker(status, local, trans);
  const why = hasAccelerator(status)
    ? trans.__(
        'Pause: write a checkpoint of every kernel, then stop them to free the accelerator.'
      )
    : trans.__(
        'Pause: write a checkpoint of every kernel, then stop them to free their memory.'
      );
  return pauseView(trans, blocker === null, blocker ?? why);
}
