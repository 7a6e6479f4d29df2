/**
 * Pure view logic: turns the server's `GET status` JSON into what the person sees
 * (status bar label and tooltip, whether the Pause/Resume button is enabled and why not,
 * the grouped resume report). No JupyterLab imports, so it can be unit-tested in Node.
 */

/** Workspace states of the server's lifecycle (contract: `GET status` -> `state`). */
export type WorkspaceState =
  | 'running'
  | 'checkpointing'
  | 'snapshotting'
  | 'releasing'
  | 'paused'
  | 'resuming'
  | 'waiting_for_capacity'
  | 'verifying'
  | 'restoring'
  | 'ready'
  | 'failed';

export type Outcome = 'live' | 'restored' | 'fresh' | 'failed';

export interface IStep {
  name: string;
  done?: number | null;
  total?: number | null;
  message?: string | null;
  unit?: string | null;
}

export interface IFlight {
  id: string;
  kind: 'pause' | 'resume';
  trigger?: string;
  started?: string;
}

export interface IBackendInfo {
  name: string;
  configured: boolean;
  can_pause: boolean;
  why_not?: string | null;
}

export interface IKernelInfo {
  id: string;
  name?: string;
  path?: string | null;
  execution_state?: string | null;
}

export interface ICheckpointSummary {
  id: string;
  created?: string | null;
  bytes_total?: number | null;
  kernels?: number | null;
}

export interface ICellProvenance {
  execution_count?: number | null;
  source?: string | null;
}

export interface IReportVariable {
  name: string;
  kind?: string | null;
  size?: number | null;
  status: 'live' | 'restored' | 'skipped' | 'stale' | 'failed' | 'recomputed' | string;
  reason?: string | null;
  recomputable?: boolean;
  cell?: ICellProvenance | null;
}

export interface IKernelReport {
  path?: string | null;
  kernel_id?: string | null;
  outcome: Outcome | string;
  reason?: string | null;
  checkpoint_id?: string | null;
  variables?: IReportVariable[];
}

export interface IReport {
  flight_id: string;
  outcome: Outcome | string;
  requested?: string | null;
  usable?: string | null;
  durations?: { [key: string]: number };
  kernels?: IKernelReport[];
}

export interface ITimelineEntry {
  event: string;
  at: string;
  [key: string]: unknown;
}

export interface IStatus {
  state: WorkspaceState;
  outcome?: Outcome | null;
  step?: IStep | null;
  reason?: string | null;
  hint?: string | null;
  flight?: IFlight | null;
  timeline?: ITimelineEntry[];
  backend?: IBackendInfo | null;
  kernels?: IKernelInfo[];
  last_checkpoint?: ICheckpointSummary | null;
  last_report?: IReport | null;
  /** True when POST resume would work now (paused, or a failure that left a way back). */
  resume_available?: boolean;
  /** What a resume would restore; `offered` when it is an older checkpoint (a pause failed). */
  resume_from?: IResumeFrom | null;
}

/** The checkpoints a resume restores; `offered` ones are the way back after a failed pause. */
export interface IResumeFrom {
  offered: boolean;
  checkpoints: {
    path?: string | null;
    checkpoint_id?: string | null;
    created?: string | null;
    age_s?: number | null;
  }[];
}

/** "3 minutes", "2 hours", "1 day": how old a checkpoint is. */
export function formatAge(seconds: number | null | undefined, trans: ITrans): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return trans.__('unknown age');
  }
  const units: [number, string, string][] = [
    [86400, '%1 day', '%1 days'],
    [3600, '%1 hour', '%1 hours'],
    [60, '%1 minute', '%1 minutes']
  ];
  for (const [size, one, many] of units) {
    if (seconds >= size) {
      const n = Math.floor(seconds / size);
      return trans._n(one, many, n);
    }
  }
  return trans._n('%1 second', '%1 seconds', Math.max(0, Math.floor(seconds)));
}

/** One line per offered checkpoint: "a.ipynb: checkpoint X (5 minutes old)". */
export function describeOffer(status: IStatus | null, trans: ITrans): string {
  const from = status?.resume_from;
  if (!from || !from.offered || !from.checkpoints.length) {
    return '';
  }
  return from.checkpoints
    .map(c =>
      trans.__(
        '%1: checkpoint %2 (%3 old)',
        c.path || trans.__('a kernel'),
        c.checkpoint_id || '?',
        formatAge(c.age_s, trans)
      )
    )
    .join('; ');
}

/**
 * The subset of JupyterLab's TranslationBundle this module needs. Placeholders are `%1`,
 * `%2`...; in `_n` the count `n` is `%1` and the extra args start at `%2`.
 */
export interface ITrans {
  __(msgid: string, ...args: any[]): string;
  _n(msgid: string, msgidPlural: string, n: number, ...args: any[]): string;
}

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

const PAUSE_FLIGHT: ReadonlySet<string> = new Set(['checkpointing', 'snapshotting', 'releasing']);
const RESUME_FLIGHT: ReadonlySet<string> = new Set([
  'resuming',
  'waiting_for_capacity',
  'verifying',
  'restoring'
]);

/** True while a pause or a resume is in progress (the UI polls faster then). */
export function isFlightActive(status: IStatus | null): boolean {
  return !!status && (PAUSE_FLIGHT.has(status.state) || RESUME_FLIGHT.has(status.state));
}

export function isPausing(status: IStatus | null): boolean {
  return !!status && PAUSE_FLIGHT.has(status.state);
}

export function isResuming(status: IStatus | null): boolean {
  return !!status && RESUME_FLIGHT.has(status.state);
}

/** Human-readable size in binary units: 0 B, 512 B, 1.5 KiB, 12.3 MiB, 1.02 GiB. */
export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !isFinite(n) || n < 0) {
    return '?';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let i = 0;
  while (value >= 1024 && i < units.length - 1) {
    value /= 1024;
    i++;
  }
  if (i === 0) {
    return `${Math.round(value)} B`;
  }
  const digits = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${units[i]}`;
}

/** Human-readable duration: 0.42 s, 3.1 s, 12 s, 2 min 05 s, 1 h 02 min. */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds) || seconds < 0) {
    return '?';
  }
  if (seconds < 1) {
    return `${seconds.toFixed(2)} s`;
  }
  if (seconds < 10) {
    return `${seconds.toFixed(1)} s`;
  }
  if (seconds < 60) {
    return `${Math.round(seconds)} s`;
  }
  const total = Math.round(seconds);
  if (total < 3600) {
    const m = Math.floor(total / 60);
    const s = total % 60;
    return `${m} min ${String(s).padStart(2, '0')} s`;
  }
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  return `${h} h ${String(m).padStart(2, '0')} min`;
}

/** Seconds between two ISO timestamps, or null when either is missing or unparsable. */
export function secondsBetween(from?: string | null, to?: string | null): number | null {
  if (!from || !to) {
    return null;
  }
  const a = Date.parse(from);
  const b = Date.parse(to);
  if (isNaN(a) || isNaN(b)) {
    return null;
  }
  return Math.max(0, (b - a) / 1000);
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
    return { fraction: null, text: done !== null && done > 0 ? formatBytes(done) : '' };
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

/** Local time of an ISO timestamp, short (HH:MM:SS), or the raw string if unparsable. */
export function formatTime(iso: string): string {
  const t = Date.parse(iso);
  if (isNaN(t)) {
    return iso;
  }
  const d = new Date(t);
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** The status bar view of a status (or of a failure to read it). */
export function describeStatus(
  status: IStatus | null,
  error: string | null,
  trans: ITrans
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
  const withProgress = (base: string) => (text ? `${base} ${text}` : base);
  const lines = (...parts: (string | null | undefined)[]) =>
    parts.filter(p => !!p).join('\n');
  const hint = status.hint || '';
  switch (status.state) {
    case 'running':
      return {
        state: 'running',
        label: trans.__('Workspace running'),
        tooltip: lines(
          trans.__('The kernels are running. Pause writes a checkpoint of each kernel and frees the accelerator.'),
          checkpointLine(status, trans)
        ),
        severity: 'idle',
        progress: null
      };
    case 'checkpointing':
      return {
        state: 'checkpointing',
        label: withProgress(trans.__('Checkpointing')),
        tooltip: lines(
          trans.__('Writing a checkpoint of each kernel.'),
          message,
          text ? trans.__('Progress: %1', text) : ''
        ),
        severity: 'busy',
        progress: fraction
      };
    case 'snapshotting':
      return {
        state: 'snapshotting',
        label: trans.__('Snapshotting'),
        tooltip: lines(trans.__('The platform is taking a snapshot of the workspace.'), message),
        severity: 'busy',
        progress: fraction
      };
    case 'releasing':
      return {
        state: 'releasing',
        label: trans.__('Releasing accelerator'),
        tooltip: lines(trans.__('Stopping the kernels to free the accelerator.'), message),
        severity: 'busy',
        progress: fraction
      };
    case 'paused':
      return {
        state: 'paused',
        label: trans.__('Paused'),
        tooltip: lines(
          trans.__('Paused: the accelerator is free. Resume brings the kernels back, live or from the checkpoint.'),
          checkpointLine(status, trans)
        ),
        severity: 'warn',
        progress: null
      };
    case 'resuming':
      return {
        state: 'resuming',
        label: trans.__('Resuming…'),
        tooltip: lines(trans.__('Bringing the compute back.'), message),
        severity: 'busy',
        progress: fraction
      };
    case 'waiting_for_capacity':
      return {
        state: 'waiting_for_capacity',
        label: trans.__('Waiting for capacity'),
        tooltip: lines(
          trans.__('Waiting for an accelerator: %1', status.reason || trans.__('no reason given')),
          hint
        ),
        severity: 'warn',
        progress: null
      };
    case 'verifying':
      return {
        state: 'verifying',
        label: trans.__('Verifying kernels'),
        tooltip: lines(
          trans.__('Checking whether each kernel came back live or must be restored.'),
          message
        ),
        severity: 'busy',
        progress: fraction
      };
    case 'restoring':
      return {
        state: 'restoring',
        label: withProgress(trans.__('Restoring')),
        tooltip: lines(
          trans.__('Restoring variables from the checkpoint.'),
          message,
          text ? trans.__('Progress: %1', text) : ''
        ),
        severity: 'busy',
        progress: fraction
      };
    case 'ready': {
      const outcome = status.outcome || status.last_report?.outcome || 'live';
      const took = reportTotalSeconds(status.last_report ?? null);
      const tookLine =
        took !== null ? trans.__('Resume request to kernel usable: %1.', formatDuration(took)) : '';
      if (outcome === 'restored') {
        return {
          state: 'ready',
          label: trans.__('Restored from checkpoint'),
          tooltip: lines(
            trans.__('The kernels were restarted and restored from the checkpoint. Click for the report.'),
            tookLine
          ),
          severity: 'ok',
          progress: null
        };
      }
      if (outcome === 'fresh') {
        return {
          state: 'ready',
          label: trans.__('Ready (fresh kernel)'),
          tooltip: lines(
            trans.__('The kernels were started fresh: there was no checkpoint to restore. Click for the report.'),
            tookLine
          ),
          severity: 'warn',
          progress: null
        };
      }
      return {
        state: 'ready',
        label: trans.__('Ready (live)'),
        tooltip: lines(
          trans.__('The kernels came back live: nothing had to be restored. Click for the report.'),
          tookLine
        ),
        severity: 'ok',
        progress: null
      };
    }
    case 'failed': {
      const what =
        status.flight?.kind === 'resume' ? trans.__('Resume failed') : trans.__('Pause failed');
      const offer = describeOffer(status, trans);
      return {
        state: 'failed',
        label: what,
        tooltip: lines(
          `${what}: ${status.reason || trans.__('no reason given')}`,
          hint ? trans.__('What to do: %1', hint) : '',
          offer ? trans.__('Resume restores the previous checkpoint: %1', offer) : '',
          trans.__('Click for details.')
        ),
        severity: 'error',
        progress: null
      };
    }
    default:
      return {
        state: 'unknown',
        label: String(status.state),
        tooltip: message,
        severity: 'idle',
        progress: fraction
      };
  }
}

/** Kernels that are running a cell, from the frontend's own view and the server's list. */
export function busyPaths(status: IStatus | null, local: IBusyKernel[]): string[] {
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

/**
 * The Pause/Resume action: which one, whether it can run now, and a tooltip saying why
 * (or why not).
 */
export function describeAction(
  status: IStatus | null,
  error: string | null,
  local: IBusyKernel[],
  pending: boolean,
  trans: ITrans
): IActionView {
  const pause = (enabled: boolean, tooltip: string): IActionView => ({
    mode: 'pause',
    enabled,
    label: trans.__('Pause'),
    tooltip
  });
  const resume = (enabled: boolean, tooltip: string): IActionView => ({
    mode: 'resume',
    enabled,
    label: trans.__('Resume'),
    tooltip
  });
  if (error) {
    return pause(false, trans.__('Pause is unavailable: %1', error));
  }
  if (!status) {
    return pause(false, trans.__('Reading the pause/resume state…'));
  }
  if (PAUSE_FLIGHT.has(status.state)) {
    return pause(false, trans.__('A pause is already running.'));
  }
  if (RESUME_FLIGHT.has(status.state)) {
    return resume(false, trans.__('A resume is already running.'));
  }
  if (status.state === 'paused') {
    return resume(
      !pending,
      pending
        ? trans.__('Sending the request…')
        : trans.__('Resume: bring the kernels back, live if they survived, otherwise restored from the checkpoint.')
    );
  }
  if (status.state === 'failed' && status.resume_available) {
    const offer = describeOffer(status, trans);
    return resume(
      !pending,
      pending
        ? trans.__('Sending the request…')
        : offer
          ? trans.__('Resume: restore the previous checkpoint into fresh kernels (%1).', offer)
          : trans.__(
              'Resume again. The last attempt failed: %1',
              status.reason || trans.__('no reason given')
            )
    );
  }
  if (status.state === 'failed' && status.flight?.kind === 'resume') {
    return resume(
      !pending,
      trans.__('Resume again. The last attempt failed: %1', status.reason || trans.__('no reason given'))
    );
  }
  if (pending) {
    return pause(false, trans.__('Sending the request…'));
  }
  const backend = status.backend;
  if (backend && (!backend.configured || !backend.can_pause)) {
    return pause(
      false,
      trans.__(
        'Pausing is not possible here: %1',
        backend.why_not ||
          (backend.configured
            ? trans.__('the backend cannot pause')
            : trans.__('the backend "%1" is not configured', backend.name))
      )
    );
  }
  const busy = busyPaths(status, local);
  if (busy.length > 0) {
    return pause(
      false,
      trans._n(
        'Cannot pause while a cell is running in %2. Wait for it to finish or interrupt the kernel.',
        'Cannot pause while cells are running in %2. Wait for them to finish or interrupt the kernels.',
        busy.length,
        busy.join(', ')
      )
    );
  }
  return pause(
    true,
    trans.__('Pause: write a checkpoint of every kernel, then free the accelerator.')
  );
}

/** Total seconds from the resume request to a usable kernel. */
export function reportTotalSeconds(report: IReport | null): number | null {
  if (!report) {
    return null;
  }
  const total = report.durations?.['total_s'];
  if (typeof total === 'number') {
    return total;
  }
  return secondsBetween(report.requested, report.usable);
}

export interface IVariableGroups {
  live: IReportVariable[];
  restored: IReportVariable[];
  recomputed: IReportVariable[];
  /** Skipped (or stale) but the cell that made it is known and can be re-run. */
  recomputable: IReportVariable[];
  skipped: IReportVariable[];
  failed: IReportVariable[];
}

export function groupVariables(variables: IReportVariable[] | undefined): IVariableGroups {
  const g: IVariableGroups = {
    live: [],
    restored: [],
    recomputed: [],
    recomputable: [],
    skipped: [],
    failed: []
  };
  for (const v of variables ?? []) {
    switch (v.status) {
      case 'live':
        g.live.push(v);
        break;
      case 'restored':
        g.restored.push(v);
        break;
      case 'recomputed':
        g.recomputed.push(v);
        break;
      case 'failed':
        (v.recomputable ? g.recomputable : g.failed).push(v);
        break;
      default:
        // skipped, stale and anything unknown: not in the namespace now.
        (v.recomputable ? g.recomputable : g.skipped).push(v);
    }
  }
  for (const list of Object.values(g) as IReportVariable[][]) {
    list.sort((a, b) => a.name.localeCompare(b.name));
  }
  return g;
}

/** One line per kernel outcome and for the whole report. */
export function outcomeText(outcome: string | null | undefined, trans: ITrans): string {
  switch (outcome) {
    case 'live':
      return trans.__('came back live');
    case 'restored':
      return trans.__('restored from checkpoint');
    case 'fresh':
      return trans.__('fresh kernel (nothing to restore)');
    case 'failed':
      return trans.__('failed');
    default:
      return String(outcome ?? '?');
  }
}

/** The notification text after a resume. */
export function reportHeadline(report: IReport, trans: ITrans): string {
  let restored = 0;
  let live = 0;
  let missing = 0;
  for (const k of report.kernels ?? []) {
    const g = groupVariables(k.variables);
    restored += g.restored.length + g.recomputed.length;
    live += g.live.length;
    missing += g.skipped.length + g.failed.length + g.recomputable.length;
  }
  const took = reportTotalSeconds(report);
  const tookText = took !== null ? trans.__(' in %1', formatDuration(took)) : '';
  const missingText =
    missing > 0
      ? trans._n(' %1 variable did not come back.', ' %1 variables did not come back.', missing)
      : '';
  switch (report.outcome) {
    case 'restored':
      return (
        trans._n(
          'Resumed%2: restored from checkpoint (%1 variable).',
          'Resumed%2: restored from checkpoint (%1 variables).',
          restored,
          tookText
        ) + missingText
      );
    case 'live':
      return (
        trans._n(
          'Resumed%2: the kernel came back live (%1 variable kept).',
          'Resumed%2: the kernels came back live (%1 variables kept).',
          live,
          tookText
        ) + missingText
      );
    case 'fresh':
      return trans.__('Resumed%1 with a fresh kernel: there was no checkpoint to restore.', tookText);
    case 'failed':
      return trans.__('Resume failed.');
    default:
      return trans.__('Resumed%1.', tookText);
  }
}

/** Report durations as rows in the server's order, then the total (request -> usable). */
export function durationRows(
  report: IReport,
  trans: ITrans
): { label: string; seconds: number }[] {
  const rows: { label: string; seconds: number }[] = [];
  for (const [key, value] of Object.entries(report.durations ?? {})) {
    if (key === 'total_s' || typeof value !== 'number') {
      continue;
    }
    const name = key.replace(/_s$/, '').replace(/_/g, ' ');
    rows.push({ label: name.charAt(0).toUpperCase() + name.slice(1), seconds: value });
  }
  const total = reportTotalSeconds(report);
  if (total !== null) {
    rows.push({ label: trans.__('Resume request → kernel usable'), seconds: total });
  }
  return rows;
}

/**
 * Whether a newly read status carries a resume report not yet announced. `seen` is the
 * flight id of the last report shown (or present at page load, so old reports stay quiet).
 */
export function hasNewReport(seen: string | null, next: IStatus | null): boolean {
  const report = next?.last_report;
  if (!next || !report || (next.state !== 'ready' && next.state !== 'failed')) {
    return false;
  }
  return report.flight_id !== seen;
}

// ---------------------------------------------------------------- auto-pause announcement

/** `GET policy` (the idle policy's auto-pause state); only the fields the UI uses. */
export interface IPolicy {
  enabled: boolean;
  /** disabled | watching | announced | firing | inactive (a flight runs, or paused). */
  state: string;
  profile?: {
    name: string;
    action?: 'pause' | 'stop' | 'none' | string;
    idle_after?: number;
    grace_period?: number;
  } | null;
  deadline?: string | null;
  seconds_left?: number | null;
  cancellable?: boolean;
  last_decision?: { kind: string; reason: string } | null;
}

/** What the auto-pause announcement shows; null when nothing is announced. */
export interface IAutoPauseView {
  /** Identifies one announcement (its deadline): a new one gets a new notification. */
  key: string;
  secondsLeft: number;
  message: string;
}

/** A countdown: 4:59, 0:07, 1:02:03. Rounds up so "0:00" shows only when the time is up. */
export function formatCountdown(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return '?';
  }
  const total = Math.max(0, Math.ceil(seconds));
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = String(total % 60).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${s}` : `${m}:${s}`;
}

/** A rounded idle time for sentences: 45 s, 20 min, 1 h, 1 h 30 min, 2 days. */
export function formatIdleTime(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds) || seconds < 0) {
    return '?';
  }
  if (seconds < 60) {
    return `${Math.round(seconds)} s`;
  }
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  if (minutes >= 48 * 60 && minutes % (24 * 60) === 0) {
    return `${minutes / (24 * 60)} days`;
  }
  const h = Math.floor(minutes / 60);
  const m = minutes % 60;
  return m ? `${h} h ${m} min` : `${h} h`;
}

/**
 * The announcement of an auto-pause, `elapsed` seconds after `policy` was read (the countdown
 * runs on the browser's clock from the server's `seconds_left`, so clock skew does not
 * matter). Null unless an auto-pause is announced and can still be cancelled.
 */
export function describeAutoPause(
  policy: IPolicy | null,
  elapsed: number,
  trans: ITrans
): IAutoPauseView | null {
  if (!policy || !policy.enabled || policy.state !== 'announced' || !policy.cancellable) {
    return null;
  }
  const left = Math.max(0, (policy.seconds_left ?? 0) - Math.max(0, elapsed));
  const countdown = formatCountdown(left);
  const profile = policy.profile?.name ?? '?';
  const idle = formatIdleTime(policy.profile?.idle_after);
  const message =
    policy.profile?.action === 'stop'
      ? trans.__(
          'This workspace will stop its kernels in %1 because it has been idle for %2 (profile %3).',
          countdown,
          idle,
          profile
        )
      : trans.__(
          'This workspace will pause in %1 because it has been idle for %2 (profile %3).',
          countdown,
          idle,
          profile
        );
  return { key: policy.deadline ?? `${profile}:${policy.seconds_left}`, secondsLeft: left, message };
}
