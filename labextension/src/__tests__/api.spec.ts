import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { ServerConnection } from '@jupyterlab/services';

import { PauseAPI } from '../api';

/** A server that takes every request and never answers (until the request is aborted). */
function silentServer(seen: string[]): ServerConnection.ISettings {
  return ServerConnection.makeSettings({
    baseUrl: 'http://127.0.0.1:8888/',
    fetch: ((request: Request) => {
      seen.push(request.url.split('?')[0]); // (a cache-busting query follows)
      return new Promise((_, reject) => {
        request.signal.addEventListener('abort', () =>
          reject(request.signal.reason)
        );
      });
    }) as typeof fetch
  });
}

describe('PauseAPI reads', () => {
  it('fail after their timeout when the server never answers', async () => {
    const seen: string[] = [];
    const api = new PauseAPI(silentServer(seen), 50);
    // AbortSignal.timeout's timer does not keep Node's event loop alive (a browser's does)
    const alive = setInterval(() => undefined, 1000);
    const t0 = Date.now();
    try {
      await assert.rejects(api.status(), ServerConnection.NetworkError);
      await assert.rejects(api.policy(), ServerConnection.NetworkError);
    } finally {
      clearInterval(alive);
    }
    assert.ok(Date.now() - t0 < 3000, `took ${Date.now() - t0} ms`);
    assert.deepEqual(seen, [
      'http://127.0.0.1:8888/jupyter-pause/api/status',
      'http://127.0.0.1:8888/jupyter-pause/api/policy'
    ]);
  });
});
