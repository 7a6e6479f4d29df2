"""Uploading a blob to an object store, streamed in parts with bounded memory, whatever its size.

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
AbortIncompleteMultipartUpload rule (or :func:`.collect.gc`) removes them; GCS drops an
unfinished resumable session after a week. The memory bound is :mod:`.objectstore`'s.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import Any

from .errors import CheckpointError
from .objectstore import (
    ABORT_TIMEOUT,
    Budget,
    describe,
    give_back_freed_memory,
    kind,
    on_loop,
    part_size,
    parts,
)


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
        for buf, held in parts(source(), part, budget):
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
            f"{_mib(sent)}: {describe(e)}; {tail}; earlier checkpoints are intact"
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


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _url(fs: Any, path: str) -> str:
    try:
        return str(fs.unstrip_protocol(path))
    except Exception:  # noqa: BLE001 - only for a message
        return path


class _Upload:
    """One streamed upload: ``send`` parts in order, ``wait``, then ``commit``. ``abort``
    returns None when nothing is left behind, else why it could not clean up. A part's budget
    charge is released when its request ends, from the event loop's thread."""

    def __init__(self, fs: Any, path: str, size: int, budget: Budget) -> None:
        self.fs, self.path, self.size, self.budget = fs, path, size, budget
        self.inflight: list[cf.Future[Any]] = []
        self.began = False  # a request that may have left something on the server was sent

    def _track(self, fut: cf.Future[Any], held: int) -> None:
        def ended(_f: cf.Future[Any]) -> None:
            self.budget.release(held)
            give_back_freed_memory()  # the part and the client's copies of it are freed now

        fut.add_done_callback(ended)
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

    def _call(self, method: str, **kw: Any) -> cf.Future[Any]:
        return on_loop(self.fs, self.fs._call_s3(method, Bucket=self.bucket, Key=self.key, **kw))

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
                fut.add_done_callback(functools.partial(self._record, n))
        except BaseException:
            self.budget.release(held)
            raise
        self._track(fut, held)
        self._reap(keep=len(self.inflight))  # surface a failed part early, never block here

    def _record(self, n: int, f: cf.Future[Any]) -> None:
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
            return describe(e)
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
                fut = on_loop(self.fs, simple_upload(self.fs, self.bucket, self.key, buf))
            else:
                self._reap(0)  # each chunk must follow the previous one
                if self.location is None:
                    self.location = on_loop(
                        self.fs, initiate_upload(self.fs, self.bucket, self.key)).result()
                    self.began = True
                fut = on_loop(self.fs, upload_chunk(self.fs, self.location, buf, self.offset,
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
            status = on_loop(self.fs, _cancel_resumable(self.fs, loc)).result(
                timeout=ABORT_TIMEOUT)
        except BaseException as e:  # noqa: BLE001 - the server may be gone
            return describe(e)
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
        return int(r.status)


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
            return describe(e)
        finally:
            f.closed = True  # a failed flush must not be retried at interpreter exit
        with contextlib.suppress(Exception):
            self.fs.rm_file(self.path)
        return None
