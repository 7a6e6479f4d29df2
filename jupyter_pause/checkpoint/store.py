"""Where checkpoints live: a local directory (default) or any fsspec URL.

(Over 400 lines on purpose: the layout, the publication protocol and the trust checks of both
kinds of store read best side by side. Apart: :mod:`.localfs` (local file rules),
:mod:`.objectstore` and :mod:`.uploads` (streaming), :mod:`.collect`, :mod:`.retention`.)

Layout under the root::

    blobs/<2 hex>/<digest>          immutable, content-addressed (blake3)
    manifests/<stream-slug>/<id>.json   one signed manifest per checkpoint, written last
    tmp/                            in-flight temp files and leases of running writes
    pins/<id>                       checkpoints something outside the store still needs

The store is a trust boundary: anyone who can write to it (a shared volume, a misconfigured
bucket) can plant files there. Nothing read from it is trusted before the manifest's HMAC is
checked, and then only where it is found: a manifest must sit in its own stream's folder under its
own id. Blob names are checked to be digests before any path is built from them, and nothing is
removed through a symbolic link or outside the root.

Rollback: renaming an old manifest to a newer name, or copying one from another notebook's
folder, is refused by that binding. Deleting the newest manifests cannot be told apart from a
store that never had them: the store alone cannot detect it. The server's journal can: it records
the checkpoint id of each pause and resume restores that id explicitly, so a deleted one is
reported missing instead of an older one being restored in its place.

Local writes go to ``tmp/`` first, are fsync'd and renamed into place, and the directories are
fsync'd before the manifest is published, so a crash at any moment leaves only unreferenced temp
files or blobs behind: never a manifest that points at missing or partial data. Large blobs are
written with O_DIRECT where the file system allows it (:mod:`.directio`); the local file rules
are in :mod:`.localfs`.

Object stores (:mod:`.objectstore`) name a blob by hashing it where it lies, then stream it to
that name in parts with bounded memory; a multipart or resumable upload only becomes visible
when it completes, so the same guarantee holds there.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jupyter_core.paths import jupyter_data_dir

from ..atomicfile import fsync_dir, replace_file
from . import goodblobs, localfs, objectstore, procid, uploads
from .errors import CheckpointError, IntegrityError, NotFoundError, StorageFullError
from .manifest import Manifest, parse, verify

log = logging.getLogger(__name__)

DIGEST_RE = re.compile(r"[0-9a-f]{64}")  # blake3 hexdigest: the only valid blob name
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # checkpoint ids (file names)
MANIFEST_MAX = 256 << 20  # a planted multi-GB "manifest" is refused unread
LEASE_SUFFIX = ".lease"
GC_ASIDE = ".gc-"  # a blob renamed aside by a gc deciding whether to remove it
COARSE_TIME_S = 2.0  # the coarsest file time kept (FAT: 2 s)
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def default_store_url() -> str:
    return os.path.join(jupyter_data_dir(), "jupyter-pause", "checkpoints")


def stream_slug(stream: str) -> str:
    """A directory name for a stream: readable, collision-free (short hash of the full name)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", stream).strip("._")[-60:] or "stream"
    return f"{readable}-{hashlib.sha256(stream.encode()).hexdigest()[:8]}"


def valid_digest(name: Any) -> bool:
    return isinstance(name, str) and DIGEST_RE.fullmatch(name) is not None


def valid_id(name: Any) -> bool:
    return isinstance(name, str) and ID_RE.fullmatch(name) is not None


def blob_hasher() -> Any:
    """A new hasher of the digest that names blobs (blake3, all cores for big inputs)."""
    import blake3  # only when a blob is written or read

    return blake3.blake3(max_threads=blake3.blake3.AUTO)


def is_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _FULL_ERRNOS


def set_aside_digest(name: str) -> str | None:
    """The digest of a blob a gc renamed aside (``<digest>.gc-<12 hex>``), or None."""
    d, sep, tag = name.partition(GC_ASIDE)
    ok = sep and valid_digest(d) and re.fullmatch("[0-9a-f]{12}", tag)
    return d if ok else None


def _touch(path: str) -> None:
    """Set a blob's time to now, exactly: the kernel's file clock runs up to a tick behind
    ``time.time()``, and a gc's cutoff (taken before it looks for writers) must come before
    any claim or write it did not see."""
    now = time.time_ns()
    os.utime(path, ns=(now, now), follow_symlinks=False)


@dataclass
class Scan:
    """What :meth:`Store.scan` found: authentic manifests bound to their place (newest first),
    and every other file in the manifest folders with why it was left alone."""

    verified: list[Manifest] = field(default_factory=list)
    unverified: list[dict[str, str]] = field(default_factory=list)  # {"path", "reason"}
    errors: dict[str, CheckpointError] = field(default_factory=dict)  # path -> refusal


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
        self.lease_info: dict[str, Any] = {}  # what the lease says (claims added before publish)

    def count(self, n: int) -> None:
        self.bytes_written += n

    def abort(self) -> None:
        for p in list(self.temps):
            self.store.remove(p)
        self.release()
        self.drop_created(self.created)

    def drop_created(self, digests: set[str]) -> None:
        """Remove blobs this write added, except those another writer has taken up since: a
        published manifest names them, or a running write (its lease) may be about to. Another
        process cannot know this write's blobs as good, so it rewrote the same bytes in place
        (not its "created") and published; deleting them outright broke that checkpoint."""
        if not digests:
            return
        from .collect import collect  # collect imports this module

        for d in digests:
            goodblobs.forget(self.store.url, d)
        try:
            collect(self.store, set(digests))
        except Exception as e:  # noqa: BLE001 - a clean-up; gc() removes what is left
            log.debug("could not remove the blobs of an aborted write: %s", e)

    def release(self) -> None:
        if self.lease:
            self.store.remove(self.lease)
            self.lease = None


class Store:
    """A checkpoint store. Use :func:`open_store` to make one."""

    def __init__(
        self,
        url: str,
        key: bytes | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        memory: str | int | None = None,
    ) -> None:
        self.url = url
        self.key = key
        self.budget: objectstore.Budget | None = None
        if "://" in url and not url.startswith("file://"):
            import fsspec  # only for object stores

            self.fs, self.root = fsspec.core.url_to_fs(url, **(storage_options or {}))
            self.local = False
            # what this store's streamed uploads and downloads may hold in memory, all together
            self.budget = objectstore.Budget(objectstore.memory_bound(memory))
            self.pack_max: int | None = objectstore.PACK_MAX
            self.root = self.root.rstrip("/")
        else:
            path = url.removeprefix("file://")
            self.fs = None
            self.root = os.path.abspath(os.path.expanduser(path))
            self.local = True
            self.pack_max = None
            root_is_store = any(os.path.isdir(self._join(d)) for d in ("manifests", "blobs"))
            localfs.narrow_folders(([self.root] if root_is_store else [])
                                   + [self._join(d) for d in ("manifests", "blobs", "tmp", "pins")])

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # -- layout --------------------------------------------------------------------------------
    def _join(self, *parts: str) -> str:
        return (os.path.join if self.local else lambda *p: "/".join(p))(self.root, *parts)

    def blob_path(self, digest: str) -> str:
        # Names come from manifests, i.e. from the store itself: never build a path from a name
        # that is not a digest (an absolute path or ``..`` would point outside the store).
        if not valid_digest(digest):
            raise IntegrityError(f"invalid blob name {str(digest)[:40]!r} in {self.url}; ignored")
        return self._join("blobs", digest[:2], digest)

    def manifest_path(self, stream: str, checkpoint_id: str) -> str:
        return self._join("manifests", stream_slug(stream), f"{checkpoint_id}.json")

    def manifest_files(self) -> list[str]:
        """Paths of every manifest file, authentic or not (:meth:`scan` says which are)."""
        return [p for p in self._manifest_folder_files() if p.endswith(".json")]

    def manifest_temps(self) -> list[str]:
        """Temp files in the manifest folders (a writer died between write and rename)."""
        return [p for p in self._manifest_folder_files() if p.endswith(".tmp")]

    def _manifest_folder_files(self) -> list[str]:
        return [self._join("manifests", slug, n)
                for slug in self._ls(self._join("manifests"))
                for n in self._ls(self._join("manifests", slug))]

    def blob_files(self) -> list[tuple[str, str]]:
        """(digest, path) of every file that is where its digest puts it: anything else in the
        blob folders was not written by us and is left alone."""
        return [(d, self._join("blobs", sub, d))
                for sub in self._ls(self._join("blobs"))
                for d in self._ls(self._join("blobs", sub))
                if valid_digest(d) and d[:2] == sub]

    def set_aside_files(self, before: float) -> list[tuple[str, str]]:
        """(blob path, renamed path) of blobs a gc renamed aside before ``before`` and did not
        finish with (it died in between). The rename set the time of the file's last change
        (ctime), which nothing else changes there; an object store's copy aside is new."""
        out = []
        for sub in self._ls(self._join("blobs")):
            for n in self._ls(self._join("blobs", sub)):
                d = set_aside_digest(n)
                if d is None or d[:2] != sub:
                    continue
                aside = self._join("blobs", sub, n)
                if not self.local:
                    m = self.mtime(aside)
                    if 0.0 < m < before:
                        out.append((self._join("blobs", sub, d), aside))
                    continue
                try:
                    st = os.lstat(aside)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_ctime < before:
                    out.append((self._join("blobs", sub, d), aside))
        return out

    def temp_files(self) -> list[tuple[str, str]]:
        """(name, path) of the files in ``tmp/``: parts of running or dead writes, and leases
        (``<checkpoint id>.lease``)."""
        return [(n, self._join("tmp", n)) for n in self._ls(self._join("tmp"))]

    def usage(self) -> dict[str, int]:
        """Every object and byte in the store: manifests, blobs, temp files."""
        out = {"manifests": 0, "manifest_bytes": 0, "blobs": 0, "blob_bytes": 0,
               "temp_files": 0, "temp_bytes": 0}
        for p in self.manifest_files():
            out["manifests"] += 1
            out["manifest_bytes"] += self.size(p)
        for sub in self._ls(self._join("blobs")):
            for d in self._ls(self._join("blobs", sub)):
                n = self.size(self._join("blobs", sub, d))
                kind = "blob" if valid_digest(d) else "temp"  # a gc's copy aside is no blob
                out[f"{kind}s" if kind == "blob" else "temp_files"] += 1
                out[f"{kind}_bytes"] += n
        for _, p in self.temp_files():
            out["temp_files"] += 1
            out["temp_bytes"] += self.size(p)
        out["bytes"] = out["manifest_bytes"] + out["blob_bytes"] + out["temp_bytes"]
        return out

    # -- files ---------------------------------------------------------------------------------
    def inside(self, path: str) -> bool:
        """True if ``path`` is under the root with no link on the way (always, for object
        stores, which have no links)."""
        return localfs.inside(self.root, path) if self.local else True

    def remove(self, path: str) -> None:
        """Remove one file of the store; never through a link or outside the root, and quietly
        when it is already gone."""
        try:
            if self.local:
                if not localfs.inside(self.root, path):
                    log.warning("not removing %s: outside the store or behind a link", path)
                    return
                os.unlink(path)
            else:
                self.fs.rm_file(path)
        except (FileNotFoundError, OSError):
            pass
        except Exception as e:  # noqa: BLE001 - an object store's client errors (a server gone)
            log.debug("could not remove %s: %s", path, e)

    def delete_blob(self, digest: str) -> None:
        goodblobs.forget(self.url, digest)
        self.remove(self.blob_path(digest))

    def remove_manifest(self, m: Manifest) -> None:
        """Remove the manifest file of ``m`` where it was verified (never a lookup by name)."""
        self.remove(self.manifest_path(m.stream, m.id))

    def exists(self, path: str) -> bool:
        return os.path.exists(path) if self.local else self.fs.exists(path)

    def _ls(self, path: str) -> list[str]:
        """Entry names (not paths) directly under ``path``; [] when missing."""
        try:
            if self.local:
                if path != self.root and os.path.islink(path):
                    return []  # a folder swapped for a link leads outside the store
                return sorted(os.listdir(path))
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def mtime(self, path: str) -> float:
        """When the file was last written (0.0 when unknown or missing); never through a link."""
        try:
            if self.local:
                return os.lstat(path).st_mtime
            info = self.fs.info(path)
            for k in ("mtime", "LastModified", "updated", "created"):
                v = info.get(k)
                if isinstance(v, (int, float)):
                    return float(v)
                if hasattr(v, "timestamp"):
                    return float(v.timestamp())
        except (FileNotFoundError, OSError):
            pass
        return 0.0

    def size(self, path: str) -> int:
        """The file's size in bytes (0 when missing); never through a link."""
        try:
            return os.lstat(path).st_size if self.local else int(self.fs.size(path))
        except OSError:
            return 0

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        """The file's bytes, no link followed; IntegrityError when larger than ``limit``."""
        if self.local:
            return localfs.read_regular(path, limit)
        if limit is not None and int(self.fs.size(path)) > limit:
            raise IntegrityError(f"{path} is too large to be a manifest")
        return bytes(self.fs.cat_file(path))

    def abort_stale_uploads(self, before: float) -> int:
        """Object stores: abort unfinished multipart uploads of blobs started before ``before``
        (epoch seconds): writers that died (invisible, but billed). Returns how many."""
        return 0 if self.local else objectstore.abort_stale_uploads(
            self.fs, self._join("blobs"), before)

    def _makedirs(self, path: str) -> None:
        if self.local:
            # every folder of the store is 0700 (checkpoints hold the user's data), none a link
            localfs.makedirs_private(self.root, path)
        else:
            self.fs.makedirs(path, exist_ok=True)

    def _write_small(self, path: str, data: bytes, durable: bool = True) -> None:
        if self.local:
            replace_file(path, data, durable=durable)
        else:
            with self.fs.open(path, "wb") as f:
                f.write(data)

    # -- writing -------------------------------------------------------------------------------
    def begin(self, checkpoint_id: str) -> Txn:
        """Start a write: a lease in ``tmp/`` tells :mod:`.collect` that its temp files and new
        blobs belong to a live writer."""
        txn = Txn(self, checkpoint_id)
        try:
            self._makedirs(self._join("tmp"))
            lease = self._join("tmp", f"{checkpoint_id}{LEASE_SUFFIX}")
            info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
            ident = procid.identity()  # tells this process from a later one given its pid
            if ident is not None:
                info["proc"] = ident
            self._write_small(lease, json.dumps(info).encode(), durable=False)
            txn.lease, txn.lease_info = lease, info
        except OSError as e:
            raise self._os_error(e, "starting a checkpoint") from None
        return txn

    def _os_error(self, e: OSError, what: str) -> CheckpointError:
        if is_full(e):
            return StorageFullError(
                f"no space left in checkpoint store {self.url} while {what}; "
                "the partial checkpoint was removed and earlier checkpoints are intact"
            )
        # The manifest is written last, so a failure anywhere before it publishes nothing.
        return CheckpointError(f"checkpoint store {self.url}: {what} failed: {e.strerror or e}; "
                               "this checkpoint was not published and earlier checkpoints are "
                               "intact")

    def has_blob(self, digest: str) -> bool:
        return self.exists(self.blob_path(digest))

    def blob_stamp(self, digest: str, st: os.stat_result | None = None) -> goodblobs.Stamp | None:
        """What changes with any rewrite of the blob's file (:mod:`.goodblobs`); None when it is
        missing, not a plain file inside the store, or (object stores) has no identity."""
        path = self.blob_path(digest)
        if self.local:
            if st is None:
                if not localfs.inside(self.root, path):
                    return None
                try:
                    st = os.lstat(path)
                except OSError:
                    return None
            if not stat.S_ISREG(st.st_mode):
                return None
            return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        try:
            info = self.fs.info(path)
        except (FileNotFoundError, OSError):
            return None
        except Exception as e:  # noqa: BLE001 - a client's own errors: unknown, so not trusted
            log.debug("no stamp for %s: %s", path, e)
            return None
        ident = [str(info.get(k)) for k in ("generation", "ETag", "etag", "md5Hash", "crc32c")
                 if info.get(k) is not None]
        return (int(info.get("size") or 0), *ident) if ident else None

    def claim_blob(self, digest: str, size: int | None = None) -> bool:
        """True if the blob exists and is known good (:mod:`.goodblobs`: this process hashed it
        and the file is unchanged since), so a write may reference it without writing it.
        Locally also refresh its mtime, so a concurrent gc (which spares blobs newer than a
        running write's lease) cannot remove it while this write is about to reference it."""
        stamp = self.blob_stamp(digest)
        if stamp is None or not goodblobs.is_good(self.url, digest, stamp):
            return False
        if size is not None and stamp[2 if self.local else 0] != size:
            return False
        if self.local:
            try:
                _touch(self.blob_path(digest))
            except OSError:  # gone since the stamp (a gc took it): this write writes it again
                return False
            goodblobs.remember(self.url, digest, self.blob_stamp(digest))
        return True

    def collect_blob(self, digest: str, cutoff: float,
                     held: list[tuple[str, str, str]] | None = None) -> int | None:
        """Remove an unreferenced blob last written (or claimed) at or before ``cutoff``;
        its size, or None when it was spared or is gone.

        Object stores: the blob is copied aside first and ``(digest, path, aside)`` added to
        ``held``; the caller reads the writes' claims again, puts a claimed one back
        (:meth:`put_aside_back`) and removes the other copies (see :meth:`record_claims`).

        Locally the blob is first renamed aside and its time read again from the renamed file:
        a write that claimed it after the caller's checks refreshed that time (and one that
        claims it after the rename finds it gone and writes it again), so a claim is never lost
        between the check and the removal. It is renamed back when it was claimed. Object
        stores cannot refresh a time without rewriting the object (see :mod:`.collect`)."""
        path = self.blob_path(digest)
        if not self.local:
            with contextlib.suppress(Exception):  # its time now, not a listing's
                self.fs.invalidate_cache(path)
            m = self.mtime(path)  # 0.0: unknown (a store that keeps none), or gone
            if m > cutoff or (m == 0.0 and not self.exists(path)):
                return None
            size = self.size(path)
            aside = f"{path}{GC_ASIDE}{secrets.token_hex(6)}"
            try:
                self.fs.copy(path, aside)  # a server-side copy: no bytes through this process
            except Exception as e:  # noqa: BLE001 - no copy, no removal
                log.warning("not removing %s: it could not be copied aside first (%s)", path, e)
                return None
            self.delete_blob(digest)
            if held is None:  # nobody will look at the claims again: decided now
                self.remove(aside)
            else:
                held.append((digest, path, aside))
            return size
        if not localfs.inside(self.root, path):
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if st.st_mtime_ns % 1_000_000_000 == 0:
            # a file system that keeps whole seconds (FAT, HFS+, some FUSE mounts) truncated
            # the exact time a claim set: it may lie up to 2 s before the claim
            cutoff -= COARSE_TIME_S
        if not stat.S_ISREG(st.st_mode) or st.st_mtime > cutoff:
            return None  # only a plain file older than the cutoff is ever moved
        aside = f"{path}{GC_ASIDE}{secrets.token_hex(6)}"
        try:
            os.rename(path, aside)
        except OSError:  # gone already, or not ours to move
            return None
        try:
            st = os.lstat(aside)
            if stat.S_ISREG(st.st_mode) and st.st_mtime <= cutoff:
                goodblobs.forget(self.url, digest)
                os.unlink(aside)
                return st.st_size
        except OSError:
            pass
        except BaseException:  # interrupted (a stop): a claim may count on it
            self.put_aside_back(path, aside)
            raise
        self.put_aside_back(path, aside)
        return None

    def recover_set_aside(self, digest: str) -> bool:
        """Put back a blob a gc set aside and never finished with (it was killed between the
        removal and its decision); True if one was. Only ever keeps a blob: a reader that
        finds a blob missing tries this once."""
        path = self.blob_path(digest)
        if self.local and not localfs.inside(self.root, path):
            return False
        folder = os.path.dirname(path) if self.local else path.rsplit("/", 1)[0]
        if not self.local:
            with contextlib.suppress(Exception):  # what the store holds now
                self.fs.invalidate_cache(folder)
                self.fs.invalidate_cache(path)
            if self.has_blob(digest):
                return True  # there after all: no aside is touched
        for n in self._ls(folder):
            if set_aside_digest(n) == digest:
                aside = os.path.join(folder, n) if self.local else f"{folder}/{n}"
                if self.local:
                    with contextlib.suppress(OSError):
                        if stat.S_ISREG(os.lstat(aside).st_mode):
                            self.put_aside_back(path, aside)
                            return os.path.isfile(path)
                    continue
                self.put_aside_back(path, aside)
                return self.has_blob(digest)
        return False

    def put_aside_back(self, path: str, aside: str) -> None:
        """Undo a :meth:`collect_blob` rename (object stores: its removal, from the copy aside);
        a copy written there since (the same bytes, by content addressing) is kept and the one
        aside dropped."""
        if not self.local:
            try:
                with contextlib.suppress(Exception):
                    self.fs.invalidate_cache(path)
                if not self.fs.exists(path):
                    self.fs.copy(aside, path)
            except Exception as e:  # noqa: BLE001 - kept aside: the next gc puts it back
                log.warning("could not put blob %s back: %s", path, e)
                return
            self.remove(aside)
            return
        try:
            os.link(aside, path, follow_symlinks=False)
        except FileExistsError:
            pass
        except OSError:
            # no hard links on this file system (some FUSE and SMB mounts): renamed, unless
            # written again meanwhile
            try:
                if not os.path.lexists(path):
                    os.rename(aside, path)
                    return
            except OSError as e:
                log.warning("could not put blob %s back: %s", path, e)
                return
        with contextlib.suppress(OSError):
            os.unlink(aside)

    def put_blob(
        self,
        txn: Txn,
        chunks: Iterable[memoryview | bytes] | Callable[[], Iterable[memoryview | bytes]],
        progress: Callable[[int], None] | None = None,
        size_hint: int = 0,
    ) -> tuple[str, int]:
        """Store the concatenation of ``chunks`` (or of what ``chunks()`` yields: object stores
        read it twice, to name the blob before uploading it); return (digest, size).

        Local: one pass that hashes while it writes to a temp file, then fsync + rename; blobs of
        at least :data:`directio.DIRECT_MIN` bytes (``size_hint``) bypass the page cache. Remote:
        streamed in parts with bounded memory (:mod:`.objectstore`). A blob that already exists
        is not written twice (content addressing).
        """
        try:
            if self.local:
                return self._put_local(txn, chunks, progress, size_hint)
            return self._put_remote(txn, chunks, progress, size_hint)
        except OSError as e:
            raise self._os_error(e, "writing a blob") from None

    def _put_local(
        self, txn: Txn, chunks: Any, progress: Callable[..., Any] | None, size_hint: int = 0
    ) -> tuple[str, int]:
        tmp = self._join("tmp", f"{txn.id}-{secrets.token_hex(6)}.part")
        txn.temps.add(tmp)
        if callable(chunks):
            chunks = chunks()
        h = blob_hasher()
        size = localfs.write_hashed(tmp, chunks, h, size_hint, progress, txn.count)
        digest = h.hexdigest()
        final = self.blob_path(digest)
        if self.claim_blob(digest, size):
            os.unlink(tmp)
        else:
            # missing, or a file this process cannot vouch for (it may be damaged in place):
            # the bytes just hashed replace it atomically
            d = os.path.dirname(final)
            new_dir = not os.path.lexists(d)
            self._makedirs(d)  # refuses a folder that is a link (the blob would land outside)
            if new_dir:
                txn.dirs.add(os.path.dirname(d))
            existed = os.path.lexists(final)
            _touch(tmp)  # before the rename (which keeps it): a gc may move ``final`` at once
            os.replace(tmp, final)
            if not existed:
                txn.created.add(digest)  # an abort removes only what this write added
            txn.dirs.add(d)
            goodblobs.remember(self.url, digest, self.blob_stamp(digest))
        txn.temps.discard(tmp)
        return digest, size

    def _put_remote(
        self, txn: Txn, chunks: Any, progress: Callable[..., Any] | None, size_hint: int = 0
    ) -> tuple[str, int]:
        # Name first (hash the bytes where they lie), then stream to the final name; the upload
        # commits only if what it sent hashes to that name (see objectstore's docstring).
        if callable(chunks):
            source = chunks
        else:
            views = list(chunks)  # views or bytes already in memory: no copy of the data
            source = lambda: views
        h = blob_hasher()
        size = objectstore.hash_source(source(), h)
        digest = h.hexdigest()
        final = self.blob_path(digest)
        if self.claim_blob(digest, size):
            if progress:
                progress(size)
            return digest, size
        # missing, or an object this process cannot vouch for: uploaded (again)
        existed = self.fs.exists(final)
        assert self.budget is not None  # set for every object store
        uploads.upload(self.fs, final, source, size, digest, blob_hasher(), self.budget, progress)
        if not existed:
            txn.created.add(digest)
        txn.bytes_written += size
        with contextlib.suppress(Exception):  # a cache refresh the next write does not need
            self.fs.invalidate_cache(final)
        goodblobs.remember(self.url, digest, self.blob_stamp(digest))
        return digest, size

    def refresh(self) -> None:
        """Object stores: forget every listing and object info the client cached, so the next
        reads ask the store (a gc must not decide on a listing older than itself)."""
        if not self.local:
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache()

    def record_claims(self, txn: Txn, digests: set[str]) -> None:
        """Object stores, before a write publishes: name in its lease the blobs it references
        without having written them (its claims), then check that each still exists.

        Why: an object's time cannot be refreshed without rewriting it, so a gc running beside
        this write may have judged a reused blob unreferenced and old. A gc reads the leases'
        claims before it removes a blob and again after (it keeps a copy aside until then, and
        puts a claimed blob back: :func:`.collect.collect`), so either it sees this claim, or
        this check sees the blob gone. Then nothing is published: the write fails here, and the
        blob is forgotten as good, so the next write uploads it again."""
        if self.local or txn.lease is None or not digests:
            return
        info = dict(txn.lease_info, claims=sorted(digests))
        try:
            self._write_small(txn.lease, json.dumps(info).encode(), durable=False)
        except OSError as e:
            raise self._os_error(e, "recording the blobs this checkpoint reuses") from None
        txn.lease_info = info
        ds = sorted(digests)
        for d in ds:  # never a cached listing: the gc may have removed it since
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(self.blob_path(d))
        with cf.ThreadPoolExecutor(max_workers=min(8, len(ds))) as ex:
            there = list(ex.map(self.has_blob, ds))
        gone = [d for d, ok in zip(ds, there, strict=True) if not ok]
        for d in gone:
            goodblobs.forget(self.url, d)
        if gone:
            raise CheckpointError(
                f"checkpoint store {self.url}: {len(gone)} blob(s) this checkpoint reuses (e.g. "
                f"{gone[0][:12]}) were removed by a clean-up running beside it; this checkpoint "
                "was not published and earlier checkpoints are intact; the next one writes "
                "them again")

    def sync(self, txn: Txn) -> None:
        """Make every rename of this write durable before the manifest points at it."""
        if self.local:
            # new subdirectories are only durable once their parents are synced too
            for d in sorted(txn.dirs | {self._join("blobs"), self.root}):
                fsync_dir(d)

    def publish(self, txn: Txn, stream: str, manifest_bytes: bytes) -> None:
        path = self.manifest_path(stream, txn.id)
        try:
            self._makedirs(os.path.dirname(path) if self.local else path.rsplit("/", 1)[0])
            self._write_small(path, manifest_bytes)
            if self.local:
                slug_dir = os.path.dirname(path)
                for d in (slug_dir, os.path.dirname(slug_dir), self.root):
                    fsync_dir(d)
        except OSError as e:
            self.remove(path)
            raise self._os_error(e, "writing the manifest") from None

    # -- reading -------------------------------------------------------------------------------
    def manifest_ids(self, stream: str) -> list[str]:
        """Names of the manifest files of a stream, newest first (unverified: use :meth:`scan`
        for anything that acts on them)."""
        names = self._ls(self._join("manifests", stream_slug(stream)))
        return sorted((n[:-5] for n in names if n.endswith(".json")), reverse=True)

    def _load_at(self, path: str, slug: str, cid: str, key: bytes | None) -> Manifest:
        """The manifest in file ``slug/cid.json``, authenticated (with a key) and bound to that
        place: its signed id must be the file name and its signed stream the folder. Otherwise a
        signed manifest could be replayed into another notebook, or an old one renamed to look
        newest (a rollback)."""
        where = f"{slug}/{cid}.json"
        if not valid_id(cid):
            raise IntegrityError(f"{where} is not a checkpoint file name")
        try:
            raw = self.read_bytes(path, MANIFEST_MAX)
        except FileNotFoundError:
            raise NotFoundError(f"checkpoint {cid} disappeared from {self.url}") from None
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint {cid}: {e.strerror or e}") from None
        if key is not None:
            m = verify(raw, key, cid)
        else:
            try:
                m = Manifest.from_dict(parse(raw, cid))
            except TypeError:
                raise IntegrityError(f"checkpoint manifest {where} is malformed") from None
        if m.id != cid:
            raise IntegrityError(
                f"checkpoint file {where} holds checkpoint {str(m.id)[:80]!r} (renamed: a "
                "rollback or replay); refusing it"
            )
        if not isinstance(m.stream, str) or stream_slug(m.stream) != slug:
            raise IntegrityError(
                f"checkpoint {cid} belongs to notebook {str(m.stream)[:200]!r} but was found in "
                f"another notebook's folder ({slug}); refusing it"
            )
        return m

    def scan(self, stream: str | None = None, *, key: bytes | None = None) -> Scan:
        """Every manifest file of ``stream`` (or of all streams): authentic and bound ones newest
        first (by their signed id), the rest with the reason they are left alone.

        Without a key nothing is authenticated (``verified=False``); callers that delete,
        choose or load must pass one.
        """
        key = key or self.key
        out = Scan()
        slugs = [stream_slug(stream)] if stream is not None else self._ls(self._join("manifests"))
        for slug in slugs:
            for n in self._ls(self._join("manifests", slug)):
                if not n.endswith(".json"):
                    continue
                p = self._join("manifests", slug, n)
                rel = f"manifests/{slug}/{n}"
                try:
                    m = self._load_at(p, slug, n[:-5], key)
                except NotFoundError:
                    continue  # removed while we looked: a concurrent retention
                except CheckpointError as e:
                    out.unverified.append({"path": rel, "reason": str(e)})
                    out.errors[rel] = e
                    continue
                out.verified.append(m)
        out.verified.sort(key=lambda m: m.id, reverse=True)
        out.unverified.sort(key=lambda u: u["path"], reverse=True)
        return out

    def find_manifest(self, checkpoint_id: str) -> str:
        if not valid_id(checkpoint_id):
            raise NotFoundError(f"no checkpoint {str(checkpoint_id)[:80]!r} in {self.url}")
        for slug in self._ls(self._join("manifests")):
            p = self._join("manifests", slug, f"{checkpoint_id}.json")
            if self.exists(p):
                return p
        raise NotFoundError(f"no checkpoint {checkpoint_id!r} in {self.url}")

    def choose(
        self, key: bytes, stream: str = "default", checkpoint_id: str | None = None
    ) -> tuple[Manifest, list[dict[str, str]]]:
        """The verified manifest of ``checkpoint_id`` (or the newest authentic one of ``stream``)
        and the unverifiable manifest files skipped on the way (newer than the one chosen)."""
        if not key:  # what it returns is loaded: never an unauthenticated manifest
            raise CheckpointError("no checkpoint key given: a checkpoint is verified with its "
                                  "key before anything in it is read")
        if checkpoint_id is not None:
            self.find_manifest(checkpoint_id)  # NotFoundError when no folder has it
            # a forged copy under the same name in another folder must not hide the real one
            first: CheckpointError | None = None
            for slug in self._ls(self._join("manifests")):
                p = self._join("manifests", slug, f"{checkpoint_id}.json")
                if not self.exists(p):
                    continue
                try:
                    return self._load_at(p, slug, checkpoint_id, key), []
                except CheckpointError as e:
                    first = first or e
            raise first or NotFoundError(f"no checkpoint {checkpoint_id!r} in {self.url}")
        found = self.scan(stream, key=key)
        if not found.verified:
            if found.errors:  # nothing authentic: say why the newest file was refused
                raise found.errors[found.unverified[0]["path"]]
            raise NotFoundError(f"no checkpoint for {stream!r} in {self.url}")
        m = found.verified[0]
        skipped = [u for u in found.unverified if u["path"].rsplit("/", 1)[-1][:-5] > m.id]
        return m, skipped

    def load_manifest(
        self, key: bytes, stream: str = "default", checkpoint_id: str | None = None
    ) -> Manifest:
        """The verified manifest of ``checkpoint_id`` (or the newest authentic one of ``stream``)."""
        return self.choose(key, stream, checkpoint_id)[0]

    def list(self, stream: str | None = None, *, key: bytes | None = None) -> list[Manifest]:
        """Manifests newest first. With a key (argument or ``store.key``) only authentic ones,
        marked ``verified``; without one, every parseable manifest with ``verified=False``.
        Either way only manifests found in their own place (see :meth:`scan`)."""
        return self.scan(stream, key=key).verified

    def delete(self, checkpoint_id: str) -> None:
        """Remove a checkpoint's manifest; its blobs go at the next :func:`gc`. With a key
        (``store.key``) only the authentic manifest of that id, where it belongs."""
        path = self.find_manifest(checkpoint_id)
        if self.key is not None:
            m, _ = self.choose(self.key, checkpoint_id=checkpoint_id)
            path = self.manifest_path(m.stream, m.id)
        self.remove(path)

    # -- pins: checkpoints something outside the store depends on --------------------------------
    def pin(self, checkpoint_id: str, reason: str = "") -> None:
        """Protect a checkpoint from retention and gc (e.g. the one a pause depends on)."""
        if not valid_id(checkpoint_id):
            raise CheckpointError(f"invalid checkpoint id {checkpoint_id!r}")
        self._makedirs(self._join("pins"))
        self._write_small(self._join("pins", checkpoint_id), reason.encode()[:1024])

    def unpin(self, checkpoint_id: str) -> None:
        if valid_id(checkpoint_id):
            self.remove(self._join("pins", checkpoint_id))

    def pinned(self) -> set[str]:
        """Pinned ids. Pins are unauthenticated, so they can only keep a checkpoint, never
        select, load or delete one."""
        return {n for n in self._ls(self._join("pins")) if valid_id(n)}


def open_store(
    url_or_path: str | None = None,
    *,
    key: bytes | None = None,
    storage_options: dict[str, Any] | None = None,
    memory: str | int | None = None,
) -> Store:
    """A store at a local path or fsspec URL (``None``: :func:`default_store_url`).

    ``storage_options``: keyword arguments of the fsspec file system (endpoint, credentials;
    by default each ecosystem's own chain, see :mod:`.credentials`). ``memory``: the most an
    object store's streamed transfers may hold at once (bytes or "256M"; default the
    ``JUPYTER_PAUSE_STORE_MEMORY`` environment variable, else 256 MiB)."""
    return Store(url_or_path or default_store_url(), key=key, storage_options=storage_options,
                 memory=memory)
