import { KernelMessage, Kernel } from '@jupyterlab/services';

// A type alias (not an interface) so it counts as JSON for Notification.promise.
export type IMagicResult = {
  ok: boolean;
  /** Everything the magic printed (stdout, stderr, results), progress lines collapsed. */
  output: string;
  /** One line for a notification: the error, or the last line printed. */
  summary: string;
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
          chunks.push(String(content.data['text/plain']) + '\n');
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
  const lines = output.split('\n').filter(l => l.trim());
  const summary = error ?? (lines.length ? lines[lines.length - 1] : '');
  return { ok, output, summary };
}
