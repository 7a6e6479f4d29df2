/**
 * The resume report as people read it: variables grouped by what happened to them, the
 * headline of the notification, the step timings. No JupyterLab imports, so it is unit-tested
 * in Node.
 */

import type { IKernelReport, IReport, IReportVariable, IStatus } from './api';
import { formatDuration, ITrans, secondsBetween } from './format';

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

/** Statuses of variables that are in the namespace after the resume. */
const BACK: ReadonlySet<string> = new Set(['live', 'restored', 'recomputed']);

/** Whether any variable of the report did not come back. */
export function isIncomplete(report: IReport): boolean {
  return (report.kernels ?? []).some(k =>
    (k.variables ?? []).some(v => !BACK.has(v.status))
  );
}

/** Variables by what happened to them, each group sorted by name. */
export function groupVariables(
  variables: IReportVariable[] | undefined
): IVariableGroups {
  const g: IVariableGroups = {
    live: [],
    restored: [],
    recomputed: [],
    recomputable: [],
    skipped: [],
    failed: []
  };
  for (const v of variables ?? []) {
    if (
      v.status === 'live' ||
      v.status === 'restored' ||
      v.status === 'recomputed'
    ) {
      g[v.status].push(v);
    } else if (v.recomputable) {
      g.recomputable.push(v);
    } else {
      // skipped, stale and anything unknown: not in the namespace now.
      (v.status === 'failed' ? g.failed : g.skipped).push(v);
    }
  }
  for (const list of Object.values(g) as IReportVariable[][]) {
    list.sort((a, b) => a.name.localeCompare(b.name));
  }
  return g;
}

/** One line per kernel outcome and for the whole report. */
export function outcomeText(
  outcome: string | null | undefined,
  trans: ITrans
): string {
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

/**
 * What happened to one notebook's kernel, in the person's words. The mechanism (liveness
 * token, pod snapshot) is the server's `reason`, shown under Details.
 */
export function kernelOutcomeText(
  outcome: string | null | undefined,
  trans: ITrans,
  variables = -1,
  stateNotSaved: string | null = null
): string {
  if (stateNotSaved) {
    // Paused anyway: never "restored", and never "there was no saved state" without why.
    return trans.__(
      'started empty: its state was not saved (%1)',
      stateNotSaved
    );
  }
  switch (outcome) {
    case 'live':
      return trans.__('came back as it was');
    case 'restored':
      return variables === 0
        ? trans.__('a new kernel (it had no variables to restore)')
        : trans.__('its variables were restored into a new kernel');
    case 'fresh':
      return trans.__('started empty: there was no saved state');
    case 'failed':
      return trans.__('could not be brought back');
    default:
      return outcomeText(outcome, trans);
  }
}

/**
 * A kernel's name as a person knows it: a notebook's file name, a console as "Console 1"
 * (JupyterLab names console sessions `console-<n>-<uuid>`).
 */
export function displayName(
  path: string | null | undefined,
  trans: ITrans
): string {
  if (!path) {
    return trans.__('a kernel without a notebook');
  }
  const base = path.split('/').pop() || path;
  const console =
    /^console-(\d+)-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$/i.exec(base);
  return console ? trans.__('Console %1', console[1]) : base;
}

/**
 * The report's kernels in reading order: the notebook the person is looking at first, then
 * the rest (those with variables before those without, each by name), which the dialog folds.
 * Without a current notebook in the report, the first of that order leads.
 */
export function orderKernels(
  kernels: IKernelReport[] | undefined,
  current: string | null | undefined
): { first: IKernelReport[]; rest: IKernelReport[] } {
  const all = [...(kernels ?? [])];
  const weight = (k: IKernelReport) => ((k.variables ?? []).length > 0 ? 0 : 1);
  all.sort(
    (a, b) =>
      weight(a) - weight(b) ||
      String(a.path ?? '').localeCompare(String(b.path ?? ''))
  );
  const at = current ? all.findIndex(k => k.path === current) : -1;
  const lead = at >= 0 ? at : 0;
  return {
    first: all.slice(lead, lead + 1),
    rest: [...all.slice(0, lead), ...all.slice(lead + 1)]
  };
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
  const tookText =
    took !== null ? trans.__(' in %1', formatDuration(took)) : '';
  const missingText =
    missing > 0
      ? trans._n(
          ' %1 variable did not come back.',
          ' %1 variables did not come back.',
          missing
        )
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
      return trans.__(
        'Resumed%1 with a fresh kernel: there was no checkpoint to restore.',
        tookText
      );
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
    rows.push({
      label: name.charAt(0).toUpperCase() + name.slice(1),
      seconds: value
    });
  }
  const total = reportTotalSeconds(report);
  if (total !== null) {
    rows.push({
      label: trans.__('Resume request → kernel usable'),
      seconds: total
    });
  }
  return rows;
}

/**
 * Whether a newly read status carries a resume report not yet announced. `seen` is the
 * flight id of the last report shown (or present at page load, so old reports stay quiet).
 */
export function hasNewReport(
  seen: string | null,
  next: IStatus | null
): boolean {
  const report = next?.last_report;
  if (!next || !report || (next.state !== 'ready' && next.state !== 'failed')) {
    return false;
  }
  return report.flight_id !== seen;
}
