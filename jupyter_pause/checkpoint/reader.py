"""read(): verify a checkpoint completely, then rebuild its values (never touching a namespace)."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import directio, goodblobs, objectstore, procstate
from . import env as _env
from . import tensors as _tensors
from .cache import remember_restored
from .errors import CheckpointError, IntegrityError
from .localfs import CHUNK, open_regular
from .manifest import Manifest, ReadResult, VariableReport
from .pickling import load_group, reason_of
from .store import Store, blob_hasher, open_store

PARALLEL_MIN = 1 << 20  # blobs at least this big are verified two at a time


class _Verifier:
    """Reads every needed blob once, hashing as it goes; nothing is unpickled until all pass."""

    def __init__(self, store: Store, manifest: Any, progress: Callable[..., Any] | None, total: int) -> None:
        self.store, self.m = store, manifest
        self.progress, self.total = progress, total
        self.done = 0
        self.lock = threading.Lock()
        self.data: dict[str, Any] = {}

    def _tick(self, n: int) -> None:
        with self.lock:
            self.done += n

    def _bad(self, digest: str, why: str) -> IntegrityError:
        return IntegrityError(
            f"checkpoint {self.m.id}: blob {digest[:12]} {why}; refusing to load it"
        )

    def verify(self, digest: str) -> None:
        """Read the blob into memory once, hashing what was read; what is later unpickled or
        turned into tensors is that very buffer. Nothing is read from the store again after the
        check, so swapping or rewriting the file in between changes nothing."""
        info = self.m.blobs.get(digest)
        if info is None:
            raise IntegrityError(f"checkpoint {self.m.id}: manifest references unknown blob")
        try:
            size = int(info["size"])
        except (KeyError, TypeError, ValueError):
            raise IntegrityError(f"checkpoint {self.m.id}: manifest is inconsistent") from None
        path = self.store.blob_path(digest)
        h = blob_hasher()
        try:
            if not self.store.local:
                stamp = self.store.blob_stamp(digest)  # before the bytes: a later rewrite differs
                try:
                    keep, n = self._read_remote(digest, path, size, h)
                except FileNotFoundError:
                    # a gc stopped with it copied aside: back, and read once more
                    if not self.store.recover_set_aside(digest):
                        raise
                    h = blob_hasher()
                    stamp = self.store.blob_stamp(digest)
                    keep, n = self._read_remote(digest, path, size, h)
            else:
                try:
                    keep, n, stamp = self._read_local(digest, path, size, h)
                except FileNotFoundError:
                    # a gc killed while it had the blob renamed aside: back, and read once more
                    if not self.store.recover_set_aside(digest):
                        raise
                    h = blob_hasher()
                    keep, n, stamp = self._read_local(digest, path, size, h)
        except FileNotFoundError:
            raise self._bad(digest, "is missing from the store") from None
        except OSError as e:
            raise CheckpointError(
                f"checkpoint {self.m.id}: cannot read blob {digest[:12]}: {e.strerror or e}"
            ) from None
        if n != size or h.hexdigest() != digest:
            goodblobs.forget(self.store.url, digest)  # never reused: the next write rewrites it
            if n != size:
                raise self._bad(digest, f"has the wrong size ({n} != {size})")
            raise self._bad(digest, "is corrupt (digest mismatch)")
        goodblobs.remember(self.store.url, digest, stamp)
        self.data[digest] = keep

    def _read_local(self, digest: str, path: str, size: int,
                    h: Any) -> tuple[Any, int, goodblobs.Stamp | None]:
        # one descriptor, no link followed; a private writable buffer (restored arrays and
        # tensors use it zero-copy and stay writable)
        if not self.store.inside(path):
            raise self._bad(digest, "is behind a link out of the store")
        fd = open_regular(path)
        try:
            st = os.fstat(fd)
            n = st.st_size
            if n != size:
                raise self._bad(digest, f"has the wrong size ({n} != {size})")
            with contextlib.suppress(AttributeError, OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            buf = _private_buffer(n)
            mv = memoryview(buf)
            if n > CHUNK and isinstance(buf, mmap.mmap):
                # big blobs: O_DIRECT, several reads in flight, hashed as they land
                got = directio.read_file(fd, path, mv, n, h, self._tick)
            else:
                got = 0
                while got < n:
                    r = os.readv(fd, [mv[got:]])
                    if not r:
                        break
                    h.update(mv[got : got + r])
                    got += r
                    self._tick(r)
            del mv
            if got == n and os.pread(fd, 1, n):
                got += 1  # grew while we read: the size check below refuses it
            # the file as it was before the read, unless it changed meanwhile
            after = os.fstat(fd)
            same = (after.st_mtime_ns, after.st_ctime_ns) == (st.st_mtime_ns, st.st_ctime_ns)
            stamp = self.store.blob_stamp(digest, st) if same else None
        finally:
            os.close(fd)
        return buf, got, stamp

    def _read_remote(self, digest: str, path: str, size: int, h: Any) -> tuple[Any, int]:
        # streamed by ranges into one private buffer, hashed as it lands: the buffer that is
        # verified is the one that is loaded (no second read, no copy)
        fs = self.store.fs
        n = int(fs.size(path))
        if n != size:
            raise self._bad(digest, f"has the wrong size ({n} != {size})")
        buf = _private_buffer(size)
        assert self.store.budget is not None  # set for every object store
        got = objectstore.download(fs, path, size, h, buf, self.store.budget, self._tick)
        return buf, got

    def run(self, digests: list[str]) -> None:
        big = [d for d in digests if self.m.blobs.get(d, {}).get("size", 0) >= PARALLEL_MIN]
        small = [d for d in digests if d not in set(big)]
        for d in small:
            self.verify(d)
        if big:
            with cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="jp-verify") as pool:
                futs = {pool.submit(self.verify, d) for d in big}
                pending = futs
                while pending:
                    done, pending = cf.wait(pending, timeout=0.1, return_when=cf.FIRST_EXCEPTION)
                    for f in done:
                        err = f.exception()
                        if err is not None:
                            for p in pending:
                                p.cancel()
                            raise err
                    self.report()
        self.report()

    def report(self) -> None:
        if self.progress:
            try:
                self.progress(min(self.done, self.total), self.total)
            except Exception:  # noqa: BLE001 - a broken progress display must not fail a restore
                self.progress = None


def _private_buffer(n: int) -> Any:
    """Writable memory of ``n`` bytes owned by this process. Big ones are anonymous mappings:
    bytearray(n) zero-fills every page in user space first, which made restores ~2x slower than
    a plain read; the kernel's zero pages are filled lazily by the read itself. Anonymous, so
    nothing of the file is shared with the mapping: later changes to the file cannot show."""
    if n >= PARALLEL_MIN and hasattr(mmap, "MAP_ANONYMOUS"):
        return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return bytearray(n)


def _remember(store: Store, m: Any, g: dict[str, Any], storages: dict[int, Any]) -> None:
    """Tell the process's write caches which pack entries came back as storages (on the device
    they were recorded on): the next write reuses those whose bytes still hash the same."""
    entries = []
    for ti in g["tensors"]:
        us, te = storages.get(ti), m.tensors[ti]
        if us is not None and isinstance(te, dict) and str(us.device) == te.get("device"):
            entries.append(te)
    if entries:
        remember_restored(store.url, entries)


def read(
    store: Store | str | None,
    *,
    key: bytes,
    stream: str = "default",
    checkpoint_id: str | None = None,
    device: str = "auto",
    only: Iterable[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    process_state: bool = False,
    before_values: Callable[[Manifest], None] | None = None,
) -> ReadResult:
    """Load a checkpoint (the newest of ``stream`` by default). Everything needed is verified
    (manifest HMAC, every blob's digest) before anything is unpickled; the values come back in
    ``values`` for the caller to merge. ``process_state``: put the process state the checkpoint
    holds back (:mod:`.procstate`) once all is verified and before any value is rebuilt;
    ``before_values(manifest)`` runs then too (the kernel binds the notebook's modules, which
    a ``__setstate__`` defined in the notebook looks up as it rebuilds a value)."""
    t0 = time.monotonic()
    if not isinstance(store, Store):
        store = open_store(store)
    if not key:
        raise CheckpointError("no checkpoint key given: a checkpoint is verified with its key "
                              "before anything in it is unpickled")
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise CheckpointError(f"unknown device policy {device!r} (use auto, cpu or cuda:N)")
    m, skipped = store.choose(key, stream, checkpoint_id)
    want = None if only is None else list(dict.fromkeys(only))
    wanted = set(want) if want is not None else None
    chosen = [v for v in m.variables if wanted is None or v["name"] in wanted]
    gids = sorted({v["group"] for v in chosen if v["status"] == "saved"})
    groups = []
    for gi in gids:
        try:
            groups.append((gi, m.groups[gi]))
        except (IndexError, TypeError):
            raise IntegrityError(f"checkpoint {m.id}: manifest is inconsistent") from None
    digests: dict[str, None] = {}
    for _, g in groups:
        digests[g["stream"]["blob"]] = None
        for b in g["buffers"]:
            digests[b] = None
        for ti in g["tensors"]:
            digests[m.tensors[ti]["blob"]] = None
    needs_torch = any(g["tensors"] for _, g in groups)
    forced = _tensors.resolve_device(device) if needs_torch else None
    total = sum(int(m.blobs.get(d, {}).get("size", 0)) for d in digests)
    ver = _Verifier(store, m, progress, total)
    ver.report()
    ver.run(list(digests))  # raises before any unpickling
    proc = procstate.restore(m.process) if process_state else []  # e.g. sys.path first
    if before_values is not None:
        before_values(m)

    warnings = _env.mismatches(m.env, needs_torch)
    if skipped:
        # a forged or damaged newest file must not block the way back: say what was passed over
        warnings.append(
            f"skipped {len(skipped)} newer unverifiable checkpoint file(s), restored the newest "
            f"authentic one ({m.id}): " + "; ".join(u["reason"] for u in skipped[:3])
        )
    mapped: dict[tuple[str, str], list[int]] = {}
    storages: dict[int, Any] = {}
    packs = _tensors.PackReader(lambda d: _tensors.open_pack_buffer(ver.data[d]))
    values: dict[str, Any] = {}
    load_notes: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    given: set[str] = {m.tensors[ti]["blob"] for _, g in groups for ti in g["tensors"]}
    try:
        for _gi, g in groups:

            def resolver(idx: int, g: dict[str, Any] = g) -> Any:
                ti = g["tensors"][idx]
                us = storages.get(ti)
                if us is None:
                    te = m.tensors[ti]
                    dev = _tensors.target_device(te["device"], forced)
                    if dev != te["device"]:
                        mapped.setdefault((te["device"], dev), []).append(int(te["nbytes"]))
                    us = storages[ti] = packs.storage(te, dev)
                return us

            s = g["stream"]
            blob = ver.data[s["blob"]]
            stream_mv = memoryview(blob)[s["offset"] : s["offset"] + s["length"]]
            buffers = _group_buffers(g, ver.data, given)
            try:
                got, group_notes = load_group(stream_mv, g["pickler"], buffers, resolver)
            except Exception as e:  # noqa: BLE001 - e.g. a module missing here
                for n in g["names"]:
                    failed[n] = reason_of(e)
                continue
            for n in g["names"]:
                if wanted is None or n in wanted:
                    values[n] = got[n]
                    if n in group_notes:
                        load_notes[n] = group_notes[n]
            if g["tensors"]:
                _remember(store, m, g, storages)
    finally:
        packs.close()

    for (src, dst), sizes in sorted(mapped.items()):
        why = "no CUDA here" if forced is None else f"device={device}"
        warnings.append(
            f"{len(sizes)} tensor storage(s) ({sum(sizes) / 2**20:.1f} MiB) on {src} "
            f"mapped to {dst}: {why}"
        )
    reports = []
    for v in chosen:
        n = v["name"]
        if v["status"] == "saved":
            st, reason = ("failed", failed[n]) if n in failed else ("restored", None)
        else:
            st, reason = v["status"], v.get("reason")
        reports.append(VariableReport(n, v["kind"], v["size"], st, reason, v.get("cell")))
    for n in want or ():
        if m.variable(n) is None:
            reports.append(VariableReport(n, "", 0, "failed", "not in this checkpoint", None))
    return ReadResult(
        values=values,
        variables=reports,
        warnings=warnings,
        manifest=m,
        bytes_read=total,
        seconds=time.monotonic() - t0,
        process_state=proc,
        load_notes=load_notes,
    )


def _group_buffers(g: dict[str, Any], data: dict[str, Any], given: set[str]) -> list[Any]:
    """A group's out-of-band buffers. A blob is stored once for equal bytes, so two arrays that
    only had equal contents (np.zeros twice) would come back as one memory, a write to one
    showing in the other: a blob given out before is copied. Unless the writer says the two
    buffers were one memory (``buffer_memory``: each names the first of its memory); that
    claim from the manifest only ever shares bytes that are equal anyway."""
    digests = g["buffers"]
    same = g.get("buffer_memory")
    if not (isinstance(same, list) and len(same) == len(digests)):
        same = list(range(len(digests)))
    out: list[Any] = []
    for i, d in enumerate(digests):
        j = same[i]
        if type(j) is int and 0 <= j < i and digests[j] == d:
            out.append(out[j])
        else:
            out.append(bytearray(data[d]) if d in given else data[d])
            given.add(d)
    return out
