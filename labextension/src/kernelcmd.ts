import { KernelMessage, Kernel } from '@jupyterlab/services';

// A type alias (not an interface) so it counts as JSON for Notification.promise.
export type IMagicResult = {
  ok: boolean;
  /** Everything the magic printed (stdout, stderr, results), progress lines collapsed. */
  output: string;
  /** One line for a notification: the error, or the last line printed. */
  summary: string;
  /** The counts at the end of the summary ("3 saved, 1 skipped"), or the whole summary. */
  counts: string;
};

/**
 * Run one of the jupyter_pause line magics (`%checkpoint`, `%restore`) in a kernel without
 * touching the notebook: no history entry, output captured here rather than in a cell.
 */
export async function runMagic(
  kernel: Kernel.IKernelConnection,
  magic: 'checkpoint' | 'restore',
  args = ''
): Promise<IMagicResult> {
  const code =
    "get_ipython().extension_manager.load_extension('jupyter_pause')\n" +
    `get_ipython().run_line_magic(${JSON.stringify(magic)}, ${JSON.stringify(args)});`;
  const future = kernel.requestExecute({
    code,
    silent: false,
    store_history: false,
    allow_stdin: false,
    stop_on_error: false
  });
  const chunks: string[] = [];
  let lastDisplay = '';
  let error: string | null = null;
  future.onIOPub = (msg: KernelMessage.IIOPubMessage) => {
    const content = msg.content as any;
    switch (msg.header.msg_type) {
      case 'stream':
        chunks.push(String(content.text ?? ''));
        break;
      case 'execute_result':
      case 'display_data':
        if (content.data?.['text/plain']) {
          lastDisplay = String(content.data['text/plain']);
          chunks.push(lastDisplay + '\n');
        }
        break;
      case 'error':
        error = `${content.ename}: ${content.evalue}`;
        break;
    }
  };
  const reply = await future.done;
  // Progress bars rewrite their line with \r: keep only the final state of each line.
  const output = chunks
    .join('')
    .split('\n')
    .map(line => line.split('\r').pop() ?? '')
    .join('\n')
    .trim();
  const ok = reply.content.status === 'ok' && error === null;
  // The magics end with a report whose first line is the summary ("Checkpoint … : 3 saved").
  const lines = (lastDisplay || output).split('\n').filter(l => l.trim());
  const summary = error ?? (lastDisplay ? lines[0] : lines[lines.length - 1] ?? '');
  const cut = summary.lastIndexOf(': ');
  const counts = ok && cut >= 0 ? summary.slice(cut + 2) : summary;
  return { ok, output, summary, counts };
}
