/**
 * "Pause anyway?": a pause the server refused (409) because some kernels cannot be
 * checkpointed (another language, or no jupyter-pause in their environment). The person
 * chooses: Cancel (nothing changed, the kernels keep running) or Pause anyway (those kernels'
 * state is lost, and named in the report). No JupyterLab imports, so it is unit-tested in Node;
 * the dialog itself is in `commands.ts`.
 */

import type { IFlight, IUncheckpointable } from './api';
import { ITrans } from './format';

/** The kernels a refused pause names, or null when the error is another refusal. */
export function uncheckpointableOf(error: unknown): IUncheckpointable[] | null {
  const e = error as {
    status?: number;
    body?: Record<string, unknown> | null;
  } | null;
  if (
    !e ||
    e.status !== 409 ||
    !e.body ||
    e.body.reason !== 'uncheckpointable'
  ) {
    return null;
  }
  const list = e.body.uncheckpointable;
  if (!Array.isArray(list)) {
    return null;
  }
  const kernels = list.filter(
    (k): k is IUncheckpointable =>
      !!k && typeof k === 'object' && typeof k.kernel_id === 'string'
  );
  return kernels.length > 0 ? kernels : null;
}

/** One kernel as the dialog names it: its notebook (or kernel id), kernel, why and a fix. */
export interface ILossLine {
  name: string;
  why: string;
  /** The command that would make it checkpointable (copyable), when there is one. */
  command: string | null;
}

/** What the dialog says. */
export interface ILossDialog {
  title: string;
  intro: string;
  lines: ILossLine[];
  cancel: string;
  accept: string;
}

export function describeLoss(
  kernels: IUncheckpointable[],
  trans: ITrans
): ILossDialog {
  const lines = kernels.map(k => {
    const where = k.path || trans.__('kernel %1', k.kernel_id.slice(0, 8));
    const kernel = k.kernel ? ` (${k.kernel})` : '';
    return {
      name: `${where}${kernel}`,
      why: k.why || trans.__('it cannot be checkpointed'),
      command: k.install_command || null
    };
  });
  return {
    title: trans.__('Pause anyway?'),
    intro: trans._n(
      'The state of this kernel will be lost: it cannot be checkpointed. Its notebook file stays; on resume it starts as a fresh kernel. The other kernels are checkpointed as usual.',
      'The state of these kernels will be lost: they cannot be checkpointed. Their notebook files stay; on resume they start as fresh kernels. The other kernels are checkpointed as usual.',
      kernels.length
    ),
    lines,
    cancel: trans.__('Cancel'),
    accept: trans.__('Pause anyway')
  };
}

/** The parts of the controller and of the dialog that `pauseOrAsk` uses. */
export interface IPauseAnywayDeps {
  pause(loseState?: string[]): Promise<IFlight>;
  /** Show the dialog; true when the person chose "Pause anyway". */
  ask(dialog: ILossDialog): Promise<boolean>;
}

/**
 * Pause; when the server names kernels that would lose their state, ask, and pause again with
 * exactly those kernels allowed (a kernel that appears meanwhile is refused again, and asked
 * about again). Resolves with the flight, or null when the person cancelled; rejects with any
 * other refusal.
 */
export async function pauseOrAsk(
  deps: IPauseAnywayDeps,
  trans: ITrans
): Promise<IFlight | null> {
  let allowed: string[] | undefined;
  for (;;) {
    try {
      return await deps.pause(allowed);
    } catch (error) {
      const kernels = uncheckpointableOf(error);
      if (!kernels) {
        throw error;
      }
      if (!(await deps.ask(describeLoss(kernels, trans)))) {
        return null;
      }
      allowed = Array.from(
        new Set([...(allowed ?? []), ...kernels.map(k => k.kernel_id)])
      );
    }
  }
}
