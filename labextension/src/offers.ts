/**
 * The truth after a kernel dies or restarts: what the status says for a notebook whose
 * kernel lost its state, and the saved state the server offers back (`GET status` ->
 * `offers`, `POST offers/restore`). No JupyterLab imports, so it is unit-tested in Node.
 */

import type { IStatus } from './api';
import { formatClock, ITrans } from './format';

/** One notebook whose kernel state was lost, and what can bring it back (`status.offers`). */
export interface IOffer {
  id: string;
  /** "autosave" or "checkpoint"; null when nothing of that kernel was saved. */
  kind: 'autosave' | 'checkpoint' | null | string;
  /** "kernel_died" (the kernel crashed and was restarted) or "server_killed". */
  cause?: string | null;
  path: string;
  kernel_id?: string | null;
  dead_kernel_id?: string | null;
  died_at?: string | null;
  checkpoint_id?: string | null;
  created_at?: string | null;
  /** Execution count of the last cell the saved state reflects. */
  cell?: number | null;
  /** Seconds of work lost: between `created_at` and `died_at`. */
  age_s?: number | null;
  variables?: number | null;
  /** Cells ran in the new kernel since: restoring merges over them. */
  used_since?: boolean;
  /** The server's sentence for it. */
  text?: string | null;
}

/** A kernel restart this page saw (Kernel > Restart, or JupyterLab's restart after a death). */
export interface IRestart {
  path: string;
  /** A cell ran in the new kernel since: the saved state is no longer simply "the" state. */
  used: boolean;
}

/** The offer for a notebook, or null. */
export function offerFor(
  status: IStatus | null,
  path: string | null | undefined
): IOffer | null {
  if (!path) {
    return null;
  }
  return (status?.offers ?? []).find(o => o.path === path) ?? null;
}

/** Whether an offer can be restored (there is a saved state behind it). */
export function canRestoreOffer(offer: IOffer | null): boolean {
  return !!offer && !!offer.checkpoint_id;
}

/** The notebook's file name, as a person reads it in the tab. */
export function fileName(path: string): string {
  return path.split('/').pop() || path;
}

/**
 * "kernel restarted: its state is gone; restore the state of 10:42 (7 variables)?" for one
 * notebook. `checkpoint`: when the server offers nothing, the last checkpoint of the
 * workspace that %restore would load (after a plain Kernel > Restart).
 */
export function restartSentence(
  offer: IOffer | null,
  checkpointAt: string | null,
  trans: ITrans
): string {
  const died =
    offer?.cause === 'kernel_died' || offer?.cause === 'server_killed';
  const head = died
    ? trans.__('kernel died: its state is gone')
    : trans.__('kernel restarted: its state is gone');
  if (offer && canRestoreOffer(offer)) {
    const when = offer.created_at ? formatClock(offer.created_at) : '?';
    const count = typeof offer.variables === 'number' ? offer.variables : null;
    const what =
      count === null
        ? trans.__('restore the state of %1?', when)
        : trans._n(
            'restore the state of %2 (%1 variable)?',
            'restore the state of %2 (%1 variables)?',
            count,
            when
          );
    return `${head}; ${what}`;
  }
  if (offer) {
    return trans.__('%1 (nothing of it was saved).', head);
  }
  if (checkpointAt) {
    return `${head}; ${trans.__('restore the checkpoint of %1?', formatClock(checkpointAt))}`;
  }
  return `${head}.`;
}

/** Capitalised, for the start of a label or a toast. */
export function capitalise(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}
