/**
 * Sizes, durations and times as people read them, and the part of JupyterLab's translation
 * bundle the view logic needs. No JupyterLab imports, so it is unit-tested in Node.
 */

/**
 * The subset of JupyterLab's TranslationBundle this extension needs. Placeholders are `%1`,
 * `%2`...; in `_n` the count `n` is `%1` and the extra args start at `%2`.
 */
export interface ITrans {
  __(msgid: string, ...args: any[]): string;
  _n(msgid: string, msgidPlural: string, n: number, ...args: any[]): string;
}

function isNumber(n: number | null | undefined): n is number {
  return n !== null && n !== undefined && isFinite(n);
}

const pad2 = (n: number) => String(n).padStart(2, '0');

/** Human-readable size in binary units: 0 B, 512 B, 1.5 KiB, 12.3 MiB, 1.02 GiB. */
export function formatBytes(n: number | null | undefined): string {
  if (!isNumber(n) || n < 0) {
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
  if (!isNumber(seconds) || seconds < 0) {
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
    return `${Math.floor(total / 60)} min ${pad2(total % 60)} s`;
  }
  return `${Math.floor(total / 3600)} h ${pad2(Math.floor((total % 3600) / 60))} min`;
}

/** A rounded idle time for sentences: 45 s, 20 min, 1 h, 1 h 30 min, 2 days. */
export function formatIdleTime(seconds: number | null | undefined): string {
  if (!isNumber(seconds) || seconds < 0) {
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

/** "3 minutes", "2 hours", "1 day": how old a checkpoint is. */
export function formatAge(
  seconds: number | null | undefined,
  trans: ITrans
): string {
  if (!isNumber(seconds)) {
    return trans.__('unknown age');
  }
  const units: [number, string, string][] = [
    [86400, '%1 day', '%1 days'],
    [3600, '%1 hour', '%1 hours'],
    [60, '%1 minute', '%1 minutes']
  ];
  for (const [size, one, many] of units) {
    if (seconds >= size) {
      return trans._n(one, many, Math.floor(seconds / size));
    }
  }
  return trans._n('%1 second', '%1 seconds', Math.max(0, Math.floor(seconds)));
}

/** Local time of an ISO timestamp, short (HH:MM:SS), or the raw string if unparsable. */
export function formatTime(iso: string): string {
  const t = Date.parse(iso);
  if (isNaN(t)) {
    return iso;
  }
  const d = new Date(t);
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

/** Local time of an ISO timestamp as a person says it (HH:MM), or the raw string. */
export function formatClock(iso: string): string {
  const t = Date.parse(iso);
  if (isNaN(t)) {
    return iso;
  }
  const d = new Date(t);
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
}

/** Seconds between two ISO timestamps, or null when either is missing or unparsable. */
export function secondsBetween(
  from?: string | null,
  to?: string | null
): number | null {
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
