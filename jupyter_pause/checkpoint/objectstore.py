"""Blobs to and from object stores (gs://, s3://, any fsspec file system), streamed in parts with
memory bounded by a setting, whatever the blob's size.

Naming: a blob's name is its digest, which must be known before the upload starts. Its bytes are
already in memory (tensor storages, numpy buffers, pickle streams), so a first pass hashes them
in place (blake3, several GB/s: a fraction of any upload) and the upload then goes straight to
the final name. The alternative (upload to a temporary key, then a server-side copy to the
digest's name) uploads blobs the store already has (no dedup for incremental checkpoints), pays a
copy of every byte on the server (S3 copies above 5 GB need a multipart copy), and leaves a
visible temporary object behind on a crash. The upload hashes again what it sends and commits
only if both digests agree: memory changed in between (a thread still training) aborts the blob
instead of storing bytes under a name that is not theirs.

Atomicity: an S3 multipart upload or a GCS resumable upload becomes visible only when it
completes; an interrupted one is aborted (its parts deleted). If the server cannot be reached to
abort it, nothing is visible either: S3 keeps the parts until the bucket's
AbortIncompleteMultipartUpload rule (or :meth:`Store.collect`) removes them; GCS drops an
unfinished resumable session after a week.

Memory: every part is copied into one ``bytes`` charged (with the HTTP client's copies, see
:data:`COPIES`) to a :class:`Budget` shared by the store's uploads and downloads, so at most
``memory`` bytes are in flight in total. S3 sends several parts at once; a GCS resumable upload
is sequential by protocol, so one part is in flight while the next is being filled (and the
writer uploads two blobs at a time). Parallel composite uploads (parts as objects, then compose)
were measured against the emulator: 4.6x slower than fsspec's put_file and over the bound
(gcsfs's one-request upload builds a multipart body: one more copy per part), so they are not
used. Restores fetch ranges concurrently into the one private buffer that is hashed and then
loaded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import logging
import os
import re
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


def _parts(source: Iterable[Any], part: int, budget: Budget) -> Iterator[tuple[bytes, int]]:
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


class UploadFailed(CheckpointError):
    """An upload did not complete; nothing of it is visible under the blob's name."""


def upload(
    fs: Any,
    path: str,
    source: Callable[[], Iterable[Any]],
    size: int,
    digest: str,
    hasher: Any,
    budget: Budget,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Stream ``source()`` to ``path`` and commit it only if its digest is ``digest``."""
    k = kind(fs)
    part = part_size(k, budget.limit)
    up = {"s3": _S3Upload, "gcs": _GcsUpload}.get(k, _FileUpload)(fs, path, size, budget)
    sent = 0
    try:
        for buf, held in _parts(source(), part, budget):
            hasher.update(buf)  # what is sent is what is named
            if sent + len(buf) >= size:
                # the last part: check before sending it, since a single PUT or a resumable
                # upload's last chunk commits the object
                _check(hasher, digest, sent + len(buf), size, budget, held)
            up.send(buf, held)
            sent += len(buf)
            if progress:
                progress(len(buf))
        _check(hasher, digest, sent, size)
        up.wait()
        if size == 0:
            fs.pipe_file(path, b"")
        up.commit()
    except BaseException as e:
        aborted = up.abort()
        if isinstance(e, UploadFailed):
            raise
        if not up.began:
            tail = "nothing of it reached the store"
        elif aborted is None:
            tail = "the partial upload was aborted"
        else:
            tail = f"the partial upload could not be aborted ({aborted}): {up.leftover_note()}"
        raise UploadFailed(
            f"uploading blob {digest[:12]} ({_mib(size)}) to {_url(fs, path)} failed after "
            f"{_mib(sent)}: {_describe(e)}; {tail}; earlier checkpoints are intact"
        ) from None
    finally:
        up.close()


def _check(hasher: Any, digest: str, n: int, size: int, budget: Budget | None = None,
           held: int = 0) -> None:
    if n != size or hasher.hexdigest() != digest:
        if budget is not None:
            budget.release(held)  # the part that will not be sent
        raise UploadFailed(
            f"blob {digest[:12]} changed while it was being uploaded (is a thread still "
            "modifying the data?); the upload was aborted"
        )


def _describe(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300]}" if s else type(e).__name__


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _url(fs: Any, path: str) -> str:
    try:
        return fs.unstrip_protocol(path)
    except Exception:  # noqa: BLE001 - only for a message
        return path


def _run(fs: Any, coro: Any) -> cf.Future:
    """Schedule ``coro`` on the file system's event loop thread (fsspec's I/O thread)."""
    return asyncio.run_coroutine_threadsafe(coro, fs.loop)


class _Upload:
    """One streamed upload: ``send`` parts in order, ``wait``, then ``commit``. ``abort``
    returns None when nothing is left behind, else why it could not clean up. A part's budget
    charge is released when its request ends, from the event loop's thread."""

    def __init__(self, fs: Any, path: str, size: int, budget: Budget) -> None:
        self.fs, self.path, self.size, self.budget = fs, path, size, budget
        self.inflight: list[cf.Future] = []
        self.began = False  # a request that may have left something on the server was sent

    def _track(self, fut: cf.Future, held: int) -> None:
        fut.add_done_callback(lambda _f: self.budget.release(held))
        self.inflight.append(fut)

    def _reap(self, keep: int) -> None:
        """Raise the first failure; wait until at most ``keep`` requests are in flight."""
        while self.inflight and (len(self.inflight) > keep or self.inflight[0].done()):
            self.inflight.pop(0).result()

    def send(self, buf: bytes, held: int) -> None:
        raise NotImplementedError

    def wait(self) -> None:
        self._reap(0)

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> str | None:
        return None

    def leftover_note(self) -> str:
        return "nothing is visible under the blob's name"

    def close(self) -> None:
        for f in self.inflight:
            f.cancel()
        for f in self.inflight:
            with contextlib.suppress(BaseException):
                f.result(timeout=ABORT_TIMEOUT)
        self.inflight.clear()


class _S3Upload(_Upload):
    """A multipart upload with as many parts in flight as the budget allows (one PUT when the
    blob fits one part)."""

    def __init__(self, fs: Any, path: str, size: int, budget: Budget) -> None:
        super().__init__(fs, path, size, budget)
        self.bucket, self.key, _ = fs.split_path(path)
        self.mpu: str | None = None
        self.next_part = 1
        self.etags: dict[int, str] = {}

    def _call(self, method: str, **kw: Any) -> cf.Future:
        return _run(self.fs, self.fs._call_s3(method, Bucket=self.bucket, Key=self.key, **kw))

    def send(self, buf: bytes, held: int) -> None:
        try:
            if self.mpu is None and len(buf) >= self.size:
                fut = self._call("put_object", Body=buf)  # the whole blob in one request
            else:
                if self.mpu is None:
                    self.mpu = self._call("create_multipart_upload").result()["UploadId"]
                    self.began = True
                n, self.next_part = self.next_part, self.next_part + 1
                fut = self._call("upload_part", PartNumber=n, UploadId=self.mpu, Body=buf)
                fut.add_done_callback(lambda f, n=n: self._record(n, f))
        except BaseException:
            self.budget.release(held)
            raise
        self._track(fut, held)
        self._reap(keep=len(self.inflight))  # surface a failed part early, never block here

    def _record(self, n: int, f: cf.Future) -> None:
        if not f.cancelled() and f.exception() is None:
            self.etags[n] = f.result()["ETag"]

    def commit(self) -> None:
        if self.mpu is None:
            return  # the single PUT (or nothing, for an empty blob) is done
        parts = [{"PartNumber": n, "ETag": e} for n, e in sorted(self.etags.items())]
        self._call("complete_multipart_upload", UploadId=self.mpu,
                   MultipartUpload={"Parts": parts}).result()
        self.mpu = None

    def abort(self) -> str | None:
        if self.mpu is None:
            return None
        mpu, self.mpu = self.mpu, None
        for f in self.inflight:
            f.cancel()
        try:
            self._call("abort_multipart_upload", UploadId=mpu).result(timeout=ABORT_TIMEOUT)
        except BaseException as e:  # noqa: BLE001 - the server may be gone
            return _describe(e)
        return None

    def leftover_note(self) -> str:
        return ("its parts stay invisible until the bucket's AbortIncompleteMultipartUpload "
                "lifecycle rule or the next `jupyter pause gc` removes them")


class _GcsUpload(_Upload):
    """A resumable upload: chunks go in order (the protocol allows one in flight); the next
    part is filled while the previous one is sent."""

    def __init__(self, fs: Any, path: str, size: int, budget: Budget) -> None:
        super().__init__(fs, path, size, budget)
        self.bucket, self.key = fs.split_path(path)[:2]
        self.location: str | None = None
        self.offset = 0

    def send(self, buf: bytes, held: int) -> None:
        from gcsfs.core import initiate_upload, simple_upload, upload_chunk

        try:
            if self.location is None and len(buf) >= self.size:
                fut = _run(self.fs, simple_upload(self.fs, self.bucket, self.key, buf))
            else:
                self._reap(0)  # each chunk must follow the previous one
                if self.location is None:
                    self.location = _run(
                        self.fs, initiate_upload(self.fs, self.bucket, self.key)).result()
                    self.began = True
                fut = _run(self.fs, upload_chunk(self.fs, self.location, buf, self.offset,
                                                 self.size, "application/octet-stream"))
                self.offset += len(buf)
        except BaseException:
            self.budget.release(held)
            raise
        self._track(fut, held)

    def commit(self) -> None:
        self.location = None  # the last chunk (Content-Range total = size) finalized the object

    def abort(self) -> str | None:
        if self.location is None:
            return None
        for f in self.inflight:
            f.cancel()
        loc, self.location = self.location, None
        try:
            status = _run(self.fs, _cancel_resumable(self.fs, loc)).result(timeout=ABORT_TIMEOUT)
        except BaseException as e:  # noqa: BLE001 - the server may be gone
            return _describe(e)
        # 499 is GCS's "upload cancelled"; 404/410: already gone
        return None if status in (200, 204, 404, 410, 499) else f"HTTP {status}"

    def leftover_note(self) -> str:
        return "GCS drops an unfinished resumable upload after a week; nothing is visible"


async def _cancel_resumable(fs: Any, location: str) -> int:
    """One DELETE of a resumable session, without gcsfs's retries (a minute of back-off
    against a dead server or one that does not implement cancelling)."""
    await fs._set_session()
    async with fs.session.request("DELETE", location, headers=fs._get_headers(None),
                                  timeout=fs.requests_timeout) as r:
        await r.read()
        return r.status


class _FileUpload(_Upload):
    """Any other fsspec file system: its own buffered file, written part by part."""

    def __init__(self, fs: Any, path: str, size: int, budget: Budget) -> None:
        super().__init__(fs, path, size, budget)
        self.f: Any = None

    def send(self, buf: bytes, held: int) -> None:
        try:
            if self.f is None:
                self.f = self.fs.open(self.path, "wb")
                self.began = True
            self.f.write(buf)
        finally:
            self.budget.release(held)

    def commit(self) -> None:
        if self.f is None:
            self.fs.pipe_file(self.path, b"")
            return
        f, self.f = self.f, None
        f.close()

    def abort(self) -> str | None:
        f, self.f = self.f, None
        if f is None:
            return None
        try:
            if hasattr(f, "discard"):
                f.discard()
        except BaseException as e:  # noqa: BLE001
            return _describe(e)
        finally:
            f.closed = True  # a failed flush must not be retried at interpreter exit
        with contextlib.suppress(Exception):
            self.fs.rm_file(self.path)
        return None


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
                    fut = (_run(fs, fs._cat_file(path, start=r[0], end=r[1])) if is_async
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


def _done(fn: Callable[..., Any], *a: Any, **kw: Any) -> cf.Future:
    f: cf.Future = cf.Future()
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
    out = _run(fs, fs._call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key)).result()
    n = 0
    for u in out.get("Uploads", []):
        started = u.get("Initiated")
        if started is not None and started.timestamp() >= before:
            continue
        with contextlib.suppress(Exception):
            _run(fs, fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=u["Key"],
                                 UploadId=u["UploadId"])).result(timeout=ABORT_TIMEOUT)
            n += 1
    return n
