/**
 * What the status bar shows for a `GET status` answer: label, tooltip, severity and progress,
 * one small function a state. No JupyterLab imports, so it is unit-tested in Node.
 */

import type { IStatus, IStep, WorkspaceState } from './api';
import {
  formatAge,
  formatBytes,
  formatClock,
  formatDuration,
  formatTime,
  ITrans
} from './format';
import { capitalise, IRestart, offerFor, restartSentence } from './offers';
import { reportTotalSeconds } from './report';
import { PAUSE_STATES, RESUME_STATES } from './vocabulary';

export type Severity = 'idle' | 'busy' | 'ok' | 'warn' | 'error';

/** What the status bar item shows. */
export interface IStatusView {
  state: WorkspaceState | 'unknown' | 'unavailable';
  label: string;
  tooltip: string;
  severity: Severity;
  /** 0..1 when the current step reports a total, else null. */
  progress: number | null;
}

const PAUSE_FLIGHT: ReadonlySet<string> = new Set(PAUSE_STATES);
const RESUME_FLIGHT: ReadonlySet<string> = new Set(RESUME_STATES);

/** True while a pause is in progress. */
export function isPausing(status: IStatus | null): boolean {
  return !!status && PAUSE_FLIGHT.has(status.state);
}

/** True while a resume is in progress. */
export function isResuming(status: IStatus | null): boolean {
  return !!status && RESUME_FLIGHT.has(status.state);
}

/** Whether the server reports an accelerator (a GPU) for this workspace. */
export function hasAccelerator(status: IStatus | null): boolean {
  return (status?.accelerator?.count ?? 0) > 0;
}

/** What a pause frees, in the words of this machine: an accelerator only when there is one. */
export function freedText(status: IStatus | null, trans: ITrans): string {
  return hasAccelerator(status)
    ? trans.__('the kernels are stopped and the accelerator is free')
    : trans.__('the kernels are stopped and their memory is released');
}

/** True while a pause or a resume is in progress (the UI polls faster then). */
export function isFlightActive(status: IStatus | null): boolean {
  return isPausing(status) || isResuming(status);
}

/**
 * Progress of a step: `fraction` in 0..1 (null when unknown) and a short text.
 * Checkpoint and restore steps count bytes; others count items ("2 of 3").
 */
export function stepProgress(
  step: IStep | null | undefined,
  state?: string
): { fraction: number | null; text: string } {
  if (!step) {
    return { fraction: null, text: '' };
  }
  const done = typeof step.done === 'number' ? step.done : null;
  const total = typeof step.total === 'number' ? step.total : null;
  if (done === null || total === null || total <= 0) {
    return {
      fraction: null,
      text: done !== null && done > 0 ? formatBytes(done) : ''
    };
  }
  const fraction = Math.min(1, Math.max(0, done / total));
  const bytes =
    step.unit === 'bytes' ||
    (step.unit == null &&
      (state === 'checkpointing' ||
        state === 'restoring' ||
        /checkpoint|restor|byte/i.test(step.name || '')));
  const text = bytes
    ? `${formatBytes(done)} / ${formatBytes(total)}`
    : `${done} / ${total}`;
  return { fraction, text };
}

/**
 * One line per offered checkpoint: "a.ipynb: the checkpoint of 10:42". Named by its time of
 * day, which reads the same everywhere and at any moment; an age ("5 minutes old") would
 * differ from the one the server's message froze when it was written.
 */
export function describeOffer(status: IStatus | null, trans: ITrans): string {
  const from = status?.resume_from;
  if (!from || !from.offered || !from.checkpoints.length) {
    return '';
  }
  return from.checkpoints
    .map(c =>
      c.created
        ? trans.__(
            '%1: the checkpoint of %2',
            c.path || trans.__('a kernel'),
            formatClock(c.created)
          )
        : trans.__(
            '%1: a checkpoint %2 old',
            c.path || trans.__('a kernel'),
            formatAge(c.age_s, trans)
          )
    )
    .join('; ');
}

function checkpointLine(status: IStatus, trans: ITrans): string {
  const cp = status.last_checkpoint;
  if (!cp) {
    return trans.__('No checkpoint yet.');
  }
  const when = cp.created ? formatTime(cp.created) : '?';
  const size = formatBytes(cp.bytes_total ?? null);
  if (typeof cp.kernels === 'number') {
    return trans._n(
      'Last checkpoint: %2 at %3 (%4, %1 kernel).',
      'Last checkpoint: %2 at %3 (%4, %1 kernels).',
      cp.kernels,
      cp.id,
      when,
      size
    );
  }
  return trans.__('Last checkpoint: %1 at %2 (%3).', cp.id, when, size);
}

/** What every state's view is made from. */
interface IContext {
  status: IStatus;
  trans: ITrans;
  /** The step's progress (see `stepProgress`). */
  fraction: number | null;
  text: string;
  /** The step's message, or ''. */
  message: string;
}

/** Non-empty parts, one a line. */
function lines(...parts: (string | null | undefined)[]): string {
  return parts.filter(p => !!p).join('\n');
}

function view(
  c: IContext,
  label: string,
  tooltip: string,
  severity: Severity,
  progress: number | null = null
): IStatusView {
  return { state: c.status.state, label, tooltip, severity, progress };
}

/** Running or paused: the state and the last checkpoint. */
function settled(
  c: IContext,
  label: string,
  sentence: string,
  severity: Severity
): IStatusView {
  return view(
    c,
    label,
    lines(sentence, checkpointLine(c.status, c.trans)),
    severity
  );
}

/** A step of a pause or resume; `counted` steps show their progress in the label too. */
function inFlight(
  c: IContext,
  label: string,
  sentence: string,
  counted = false
): IStatusView {
  if (!counted) {
    return view(c, label, lines(sentence, c.message), 'busy', c.fraction);
  }
  const progress = c.text ? c.trans.__('Progress: %1', c.text) : '';
  const withText = c.text ? `${label} ${c.text}` : label;
  return view(
    c,
    withText,
    lines(sentence, c.message, progress),
    'busy',
    c.fraction
  );
}

function waiting(c: IContext): IStatusView {
  const { status, trans } = c;
  const reason = status.reason || trans.__('no reason given');
  return view(
    c,
    trans.__('Waiting for capacity'),
    lines(trans.__('Waiting for an accelerator: %1', reason), status.hint),
    'warn'
  );
}

function ready(c: IContext): IStatusView {
  const { status, trans } = c;
  const outcome = status.outcome || status.last_report?.outcome || 'live';
  const took = reportTotalSeconds(status.last_report ?? null);
  const tookLine =
    took !== null
      ? trans.__('Resume request to kernel usable: %1.', formatDuration(took))
      : '';
  if (outcome === 'restored') {
    const sentence = trans.__(
      'The kernels were restarted and restored from the checkpoint. Click for the report.'
    );
    return view(
      c,
      trans.__('Restored from checkpoint'),
      lines(sentence, tookLine),
      'ok'
    );
  }
  if (outcome === 'fresh') {
    const sentence = trans.__(
      'The kernels were started fresh: there was no checkpoint to restore. Click for the report.'
    );
    return view(
      c,
      trans.__('Ready (fresh kernel)'),
      lines(sentence, tookLine),
      'warn'
    );
  }
  const sentence = trans.__(
    'The kernels came back live: nothing had to be restored. Click for the report.'
  );
  return view(c, trans.__('Ready (live)'), lines(sentence, tookLine), 'ok');
}

function failed(c: IContext): IStatusView {
  const { status, trans } = c;
  const what =
    status.flight?.kind === 'resume'
      ? trans.__('Resume failed')
      : trans.__('Pause failed');
  const offer = describeOffer(status, trans);
  const tooltip = lines(
    `${what}: ${status.reason || trans.__('no reason given')}`,
    status.hint ? trans.__('What to do: %1', status.hint) : '',
    offer ? trans.__('Resume restores the previous checkpoint: %1', offer) : '',
    trans.__('Click for details.')
  );
  return view(c, what, tooltip, 'error');
}

/** A step of a pause or resume: its label, a sentence, and whether the label counts. */
type FlightText = (
  trans: ITrans
) => [label: string, sentence: string, counted?: boolean];

const FLIGHT_TEXTS: { [state: string]: FlightText } = {
  checkpointing: t => [
    t.__('Checkpointing'),
    t.__('Writing a checkpoint of each kernel.'),
    true
  ],
  snapshotting: t => [
    t.__('Snapshotting'),
    t.__('The platform is taking a snapshot of the workspace.')
  ],
  releasing: t => [
    t.__('Stopping kernels'),
    t.__('Stopping the kernels to free their memory.')
  ],
  resuming: t => [t.__('Resuming…'), t.__('Bringing the compute back.')],
  verifying: t => [
    t.__('Verifying kernels'),
    t.__('Checking whether each kernel came back live or must be restored.')
  ],
  restoring: t => [
    t.__('Restoring'),
    t.__('Restoring variables from the checkpoint.'),
    true
  ]
};

const flight = (c: IContext) =>
  inFlight(c, ...FLIGHT_TEXTS[c.status.state](c.trans));

/** Releasing, in this machine's words: the accelerator only when the server has one. */
function releasing(c: IContext): IStatusView {
  if (!hasAccelerator(c.status)) {
    return flight(c);
  }
  const { trans } = c;
  return inFlight(
    c,
    trans.__('Releasing accelerator'),
    trans.__('Stopping the kernels to free the accelerator.')
  );
}

/** The server is stopping: it saves each kernel first, restored when it starts again. */
function stopping(c: IContext): IStatusView {
  const { trans } = c;
  return inFlight(
    c,
    trans.__('Server stopping: saving kernels'),
    trans.__(
      'The server is stopping. It saves the state of each kernel first; each notebook gets its variables back when it is opened on the restarted server.'
    )
  );
}

function running(c: IContext): IStatusView {
  const { trans } = c;
  const sentence = hasAccelerator(c.status)
    ? trans.__(
        'The kernels are running. Pause saves the state of each kernel, then stops the kernels to free the accelerator.'
      )
    : trans.__(
        'The kernels are running. Pause saves the state of each kernel, then stops the kernels to free their memory.'
      );
  return settled(c, trans.__('Workspace running'), sentence, 'idle');
}

/** The view of each server state. */
const STATE_VIEWS: { [S in WorkspaceState]: (c: IContext) => IStatusView } = {
  running,
  paused: c =>
    settled(
      c,
      c.trans.__('Paused'),
      c.trans.__(
        'Paused: %1. Resume brings the kernels back, live or from the saved state.',
        freedText(c.status, c.trans)
      ),
      'warn'
    ),
  checkpointing: flight,
  snapshotting: flight,
  releasing,
  resuming: flight,
  waiting_for_capacity: waiting,
  verifying: flight,
  restoring: flight,
  ready,
  failed,
  stopping
};

/**
 * After a kernel restart or death the kernel is empty, whatever the last resume restored:
 * say so, with what can bring its state back. Once a cell ran in the new kernel, the workspace
 * is simply running. Null when no restart applies.
 */
function restartedView(c: IContext, restarts: IRestart[]): IStatusView | null {
  const { status, trans } = c;
  if (status.state !== 'ready' && status.state !== 'running') {
    return null;
  }
  const fresh = restarts.filter(r => !r.used);
  const died = (status.offers ?? []).filter(
    o => !fresh.some(r => r.path === o.path)
  );
  if (!fresh.length && !died.length) {
    return restarts.length ? running(c) : null;
  }
  const checkpointAt = status.last_checkpoint?.created ?? null;
  const items = [
    ...fresh.map(r => ({ path: r.path, offer: offerFor(status, r.path) })),
    ...died.map(o => ({ path: o.path, offer: o }))
  ];
  const sentences = items.map(
    i =>
      `${i.path}: ${restartSentence(i.offer, i.offer ? null : checkpointAt, trans)}`
  );
  const anyDied = items.some(i => i.offer?.cause === 'kernel_died');
  const label = anyDied
    ? trans.__('Kernel died: state gone')
    : trans.__('Kernel restarted: state gone');
  return view(
    c,
    label,
    lines(...sentences, trans.__('Click for details.')),
    'warn'
  );
}

/** The first sentence for one notebook after its kernel restarted (capitalised). */
export function restartLine(
  status: IStatus | null,
  path: string,
  trans: ITrans
): string {
  const offer = offerFor(status, path);
  return capitalise(
    restartSentence(
      offer,
      offer ? null : (status?.last_checkpoint?.created ?? null),
      trans
    )
  );
}

/** The status bar view of a status (or of a failure to read it). */
export function describeStatus(
  status: IStatus | null,
  error: string | null,
  trans: ITrans,
  restarts: IRestart[] = []
): IStatusView {
  if (error) {
    return {
      state: 'unavailable',
      label: trans.__('Pause unavailable'),
      tooltip: trans.__('Cannot read the pause/resume state: %1', error),
      severity: 'error',
      progress: null
    };
  }
  if (!status) {
    return {
      state: 'unknown',
      label: trans.__('Pause: …'),
      tooltip: trans.__('Reading the pause/resume state…'),
      severity: 'idle',
      progress: null
    };
  }
  const { fraction, text } = stepProgress(status.step, status.state);
  const message = status.step?.message || '';
  if (!Object.prototype.hasOwnProperty.call(STATE_VIEWS, status.state)) {
    // A state this page does not know (a newer server).
    const label = String(status.state);
    return {
      state: 'unknown',
      label,
      tooltip: message,
      severity: 'idle',
      progress: fraction
    };
  }
  const c = { status, trans, fraction, text, message };
  return restartedView(c, restarts) ?? STATE_VIEWS[status.state](c);
}

/**
 * The label for Notebook 7's header, next to its "Last Checkpoint: 2 minutes ago" (the file
 * save): the same states, without the word "checkpoint" and with progress in percent.
 */
export function headerLabel(
  view: IStatusView,
  status: IStatus | null,
  trans: ITrans
): string {
  const percent =
    view.progress !== null ? Math.round(view.progress * 100) : null;
  switch (view.state) {
    case 'checkpointing':
      return percent !== null
        ? trans.__('Saving state %1%', percent)
        : trans.__('Saving state');
    case 'restoring':
      return percent !== null
        ? trans.__('Restoring state %1%', percent)
        : trans.__('Restoring state');
    case 'ready':
      return view.label === trans.__('Restored from checkpoint')
        ? trans.__('State restored')
        : view.label;
    default:
      return view.label;
  }
}
