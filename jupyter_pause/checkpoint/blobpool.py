"""The blob writes of one checkpoint: two at a time, deduplicated, with progress reports."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .cache import WriteCache
from .store import Store, Txn

log = logging.getLogger(__name__)


class BlobPool:
    """The blobs of one write: a 2-thread pool that writes them, the progress counters, and
    what the manifest's ``blobs`` will list."""

    def __init__(
        self,
        store: Store,
        txn: Txn,
        cache: WriteCache | None,
        progress: Callable[[int, int], None] | None,
        estimate: int,
    ) -> None:
        self.store, self.txn, self.cache = store, txn, cache
        self.pool = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="jp-ckpt")
        self.futures: list[cf.Future[Any]] = []
        self.progress = progress
        self.done = 0
        self.known = 0
        self.estimate = estimate
        self.lock = threading.Lock()
        self.last_report = 0.0
        self.blobs: dict[str, dict[str, Any]] = {}
        self.new_chunks: dict[str, tuple[str, int]] = {}
        self.exists: dict[str, bool] = {}

    # progress ------------------------------------------------------------------------------
    def add_done(self, n: int) -> None:
        with self.lock:
            self.done += n

    def report(self, force: bool = False) -> None:
        if not self.progress:
            return
        now = time.monotonic()
        if not force and now - self.last_report < 0.1:
            return
        self.last_report = now
        total = max(self.known, self.estimate, self.done)
        try:
            self.progress(min(self.done, total), total)
        except Exception:  # a broken progress display must not fail a checkpoint
            log.warning("progress callback failed; no more progress reports", exc_info=True)
            self.progress = None

    # blobs ---------------------------------------------------------------------------------
    def has(self, digest: str) -> bool:
        ok = self.exists.get(digest)
        if ok is None:
            ok = self.exists[digest] = self.store.claim_blob(digest)
        return ok

    def put(
        self, chunks: Iterable[Any] | Callable[[], Iterable[Any]], kind: str, size: int, cached: bool = True
    ) -> cf.Future[Any]:
        """Write a blob in the pool; the future gives its digest. With a cache (and ``cached``),
        bytes the previous checkpoint already stored are not written again."""
        self.known += size

        def job() -> str:
            x = None
            if cached and self.cache is not None:
                import xxhash  # only with a change-detection cache

                h = xxhash.xxh3_128()
                for c in chunks() if callable(chunks) else chunks:  # a source is read again below
                    h.update(c)
                x = h.hexdigest()
                hit = self.cache.chunks.get(x)
                if hit and hit[1] == size and self.has(hit[0]):
                    self.new_chunks[x] = hit
                    self.blobs[hit[0]] = {"size": size, "kind": kind}
                    self.add_done(size)
                    return hit[0]
            digest, n = self.store.put_blob(self.txn, chunks, self.add_done, size)
            self.exists[digest] = True
            self.blobs[digest] = {"size": n, "kind": kind}
            if x is not None:
                self.new_chunks[x] = (digest, n)
            return digest

        f = self.pool.submit(job)
        self.futures.append(f)
        return f

    def wait(self) -> None:
        pending = set(self.futures)
        while pending:
            done, pending = cf.wait(pending, timeout=0.1, return_when=cf.FIRST_EXCEPTION)
            for f in done:
                f.result()  # raise the first failure
            self.report()
        self.report(force=True)

    def shutdown(self) -> None:
        for f in self.futures:
            f.cancel()
        self.pool.shutdown(wait=True)
