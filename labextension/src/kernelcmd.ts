/**
 * Runs the jupyter_pause line magics (`%checkpoint`, `%restore`) in a kernel for the
 * *Checkpoint Now* and *Restore from Checkpoint* commands. The result comes from structured
 * messages: the reply's status, the `error` message, and the report the magic displays as
 * `REPORT_MIME` JSON. Printed text is only kept to be shown as it is.
 */

import type { Kernel, KernelMessage } from '@jupyterlab/services';

import type { IReportVariable } from './api';

/** The MIME type of the report `%checkpoint` / `%restore` display, next to text and HTML. */
export const REPORT_MIME = 'application/vnd.jupyter-pause.report+json';

/** The report a magic displays (`REPORT_MIME`). */
export interface IMagicReport {
  /** "Checkpoint <id> of <stream>: 3 saved, 1 skipped". */
  title: string;
  /** The counts: "3 saved, 1 skipped". */
  summary: string;
  rows: IReportVariable[];
  notes: string[];
}

/** How a magic run ended. */
export interface IMagicResult {
  ok: boolean;
  /** Everything the magic printed and displayed as text, progress lines collapsed. */
  output: string;
  /** Why it failed (`ename: evalue`), or null. */
  error: string | null;
  /** The report the magic displayed, or null (failed, or a kernel without the MIME type). */
  report: IMagicReport | null;
}

/** The part of a kernel connection `runMagic` uses. */
export type IExecutingKernel = Pick<Kernel.IKernelConnection, 'requestExecute'>;

/** The code that runs one magic without binding a name in the user's namespace. */
export function magicCode(magic: 'checkpoint' | 'restore', args = ''): string {
  return (
    "get_ipython().extension_manager.load_extension('jupyter_pause')\n" +
    `get_ipython().run_line_magic(${JSON.stringify(magic)}, ${JSON.stringify(args)});`
  );
}

/** Progress bars rewrite their line with \r: keep only the final state of each line. */
export function collapseProgress(text: string): string {
  return text
    .split('\n')
    .map(line => line.split('\r').pop() ?? '')
    .join('\n')
    .trim();
}

function isReport(data: unknown): data is IMagicReport {
  const r = data as IMagicReport;
  return (
    !!r &&
    typeof r === 'object' &&
    typeof r.summary === 'string' &&
    Array.isArray(r.rows)
  );
}

/**
 * Run `%<magic> <args>` in `kernel` without touching the notebook: no history entry, output
 * captured here rather than in a cell.
 */
export async function runMagic(
  kernel: IExecutingKernel,
  magic: 'checkpoint' | 'restore',
  args = ''
): Promise<IMagicResult> {
  const future = kernel.requestExecute({
    code: magicCode(magic, args),
    silent: false,
    store_history: false,
    allow_stdin: false,
    stop_on_error: false
  });
  const chunks: string[] = [];
  let report: IMagicReport | null = null;
  let error: string | null = null;
  future.onIOPub = (msg: KernelMessage.IIOPubMessage) => {
    const content = msg.content as any;
    switch (msg.header.msg_type) {
      case 'stream':
        chunks.push(String(content.text ?? ''));
        break;
      case 'execute_result':
      case 'display_data': {
        const data = content.data ?? {};
        if (isReport(data[REPORT_MIME])) {
          report = data[REPORT_MIME];
        }
        if (data['text/plain']) {
          chunks.push(String(data['text/plain']) + '\n');
        }
        break;
      }
      case 'error':
        error = `${content.ename}: ${content.evalue}`;
        break;
    }
  };
  const reply = await future.done;
  if (reply.content.status !== 'ok' && error === null) {
    const content = reply.content as Partial<KernelMessage.IReplyErrorContent>;
    error = `${content.ename ?? 'Error'}: ${content.evalue ?? reply.content.status}`;
  }
  return {
    ok: error === null,
    output: collapseProgress(chunks.join('')),
    error,
    report
  };
}

/**
 * A magic's error in one plain line: "UsageError: %restore failed: no checkpoint for 'a'"
 * becomes "no checkpoint for 'a'". The exception's class and the magic's name say nothing to
 * a person who clicked a menu item; the full text stays behind "Show output".
 */
export function plainError(error: string | null | undefined): string {
  const first = String(error ?? '')
    .split('\n')[0]
    .trim();
  return first
    .replace(/^[A-Za-z_.]*(Error|Exception): /, '')
    .replace(/^%\w+ failed: /, '');
}
