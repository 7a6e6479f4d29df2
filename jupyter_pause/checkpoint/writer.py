"""write(): a namespace -> a checkpoint (blobs first, the signed manifest last).

Just over 400 lines: the steps of one write (grouping, pickling, packs, publication) share its
run state and read best in order; the blob pool and tensor packs live in their own modules.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import json
import logging
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from . import env as _env
from . import procstate
from .blobpool import BlobPool
from .cache import WriteCache, add_entry
from .errors import CheckpointError
from .graph import Walk, group_variables
from .manifest import FORMAT, Manifest, VariableReport, WriteResult, sign
from .outcomes import SkipVariable
from .packs import TensorPacks
from .pickling import OOB_MIN, dump_group_frames, reason_of
from .retention import retain
from .store import Store, open_store
from .timelimit import call_with_limit

log = logging.getLogger(__name__)

BUNDLE_MAX = 1 << 20  # pickle streams below this share one blob (one file, one fsync)
# Like IPython's %who: names starting with "_" (output cache, _i1, the extension's own helpers)
# and IPython's helpers are not user variables. ``include`` can still name them.
_HIDDEN = frozenset({"In", "Out", "get_ipython", "exit", "quit"})
_FATAL = (KeyboardInterrupt, SystemExit, MemoryError)  # never taken for one variable's failure


def new_checkpoint_id() -> str:
    now = datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)


def select_names(
    namespace: Mapping[str, Any], include: Iterable[str] | None, exclude: Iterable[str] | None
) -> list[str]:
    if include is not None:
        names = [n for n in dict.fromkeys(include) if n in namespace]
    else:
        names = [n for n in namespace if not n.startswith("_") and n not in _HIDDEN]
    ex = set(exclude or ())
    return [n for n in names if n not in ex]


def write(
    namespace: Mapping[str, Any],
    store: Store | str | None,
    *,
    key: bytes,
    stream: str = "default",
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    max_size: int | None = None,
    provenance: Mapping[str, dict[str, Any]] | None = None,
    liveness: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    cache: WriteCache | None = None,
    keep: int | None = 5,
    protect: Iterable[str] = (),
    unit_timeout: float | None = None,
    process_state: bool | Mapping[str, Any] = False,
    done_with: Callable[[list[Any]], None] | None = None,
) -> WriteResult:
    """Checkpoint ``namespace`` into ``store``. Never fails because one variable cannot be saved:
    such variables are reported as skipped/stale with a reason. Raises CheckpointError (e.g.
    StorageFullError) only when the checkpoint as a whole could not be written; then nothing of it
    remains and earlier checkpoints are untouched.

    ``keep``: checkpoints of ``stream`` kept afterwards (:func:`.retention.retain`; 0 or None: no
    count limit, nothing deleted); ``protect``: ids it must never delete (e.g. the checkpoints
    the server's pause depends on). ``process_state``: also keep the process's state
    (:mod:`.procstate`), signed with the manifest. ``done_with(storages)``: called with CPU
    storages the write reuses by reference and will not read again, as soon as that is sure (a
    forked writer gives their memory back early, see ``kernel.forkwrite``)."""
    t0 = time.monotonic()
    if not isinstance(store, Store):
        store = open_store(store)
    if not key:
        raise CheckpointError("no checkpoint key given")
    items = [(n, namespace[n]) for n in select_names(namespace, include, exclude)]
    ckpt_id = new_checkpoint_id()
    # before anything of ours runs; True: capture it here, a mapping: captured by the caller
    proc = dict(process_state) if isinstance(process_state, Mapping) else (
        procstate.capture() if process_state else {})
    if cache is not None:
        cache.bind(store.url)
    txn = store.begin(ckpt_id)
    pool = BlobPool(store, txn, cache, progress, 0)
    try:
        # big plain arrays start hashing/writing now, overlapping the walk and the pickling
        prewritten = _prewrite_arrays(pool, items, max_size)
        # the walk runs under the same per-variable limit as the pickling (a deep structure
        # must not hold the checkpoint), and ticks progress with the array bytes found so far
        walk = group_variables(items, namespace, time_limit=unit_timeout,
                               tick=lambda big: _walk_progress(pool, big))
    except BaseException:
        try:
            pool.shutdown()
        finally:
            txn.abort()  # even when a second interruption lands in the shutdown
        raise
    pool.estimate = sum(walk.big_bytes.values())
    units = _Units(namespace, pool, walk, prewritten, cache, max_size, unit_timeout, done_with)
    try:
        pool.report(force=True)
        units.save_all()
        orphans = units.finish()
        manifest = units.manifest(ckpt_id, stream, items, provenance or {}, liveness, meta)
        manifest.process = proc
        data = sign(manifest, key)
        # object stores: what this write reuses is named where a gc looks, then checked there
        store.record_claims(txn, set(manifest.blobs) - txn.created)
        store.sync(txn)
        store.publish(txn, stream, data)
    except BaseException:
        try:
            pool.shutdown()
        finally:
            txn.abort()
        raise
    pool.shutdown()
    txn.release()
    txn.drop_created(orphans & txn.created)
    if cache is not None:
        units.update_cache(cache)
    warnings = _retain(store, stream, keep, key, protect)
    if pool.progress:
        pool.last_report = 0.0
        pool.done = pool.known = manifest.bytes_total
        pool.estimate = 0
        pool.report(force=True)
    return WriteResult(
        manifest=manifest,
        checkpoint_id=ckpt_id,
        bytes_written=txn.bytes_written,
        bytes_total=manifest.bytes_total,
        variables=[
            VariableReport(v["name"], v["kind"], v["size"], v["status"], v["reason"], v["cell"])
            for v in manifest.variables
        ],
        seconds=time.monotonic() - t0,
        warnings=warnings,
        process_state=procstate.captured(proc),
    )


class _Units:
    """The units (groups of linked variables) of one write: pickled one at a time, their streams
    and buffers handed to the blob pool, their storages to the tensor packs; and what the
    manifest will say of each variable."""

    def __init__(self, namespace: Mapping[str, Any], pool: BlobPool, walk: Walk,
                 prewritten: dict[tuple[Any, ...], cf.Future[Any]], cache: WriteCache | None,
                 max_size: int | None, unit_timeout: float | None,
                 done_with: Callable[[list[Any]], None] | None = None) -> None:
        self.namespace, self.pool, self.walk = namespace, pool, walk
        self.prewritten, self.max_size, self.unit_timeout = prewritten, max_size, unit_timeout
        self.status: dict[str, tuple[str, str | None]] = {}
        self.var_group: dict[str, int] = {}
        self.var_size: dict[str, int] = {}
        self.groups: list[dict[str, Any]] = []  # the manifest's groups
        self.bundle: list[tuple[dict[str, Any], bytes]] = []  # small streams, one blob at the end
        self.storages: dict[int, int] = {}  # storage _cdata -> index into the manifest's tensors
        # every storage keyed above, alive until the write ends: a temporary one (a copy a
        # __getstate__ made) freed after its unit could leave its _cdata to another unit's
        # storage, which would then be taken for it
        self.held: list[Any] = []
        self.packs = TensorPacks(pool, cache)
        self.tensor_entries: list[dict[str, Any]] = []
        if done_with is not None:
            # memory read later: out-of-band buffers (the pool reads them; more come with each
            # unit) and memory two arrays or storages share (the walk's)
            self.packs.give_back = done_with
            for a, n in [*prewritten, *((lo, hi - lo) for lo, hi in walk.overlaps)]:
                self.packs.read_later(a, n)

    # -- pickling ------------------------------------------------------------------------------
    def save_all(self) -> None:
        # a forked writer: reused storages' memory given back before the pickling starts
        self.packs.prehash(self.walk.storages)
        # groups holding large arrays/tensors first: their writes then overlap the pickling of
        # object-heavy groups (which is CPU-bound)
        big = self.walk.big_bytes
        for n, reason in self.walk.skipped.items():
            self.status[n] = ("skipped", reason)
        for names in sorted(self.walk.groups, key=lambda g: -sum(big.get(n, 0) for n in g)):
            est = sum(big.get(n, 0) for n in names)
            if self.max_size is not None and est > self.max_size:
                self._skip(names, est)
                continue
            self._save_group(names)

    def _dump(self, names: list[str]) -> tuple[Any, ...]:
        # unit_timeout: a unit still pickling after it is skipped with that reason
        group = {n: self.namespace[n] for n in names}
        return call_with_limit(self.unit_timeout, dump_group_frames, group,
                               array_ids=self.walk.array_ids, shared_mem=self.walk.shared_mem,
                               shared=self.walk.shared_arrays,
                               tree=len(names) == 1 and names[0] in self.walk.trees)

    def _fail(self, name: str, e: BaseException) -> None:
        st = e.status if isinstance(e, SkipVariable) else "skipped"
        self.status[name] = (st, reason_of(e))

    def _skip(self, names: list[str], nbytes: int) -> None:
        for n in names:
            self.status[n] = ("skipped",
                              f"{_mb(nbytes)} exceeds the size limit {_mb(self.max_size or 0)}")

    def _save_group(self, names: list[str]) -> None:
        """Save linked variables as one unit; when that fails, isolate the variables that fail
        and keep the others together (or, failing that too, one by one)."""
        try:
            self._save_unit(names, *self._dump(names))
            return
        except _FATAL:
            raise
        except BaseException as e:  # noqa: BLE001 - any pickling failure isolates the group
            if len(names) == 1:
                self._fail(names[0], e)
                return
        good = []
        for n in names:
            try:
                good.append((n, self._dump([n])))
            except _FATAL:
                raise
            except BaseException as e:  # noqa: BLE001
                self._fail(n, e)
        if len(good) > 1:
            try:
                together = [n for n, _ in good]
                self._save_unit(together, *self._dump(together))
                return
            except _FATAL:
                raise
            except BaseException:  # noqa: BLE001, S110 - then save them one by one
                pass
        for n, r in good:
            self._save_unit([n], *r)

    def _save_unit(self, names: list[str], frames: Any, pickler: str, ctx: Any) -> None:
        gi = len(self.groups)
        size = frames.size
        nbytes = size + sum(mv.nbytes for mv in ctx.buffers)
        nbytes += sum(us.nbytes() for us in ctx.storages if us._cdata not in self.storages)
        if self.max_size is not None and nbytes > self.max_size:
            self._skip(names, nbytes)
            return
        addresses = [_address(mv) for mv in ctx.buffers]
        if self.packs.give_back is not None:
            for at, nb in addresses:  # before the unit's storages are hashed
                self.packs.read_later(at, nb)
        entry: dict[str, Any] = {
            "names": names,
            "pickler": pickler,
            "stream": None,
            "buffers": [],
            "tensors": self._tensor_indices(ctx),
        }
        self.groups.append(entry)
        share = size // len(names)
        for n in names:
            self.status[n] = ("saved", None)
            self.var_group[n] = gi
            self.var_size[n] = (nbytes if len(names) == 1
                                else self.walk.big_bytes.get(n, 0) + share)
        if size < BUNDLE_MAX:
            self.bundle.append((entry, frames.getvalue()))
        else:  # its frames as they are: joining them would copy the stream once more
            f = self.pool.put(frames.parts, "pickle", size)
            entry["stream"] = {"future": f, "offset": 0, "length": size}
        entry["buffers"] = [
            self.prewritten.pop(at, None) or self.pool.put([mv], "buffer", mv.nbytes)
            for at, mv in zip(addresses, ctx.buffers, strict=True)
        ]
        # buffers of one memory (two views saved as copies of the same bytes): each names the
        # first, and they come back as one memory; equal bytes from two memories do not
        # (the unit's buffers are all alive now, so one address is one memory)
        first: dict[tuple[Any, ...], int] = {}
        entry["buffer_memory"] = [first.setdefault(at, i) for i, at in enumerate(addresses)]
        self.packs.flush(final=False)
        self.pool.report()

    def _tensor_indices(self, ctx: Any) -> list[int]:
        """Indices into the manifest's tensors of the unit's storages (a storage shared with an
        earlier unit is stored once)."""
        out = []
        for us, dt in zip(ctx.storages, ctx.storage_dtype, strict=False):
            g = self.storages.get(us._cdata)
            if g is None:
                g = self.storages[us._cdata] = self.packs.add(us, dt)
                self.held.append(us)
            out.append(g)
        return out

    # -- after the last unit -------------------------------------------------------------------
    def finish(self) -> set[str]:
        """Write the bundle and the last packs, wait for every blob, put the digests in place;
        returns the blobs written but referenced by nothing (removed once published)."""
        if self.bundle:
            chunks, off = [], 0
            for entry, data in self.bundle:
                entry["stream"] = {"offset": off, "length": len(data)}
                chunks.append(data)
                off += len(data)
            bf = self.pool.put(chunks, "bundle", off)
            for entry, _ in self.bundle:
                entry["stream"]["future"] = bf
        self.packs.flush(final=True)
        self.tensor_entries = self.packs.entries
        self.pool.wait()
        for entry in self.groups:
            s = entry["stream"]
            s["blob"] = s.pop("future").result()
            entry["buffers"] = [f.result() for f in entry["buffers"]]
        for te in self.tensor_entries:
            if isinstance(te.get("blob"), cf.Future):
                te["blob"] = te["blob"].result()
        # a pre-written array whose variable was then skipped: left out of the manifest
        used = {e["stream"]["blob"] for e in self.groups}
        used |= {b for e in self.groups for b in e["buffers"]}
        used |= {te["blob"] for te in self.tensor_entries}
        orphans = set(self.pool.blobs) - used
        for d in orphans:
            self.pool.blobs.pop(d)
        return orphans

    def manifest(self, ckpt_id: str, stream: str, items: list[tuple[str, Any]],
                 provenance: Mapping[str, dict[str, Any]], liveness: Mapping[str, Any] | None,
                 meta: Mapping[str, Any] | None) -> Manifest:
        variables = []
        for n, v in items:
            st, reason = self.status.get(n, ("skipped", "not processed"))
            variables.append({
                "name": n,
                "kind": type(v).__name__,
                "size": self.var_size.get(n, self.walk.big_bytes.get(n, 0)),
                "status": st,
                "reason": reason,
                "group": self.var_group.get(n),
                "cell": _cell(provenance.get(n)),
            })
        blobs = self.pool.blobs
        return Manifest(
            id=ckpt_id,
            stream=stream,
            created=datetime.now(timezone.utc).isoformat(),
            format=FORMAT,
            env=_env.capture(),
            liveness=dict(liveness or {}),
            meta=_jsonable(dict(meta or {})),
            variables=variables,
            groups=self.groups,
            blobs=dict(sorted(blobs.items())),
            tensors=self.tensor_entries,
            bytes_total=sum(b["size"] for b in blobs.values()),
        )

    def update_cache(self, cache: WriteCache) -> None:
        """What the next write may reuse: this one's chunks and storage hashes."""
        cache.chunks = dict(self.pool.new_chunks)
        hashes: dict[str, list[dict[str, Any]]] = {}
        for te in self.tensor_entries:
            add_entry(hashes, te)
        cache.storage_hashes = hashes
        cache.pack_of = {a: te["blob"] for gi, a in self.packs.addresses.items()
                         if isinstance((te := self.tensor_entries[gi]).get("blob"), str)}


def _retain(store: Store, stream: str, keep: int | None, key: bytes,
            protect: Iterable[str]) -> list[str]:
    """Retention after a published write; its problems are warnings (the checkpoint is safe and
    gc can clean up later)."""
    if not keep:
        return []  # no count limit: nothing to delete
    warnings = []
    try:
        skipped: list[dict[str, str]] = []
        retain(store, stream, keep, key=key, protect=protect, skipped=skipped)
        if skipped:
            warnings.append(
                f"{len(skipped)} unverifiable file(s) in this notebook's checkpoint folder "
                f"left alone (e.g. {skipped[0]['path']}: {skipped[0]['reason']})"
            )
    except Exception as e:  # noqa: BLE001 - the checkpoint is safe; gc() can clean up
        warnings.append(f"retention clean-up failed: {reason_of(e)}")
    return warnings


def _walk_progress(pool: BlobPool, big: int) -> None:
    pool.estimate = big
    pool.report()


def _address(mv: memoryview) -> tuple[int, int]:
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(mv)), mv.nbytes
    except TypeError:  # read-only buffer
        np = sys.modules.get("numpy")
        if np is None:
            return (id(mv), -1)
        return np.frombuffer(mv, dtype=np.uint8).ctypes.data, mv.nbytes


def _prewrite_arrays(pool: BlobPool, items: list[Any], max_size: int | None) -> dict[tuple[Any, ...], cf.Future[Any]]:
    """Start writing the buffers of large, self-owned numpy arrays held directly by variables.

    Their bytes are what pickle will hand out of band anyway; matched by address later."""
    np = sys.modules.get("numpy")
    out: dict[tuple[Any, ...], cf.Future[Any]] = {}
    if np is None:
        return out
    for _name, v in items:
        if (
            type(v) is np.ndarray
            and v.base is None
            and v.flags.c_contiguous
            and not v.dtype.hasobject
            and v.nbytes >= OOB_MIN
            and (max_size is None or v.nbytes <= max_size)
        ):
            mv = memoryview(v).cast("B")
            key = _address(mv)
            if key not in out:
                out[key] = pool.put([mv], "buffer", mv.nbytes)
    return out


def _cell(p: Any) -> dict[str, Any] | None:
    if not p:
        return None
    return {"execution_count": p.get("execution_count"), "source": p.get("source")}


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(d, default=str))
    return out


def _mb(n: int) -> str:
    """Bytes in the unit that shows them (``--max-size 1K`` must not read "0.0 MiB"); the
    checkpoint library imports nothing of ours, so not jupyter_pause.units."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
