"""Where checkpoints live: a local directory (default) or any fsspec URL.

Layout under the root::

    blobs/<2 hex>/<digest>          immutable, content-addressed (blake3)
    manifests/<stream-slug>/<id>.json   one signed manifest per checkpoint, written last
    tmp/                            in-flight temp files and leases of running writes

Local writes go to ``tmp/`` first, are fsync'd and renamed into place, and the directories are
fsync'd before the manifest is published, so a crash at any moment leaves only unreferenced temp
files or blobs behind: never a manifest that points at missing or partial data.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from .errors import CheckpointError, IntegrityError, NotFoundError, StorageFullError
from .keys import jupyter_data_dir
from .manifest import Manifest, parse, verify

CHUNK = 16 << 20
_FADVISE = hasattr(os, "posix_fadvise") and sys.platform.startswith("linux")
LEASE_MAX_AGE = 6 * 3600.0
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def default_store_url() -> str:
    return os.path.join(jupyter_data_dir(), "jupyter-pause", "checkpoints")


def stream_slug(stream: str) -> str:
    """A directory name for a stream: readable, collision-free (short hash of the full name)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", stream).strip("._")[-60:] or "stream"
    return f"{readable}-{hashlib.sha256(stream.encode()).hexdigest()[:8]}"


def _hasher() -> Any:
    import blake3

    return blake3.blake3(max_threads=blake3.blake3.AUTO)


def is_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _FULL_ERRNOS


class Txn:
    """Bookkeeping of one write: temp files and newly created blobs, removed again on abort."""

    def __init__(self, store: Store, checkpoint_id: str) -> None:
        self.store = store
        self.id = checkpoint_id
        self.temps: set[str] = set()
        self.created: set[str] = set()  # digests this write added to the store
        self.dirs: set[str] = set()
        self.bytes_written = 0
        self.lease: str | None = None

    def abort(self) -> None:
        for p in list(self.temps):
            self.store._remove(p)
        for d in list(self.created):
            self.store._remove(self.store.blob_path(d))
        self.release()

    def release(self) -> None:
        if self.lease:
            self.store._remove(self.lease)
            self.lease = None


class Store:
    """A checkpoint store. Use :func:`open_store` to make one."""

    def __init__(self, url: str, key: bytes | None = None) -> None:
        self.url = url
        self.key = key
        if "://" in url and not url.startswith("file://"):
            import fsspec

            self.fs, self.root = fsspec.core.url_to_fs(url)
            self.local = False
            self.root = self.root.rstrip("/")
        else:
            path = url.removeprefix("file://")
            self.fs = None
            self.root = os.path.abspath(os.path.expanduser(path))
            self.local = True

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # -- paths ---------------------------------------------------------------------------------
    def _join(self, *parts: str) -> str:
        return (os.path.join if self.local else lambda *p: "/".join(p))(self.root, *parts)

    def blob_path(self, digest: str) -> str:
        return self._join("blobs", digest[:2], digest)

    def manifest_path(self, stream: str, checkpoint_id: str) -> str:
        return self._join("manifests", stream_slug(stream), f"{checkpoint_id}.json")

    # -- small fs helpers ----------------------------------------------------------------------
    def _remove(self, path: str) -> None:
        try:
            if self.local:
                os.unlink(path)
            else:
                self.fs.rm_file(path)
        except (FileNotFoundError, OSError):
            pass

    def _exists(self, path: str) -> bool:
        return os.path.exists(path) if self.local else self.fs.exists(path)

    def _ls(self, path: str) -> list[str]:
        """Entry names (not paths) directly under ``path``; [] when missing."""
        try:
            if self.local:
                return sorted(os.listdir(path))
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _mtime(self, path: str) -> float:
        try:
            if self.local:
                return os.stat(path).st_mtime
            info = self.fs.info(path)
            for k in ("mtime", "LastModified", "updated", "created"):
                v = info.get(k)
                if isinstance(v, (int, float)):
                    return float(v)
                if hasattr(v, "timestamp"):
                    return v.timestamp()
        except (FileNotFoundError, OSError):
            pass
        return 0.0

    def _fsync_dir(self, path: str) -> None:
        if os.name == "nt":  # directories cannot be opened for fsync there
            return
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _makedirs(self, path: str) -> None:
        if self.local:
            os.makedirs(path, mode=0o700, exist_ok=True)  # checkpoints hold the user's data
        else:
            self.fs.makedirs(path, exist_ok=True)

    # -- writing -------------------------------------------------------------------------------
    def begin(self, checkpoint_id: str) -> Txn:
        txn = Txn(self, checkpoint_id)
        tmpdir = self._join("tmp")
        try:
            self._makedirs(tmpdir)
            lease = self._join("tmp", f"{checkpoint_id}.lease")
            info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
            self._write_small(lease, json.dumps(info).encode(), durable=False)
            txn.lease = lease
        except OSError as e:
            raise self._os_error(e, "starting a checkpoint") from None
        return txn

    def _os_error(self, e: OSError, what: str) -> CheckpointError:
        if is_full(e):
            return StorageFullError(
                f"no space left in checkpoint store {self.url} while {what}; "
                "the partial checkpoint was removed and earlier checkpoints are intact"
            )
        return CheckpointError(f"checkpoint store {self.url}: {what} failed: {e.strerror or e}")

    def _write_small(self, path: str, data: bytes, durable: bool = True) -> None:
        if self.local:
            tmp = f"{path}.{secrets.token_hex(4)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, memoryview(data))
                if durable:
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                self._remove(tmp)
                raise
            os.close(fd)
            os.replace(tmp, path)
        else:
            with self.fs.open(path, "wb") as f:
                f.write(data)

    def has_blob(self, digest: str) -> bool:
        return self._exists(self.blob_path(digest))

    def claim_blob(self, digest: str) -> bool:
        """True if the blob exists; locally also refresh its mtime, so a concurrent gc (which
        spares blobs newer than a running write's lease) cannot remove it while this write is
        about to reference it."""
        if not self.local:
            return self.has_blob(digest)
        try:
            os.utime(self.blob_path(digest))
            return True
        except FileNotFoundError:
            return False
        except OSError:
            return self.has_blob(digest)

    def put_blob(
        self,
        txn: Txn,
        chunks: Iterable[memoryview | bytes],
        progress: Callable[[int], None] | None = None,
    ) -> tuple[str, int]:
        """Store the concatenation of ``chunks``; return (digest, size).

        Local: one pass that hashes while it writes to a temp file, then fsync + rename. A blob
        that already exists is not written twice (content addressing).
        """
        try:
            if self.local:
                return self._put_local(txn, chunks, progress)
            return self._put_remote(txn, list(chunks), progress)
        except OSError as e:
            raise self._os_error(e, "writing a blob") from None

    def _put_local(self, txn: Txn, chunks: Iterable, progress: Callable | None) -> tuple[str, int]:
        tmp = self._join("tmp", f"{txn.id}-{secrets.token_hex(6)}.part")
        txn.temps.add(tmp)
        h = _hasher()
        size = 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for chunk in chunks:
                mv = memoryview(chunk).cast("B")
                for i in range(0, len(mv), CHUNK):
                    piece = mv[i : i + CHUNK]
                    h.update(piece)
                    _write_all(fd, piece)
                    _write_behind(fd, size, len(piece))
                    size += len(piece)
                    txn.bytes_written += len(piece)
                    if progress:
                        progress(len(piece))
            os.fsync(fd)
            _drop_cached(fd)
        finally:
            os.close(fd)
        digest = h.hexdigest()
        final = self.blob_path(digest)
        if self.claim_blob(digest):
            os.unlink(tmp)
        else:
            d = os.path.dirname(final)
            if not os.path.isdir(d):
                os.makedirs(d, mode=0o700, exist_ok=True)
                txn.dirs.add(os.path.dirname(d))
            os.replace(tmp, final)
            txn.created.add(digest)
            txn.dirs.add(d)
        txn.temps.discard(tmp)
        return digest, size

    def _put_remote(self, txn: Txn, chunks: list, progress: Callable | None) -> tuple[str, int]:
        # Object stores publish a PUT atomically, so hash first (data is in memory) and write the
        # final name directly instead of copying a temp object.
        h = _hasher()
        size = 0
        for c in chunks:
            h.update(c)
            size += memoryview(c).nbytes
        digest = h.hexdigest()
        final = self.blob_path(digest)
        if not self.fs.exists(final):
            txn.created.add(digest)
            with self.fs.open(final, "wb") as f:
                for c in chunks:
                    f.write(memoryview(c).cast("B"))
            txn.bytes_written += size
        if progress:
            progress(size)
        return digest, size

    def sync(self, txn: Txn) -> None:
        """Make every rename of this write durable before the manifest points at it."""
        if self.local:
            # new subdirectories are only durable once their parents are synced too
            for d in sorted(txn.dirs | {self._join("blobs"), self.root}):
                self._fsync_dir(d)

    def publish(self, txn: Txn, stream: str, manifest_bytes: bytes) -> None:
        path = self.manifest_path(stream, txn.id)
        try:
            self._makedirs(os.path.dirname(path) if self.local else path.rsplit("/", 1)[0])
            self._write_small(path, manifest_bytes)
            if self.local:
                slug_dir = os.path.dirname(path)
                for d in (slug_dir, os.path.dirname(slug_dir), self.root):
                    self._fsync_dir(d)
        except OSError as e:
            self._remove(path)
            raise self._os_error(e, "writing the manifest") from None

    # -- reading -------------------------------------------------------------------------------
    def manifest_ids(self, stream: str) -> list[str]:
        """Checkpoint ids of a stream, newest first."""
        names = self._ls(self._join("manifests", stream_slug(stream)))
        return sorted((n[:-5] for n in names if n.endswith(".json")), reverse=True)

    def _manifest_files(self) -> list[str]:
        out = []
        for slug in self._ls(self._join("manifests")):
            for n in self._ls(self._join("manifests", slug)):
                if n.endswith(".json"):
                    out.append(self._join("manifests", slug, n))
        return out

    def _read_bytes(self, path: str) -> bytes:
        if self.local:
            with open(path, "rb") as f:
                return f.read()
        return self.fs.cat_file(path)

    def find_manifest(self, checkpoint_id: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", checkpoint_id or ""):
            raise NotFoundError(f"no checkpoint {checkpoint_id!r} in {self.url}")
        for slug in self._ls(self._join("manifests")):
            p = self._join("manifests", slug, f"{checkpoint_id}.json")
            if self._exists(p):
                return p
        raise NotFoundError(f"no checkpoint {checkpoint_id!r} in {self.url}")

    def load_manifest(
        self, key: bytes, stream: str = "default", checkpoint_id: str | None = None
    ) -> Manifest:
        """The verified manifest of ``checkpoint_id`` (or the newest of ``stream``)."""
        if checkpoint_id is None:
            ids = self.manifest_ids(stream)
            if not ids:
                raise NotFoundError(f"no checkpoint for {stream!r} in {self.url}")
            path = self.manifest_path(stream, ids[0])
            where = ids[0]
        else:
            path = self.find_manifest(checkpoint_id)
            where = checkpoint_id
        try:
            raw = self._read_bytes(path)
        except FileNotFoundError:
            raise NotFoundError(f"checkpoint {where} disappeared from {self.url}") from None
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint {where}: {e.strerror or e}") from None
        return verify(raw, key, where)

    def list(self, stream: str | None = None, *, key: bytes | None = None) -> list[Manifest]:
        """Manifests newest first. With a key (argument or ``store.key``) only authentic ones,
        marked ``verified``; without one, every parseable manifest with ``verified=False``."""
        key = key or self.key
        paths = (
            [self.manifest_path(stream, i) for i in self.manifest_ids(stream)]
            if stream is not None
            else self._manifest_files()
        )
        out = []
        for p in paths:
            try:
                raw = self._read_bytes(p)
                if key is not None:
                    m = verify(raw, key, p)
                else:
                    m = Manifest.from_dict(parse(raw, p))
            except (OSError, IntegrityError, TypeError):
                continue
            out.append(m)
        out.sort(key=lambda m: m.id, reverse=True)
        return out

    def delete(self, checkpoint_id: str) -> None:
        """Remove a checkpoint's manifest; its blobs go at the next :func:`gc`."""
        self._remove(self.find_manifest(checkpoint_id))

    # -- garbage collection --------------------------------------------------------------------
    def _active_leases(self) -> list[tuple[str, float]]:
        host = socket.gethostname()
        now = time.time()
        out = []
        tmpdir = self._join("tmp")
        for n in self._ls(tmpdir):
            if not n.endswith(".lease"):
                continue
            p = self._join("tmp", n)
            try:
                info = json.loads(self._read_bytes(p))
                started = float(info["started"])
                alive = now - started < LEASE_MAX_AGE
                if alive and info.get("host") == host:
                    alive = psutil.pid_exists(int(info["pid"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if alive:
                out.append((n[: -len(".lease")], started))
            else:
                self._remove(p)
        return out

    def referenced(self) -> set[str]:
        refs: set[str] = set()
        for p in self._manifest_files():
            try:
                d = parse(self._read_bytes(p), p)
            except (OSError, IntegrityError):
                continue
            refs.update((d.get("blobs") or {}).keys())
        return refs

    def collect(
        self,
        candidates: Iterable[str] | None = None,
        *,
        dry_run: bool = False,
        grace_s: float = 0.0,
    ) -> dict[str, Any]:
        """Remove blobs no manifest references (only among ``candidates`` when given).

        Blobs younger than ``grace_s`` or than a running write's lease are kept, so a concurrent
        checkpoint never loses a blob it has written but not yet published.
        """
        leases = self._active_leases()
        cutoff = time.time() - grace_s
        if leases:
            cutoff = min(cutoff, min(s for _, s in leases) - 5.0)
        refs = self.referenced()
        if candidates is None:
            found = [
                (d, self._join("blobs", sub, d))
                for sub in self._ls(self._join("blobs"))
                for d in self._ls(self._join("blobs", sub))
            ]
        else:
            found = [(d, self.blob_path(d)) for d in set(candidates)]
        removed, freed = [], 0
        for digest, path in found:
            if digest in refs or ".tmp" in digest:
                continue
            m = self._mtime(path)
            if m == 0.0 and not self._exists(path):
                continue
            if m > cutoff:
                continue
            try:
                size = os.path.getsize(path) if self.local else int(self.fs.size(path))
            except OSError:
                size = 0
            if not dry_run:
                self._remove(path)
            removed.append(digest)
            freed += size
        temps = 0
        if candidates is None:
            # manifest temp files of writers that died between write and rename
            for slug in self._ls(self._join("manifests")):
                for n in self._ls(self._join("manifests", slug)):
                    p = self._join("manifests", slug, n)
                    if n.endswith(".tmp") and self._mtime(p) < time.time() - 600:
                        if not dry_run:
                            self._remove(p)
                        temps += 1
            # a write creates its lease before any temp file and removes it after the last,
            # so temps not covered by a live lease belong to a writer that died
            active = {i for i, _ in leases}
            for n in self._ls(self._join("tmp")):
                if n.endswith(".lease") or _owner(n) in active:
                    continue
                if not dry_run:
                    self._remove(self._join("tmp", n))
                temps += 1
        return {
            "removed": removed,
            "bytes_freed": freed,
            "temps_removed": temps,
            "referenced": len(refs),
            "dry_run": dry_run,
        }


def _owner(tmp_name: str) -> str:
    # temp names are "<checkpoint id>-<random>.part"; checkpoint ids contain one '-'
    parts = tmp_name.split("-")
    return "-".join(parts[:2])


def _write_behind(fd: int, offset: int, length: int) -> None:
    """Start writing this range to the device now. Left to itself the kernel keeps a checkpoint's
    pages dirty until the final fsync (background writeback waits for 10% of RAM to be dirty),
    so the disk would idle while the checkpoint is being serialized. On Linux, DONTNEED on dirty
    pages starts their writeback without waiting for it (as PostgreSQL's flush hints do)."""
    if _FADVISE:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _drop_cached(fd: int) -> None:
    """After fsync: drop the blob's now clean pages, so a checkpoint does not leave gigabytes of
    page cache charged to the notebook's memory cgroup."""
    if _FADVISE:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _write_all(fd: int, mv: memoryview) -> None:
    while len(mv):
        n = os.write(fd, mv)
        mv = mv[n:]


def open_store(url_or_path: str | None = None, *, key: bytes | None = None) -> Store:
    """A store at a local path or fsspec URL (``None``: :func:`default_store_url`)."""
    return Store(url_or_path or default_store_url(), key=key)


def gc(store: Store, *, dry_run: bool = False, grace_s: float = 0.0) -> dict[str, Any]:
    """Remove blobs that no manifest references, and stale temp files of crashed writes."""
    return store.collect(None, dry_run=dry_run, grace_s=grace_s)
