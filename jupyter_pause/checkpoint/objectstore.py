"""Object stores (gs://, s3://, any fsspec file system): the memory bound of streamed transfers,
restores by ranges, and clean-up of unfinished uploads. Uploads are :mod:`.uploads`.

Memory: every part is copied into one ``bytes`` charged (with the HTTP client's copies, see
:data:`COPIES`) to a :class:`Budget` shared by the store's uploads and downloads, so at most
``memory`` bytes are in flight in total. S3 sends several parts at once; a GCS resumable upload
is sequential by protocol, so one part is in flight while the next is being filled (and the
writer uploads two blobs at a time). Parallel composite uploads (parts as objects, then compose)
were measured against the emulator: 4.6x slower than fsspec's put_file and over the bound
(gcsfs's one-request upload builds a multipart body: one more copy per part), so they are not
used. Restores fetch ranges concurrently into the one private buffer that is hashed and then
loaded.

Sizes here are parsed by :func:`parse_size` (the checkpoint library depends on nothing else of
the project).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import ctypes
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .errors import CheckpointError, IntegrityError

log = logging.getLogger(__name__)

ENV_MEMORY = "JUPYTER_PAUSE_STORE_MEMORY"
DEFAULT_MEMORY = 256 << 20
S3_MIN_PART = 5 << 20  # S3: every part but the last is at least 5 MiB
GCS_ALIGN = 256 << 10  # GCS resumable: every chunk but the last is a multiple of 256 KiB
PART_MAX = 64 << 20
# New tensors go into packs of at most this much (a larger tensor gets a pack of its own): an
# object is one upload stream (a GCS resumable upload sends its chunks in order), so more,
# smaller objects keep both upload threads busy, a changed tensor later leaves less of an old
# pack half-used, and an interrupted checkpoint leaves fewer bytes to send again. On a local
# disk packs stay large: one file per shard is what the device writes fastest.
PACK_MAX = 128 << 20
# A part in flight costs up to three times its size: ours, and the HTTP client's copies while
# it is sent (aiohttp joins the headers and the body into one buffer on Python < 3.12.9, and
# asyncio's transport keeps a copy of what the socket did not take yet). The bound counts them.
COPIES = 3
MIN_MEMORY = COPIES * S3_MIN_PART + (1 << 20)
ABORT_TIMEOUT = 30.0  # seconds an abort may take before we give up on a dead server


def parse_size(value: str | int) -> int:
    """``268435456``, ``"256M"``, ``"256MiB"``, ``"1G"`` -> bytes (binary units)."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(value), re.IGNORECASE)
    if not m:
        raise CheckpointError(f"invalid size {value!r} (e.g. 256M, 1G, or bytes)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m[2].upper()]
    return int(float(m[1]) * scale)


def memory_bound(value: str | int | None = None) -> int:
    """The memory an object store's uploads and downloads may hold: ``value``, else the
    environment (:data:`ENV_MEMORY`, which the server passes to its kernels), else 256 MiB."""
    raw = value if value is not None else os.environ.get(ENV_MEMORY) or DEFAULT_MEMORY
    n = parse_size(raw)
    if n < MIN_MEMORY:
        raise CheckpointError(
            f"object store memory bound {n} bytes is below the minimum of {MIN_MEMORY >> 20} MiB "
            "(three times S3's 5 MiB smallest part)")
    return n


class Budget:
    """A counting semaphore in bytes: at most ``limit`` bytes held at once (by all threads)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._cv = threading.Condition()

    def acquire(self, n: int) -> int:
        n = min(n, self.limit)  # a part larger than the whole budget waits for all of it
        with self._cv:
            self._cv.wait_for(lambda: self.held + n <= self.limit)
            self.held += n
            self.peak = max(self.peak, self.held)
        return n

    def try_acquire(self, n: int) -> int | None:
        n = min(n, self.limit)
        with self._cv:
            if self.held + n > self.limit:
                return None
            self.held += n
            self.peak = max(self.peak, self.held)
        return n

    def release(self, n: int) -> None:
        with self._cv:
            self.held -= n
            self._cv.notify_all()


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where there is none (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the C library this process already has
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_TRIM = _malloc_trim()


def give_back_freed_memory() -> None:
    """Return the free pages of the C heap to the system after a part's request ended.

    A part and the HTTP client's copies of it are tens of MiB; glibc serves the first from
    mmap, then raises its mmap threshold to that size (up to 32 MiB), so later parts come from
    the per-thread heaps, where freed space stays in the process: over a 4 GiB upload to S3
    that added 40% to the bound (293 MiB of RSS for a 256 MiB bound; 183 MiB with a fixed mmap
    threshold). ``malloc_trim`` releases that space without changing the allocator's settings
    for the rest of the kernel (fixing the threshold would make every large numpy temporary an
    mmap and a page-fault storm).
    """
    if _TRIM is not None:
        _TRIM(0)


def kind(fs: Any) -> str:
    protos = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "s3" in protos or "s3a" in protos:
        return "s3"
    if "gs" in protos or "gcs" in protos:
        return "gcs"
    return "other"


def part_size(fs_kind: str, bound: int) -> int:
    """Parts small enough that several fit in the bound, within each protocol's rules."""
    slots = bound // (4 * COPIES)  # four parts at once: e.g. two uploads, each sending one
    if fs_kind == "s3":
        return max(S3_MIN_PART, min(PART_MAX, slots))
    p = max(GCS_ALIGN, min(PART_MAX, slots))
    return p - p % GCS_ALIGN


def parts(source: Iterable[Any], part: int, budget: Budget) -> Iterator[tuple[bytes, int]]:
    """The bytes of ``source`` cut into ``part``-sized pieces (the last one shorter), each one
    ``bytes`` object (one copy; the HTTP clients slice ``bytes`` without copying). Each is
    charged to ``budget`` (with the client's copies, :data:`COPIES`) before it is made, and the
    consumer owns (releases) that charge."""
    views: list[memoryview] = []
    fill = 0

    def cut() -> tuple[bytes, int]:
        nonlocal views, fill
        held = budget.acquire(fill * COPIES)
        try:
            out = b"".join(views)
        except BaseException:
            budget.release(held)
            raise
        views, fill = [], 0
        return out, held

    for chunk in source:
        mv = memoryview(chunk).cast("B")
        pos = 0
        while pos < len(mv):
            k = min(len(mv) - pos, part - fill)
            views.append(mv[pos : pos + k])
            fill, pos = fill + k, pos + k
            if fill == part:
                yield cut()
    if fill:
        yield cut()


def hash_source(source: Iterable[Any], hasher: Any) -> int:
    """First pass: hash the bytes where they are (no copy); returns the size."""
    n = 0
    for chunk in source:
        mv = memoryview(chunk).cast("B")
        hasher.update(mv)
        n += len(mv)
    return n


def describe(e: BaseException) -> str:
    """One line naming an exception, for messages."""
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300]}" if s else type(e).__name__


def on_loop(fs: Any, coro: Any) -> cf.Future[Any]:
    """Schedule ``coro`` on the file system's event loop thread (fsspec's I/O thread)."""
    return asyncio.run_coroutine_threadsafe(coro, fs.loop)


def download(
    fs: Any,
    path: str,
    size: int,
    hasher: Any,
    into: Any,
    budget: Budget,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Fetch ``path`` into the writable buffer ``into`` (``size`` bytes) by ranges, several in
    flight; hash exactly what lands in ``into``, in order. Returns the bytes received (a short
    object gives fewer; the caller refuses a size mismatch)."""
    mv = memoryview(into)
    part = part_size(kind(fs), budget.limit)
    ranges = [(a, min(size, a + part)) for a in range(0, size, part)]
    is_async = getattr(fs, "async_impl", False) and hasattr(fs, "_cat_file")
    pending: list[tuple[Any, int, int]] = []
    got = 0
    try:
        it = iter(ranges)
        nxt = next(it, None)
        while True:
            # several ranges in flight; block for budget only with none pending (the charges of
            # pending ranges are released by this thread, so waiting then could deadlock)
            while nxt is not None and (
                not pending or (len(pending) + 1) * part * COPIES <= budget.limit // 2
            ):
                want = (nxt[1] - nxt[0]) * COPIES
                held = budget.try_acquire(want) if pending else budget.acquire(want)
                if held is None:
                    break
                r, nxt = nxt, next(it, None)
                try:
                    fut = (on_loop(fs, fs._cat_file(path, start=r[0], end=r[1])) if is_async
                           else _done(fs.cat_file, path, start=r[0], end=r[1]))
                except BaseException:
                    budget.release(held)
                    raise
                pending.append((fut, held, r[0]))
            if not pending:
                break
            fut, held, start = pending.pop(0)
            try:
                data = fut.result()
                n = len(data)
                if start != got or n > size - got:
                    raise IntegrityError(f"{path} is larger than its manifest says")
                mv[got : got + n] = data
                del data
            finally:
                budget.release(held)
            hasher.update(mv[got : got + n])  # the bytes that will be loaded, not a copy
            got += n
            if progress:
                progress(n)
            if n < part and got < size:
                break  # short object: the caller's size check refuses it
    finally:
        for fut, held, _ in pending:
            fut.cancel()
            with contextlib.suppress(BaseException):
                fut.result(timeout=ABORT_TIMEOUT)
            budget.release(held)
    return got


def _done(fn: Callable[..., Any], *a: Any, **kw: Any) -> cf.Future[Any]:
    f: cf.Future[Any] = cf.Future()
    try:
        f.set_result(fn(*a, **kw))
    except BaseException as e:  # noqa: BLE001 - delivered through the future
        f.set_exception(e)
    return f


def abort_stale_uploads(fs: Any, prefix: str, before: float) -> int:
    """S3: abort multipart uploads under ``prefix`` started before ``before`` (epoch seconds),
    i.e. left by a writer that died. Returns how many. Other stores: 0 (nothing to do)."""
    if kind(fs) != "s3":
        return 0
    bucket, key, _ = fs.split_path(prefix)
    out = on_loop(fs, fs._call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key)).result()
    n = 0
    for u in out.get("Uploads", []):
        started = u.get("Initiated")
        if started is not None and started.timestamp() >= before:
            continue
        with contextlib.suppress(Exception):
            on_loop(fs, fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=u["Key"],
                                    UploadId=u["UploadId"])).result(timeout=ABORT_TIMEOUT)
            n += 1
    return n
