import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  collapseProgress,
  IExecutingKernel,
  REPORT_MIME,
  runMagic
} from '../kernelcmd';

type Msg = { type: string; content: object };

/**
 * A kernel that answers an execute request with the given iopub messages, then the reply.
 * Records the request it got.
 */
function kernel(messages: Msg[], replyStatus = 'ok') {
  const requests: any[] = [];
  const fake = {
    requestExecute(content: any) {
      requests.push(content);
      const future: any = { onIOPub: null };
      future.done = Promise.resolve().then(() => {
        for (const m of messages) {
          future.onIOPub({ header: { msg_type: m.type }, content: m.content });
        }
        return { content: { status: replyStatus } };
      });
      return future;
    }
  };
  return { kernel: fake as unknown as IExecutingKernel, requests };
}

const report = {
  title: 'Checkpoint c1 of a.ipynb: 2 saved, 1 skipped',
  summary: '2 saved, 1 skipped',
  rows: [
    { name: 'x', status: 'saved' },
    { name: 'y', status: 'saved' },
    { name: 'gen', status: 'skipped', reason: 'generators cannot be pickled' }
  ],
  notes: []
};

describe('runMagic', () => {
  it('runs the magic quietly: no history, no stdin, the extension loaded first', async () => {
    const { kernel: k, requests } = kernel([]);
    await runMagic(k, 'restore', '--only x');
    assert.equal(requests.length, 1);
    const r = requests[0];
    assert.equal(r.store_history, false);
    assert.equal(r.allow_stdin, false);
    assert.equal(r.stop_on_error, false);
    assert.match(r.code, /load_extension\('jupyter_pause'\)/);
    assert.match(r.code, /run_line_magic\("restore", "--only x"\)/);
  });

  it('takes the result from the displayed report, not from the printed text', async () => {
    const { kernel: k } = kernel([
      {
        type: 'stream',
        content: {
          name: 'stdout',
          text: 'Checkpointing: 1 MiB\rCheckpointing: 2 MiB\n'
        }
      },
      {
        type: 'display_data',
        content: {
          data: {
            'text/plain': 'something else: 9 failed',
            [REPORT_MIME]: report
          }
        }
      }
    ]);
    const result = await runMagic(k, 'checkpoint');
    assert.equal(result.ok, true);
    assert.equal(result.error, null);
    assert.equal(result.report?.summary, '2 saved, 1 skipped');
    assert.deepEqual(
      result.report?.rows.map(r => r.name),
      ['x', 'y', 'gen']
    );
    // The text is kept to be shown as it is, progress lines collapsed.
    assert.equal(
      result.output,
      'Checkpointing: 2 MiB\nsomething else: 9 failed'
    );
  });

  it('says why it failed from the error message', async () => {
    const { kernel: k } = kernel(
      [
        {
          type: 'error',
          content: {
            ename: 'UsageError',
            evalue: '%restore failed: no checkpoint'
          }
        }
      ],
      'error'
    );
    const result = await runMagic(k, 'restore');
    assert.equal(result.ok, false);
    assert.equal(result.error, 'UsageError: %restore failed: no checkpoint');
    assert.equal(result.report, null);
  });

  it('fails when the reply is an error even without an error message', async () => {
    const { kernel: k } = kernel([], 'aborted');
    const result = await runMagic(k, 'checkpoint');
    assert.equal(result.ok, false);
    assert.match(result.error ?? '', /aborted/);
  });

  it('succeeds without a report from a kernel that displays none', async () => {
    const { kernel: k } = kernel([
      {
        type: 'display_data',
        content: { data: { 'text/plain': 'Checkpoint c1 of a.ipynb: 1 saved' } }
      }
    ]);
    const result = await runMagic(k, 'checkpoint');
    assert.equal(result.ok, true);
    assert.equal(result.report, null);
    assert.equal(result.output, 'Checkpoint c1 of a.ipynb: 1 saved');
  });

  it('ignores a malformed report', async () => {
    const { kernel: k } = kernel([
      {
        type: 'display_data',
        content: { data: { [REPORT_MIME]: { title: 'x' } } }
      }
    ]);
    assert.equal((await runMagic(k, 'checkpoint')).report, null);
  });
});

describe('collapseProgress', () => {
  it('keeps the last state of each rewritten line', () => {
    assert.equal(
      collapseProgress('a 10%\ra 50%\ra 100%\nnext\n'),
      'a 100%\nnext'
    );
    assert.equal(collapseProgress(''), '');
  });
});
