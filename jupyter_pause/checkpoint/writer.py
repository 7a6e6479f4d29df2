"""write(): a namespace -> a checkpoint (blobs first, the signed manifest last)."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from . import env as _env
from . import tensors as _tensors
from .cache import WriteCache
from .errors import CheckpointError
from .graph import group_variables
from .manifest import FORMAT, Manifest, VariableReport, WriteResult, sign
from .pickling import OOB_MIN, SkipVariable, dump_group, reason_of
from .store import Store, open_store
from .timelimit import call_with_limit

log = logging.getLogger(__name__)

BUNDLE_MAX = 1 << 20  # pickle streams below this share one blob (one file, one fsync)
SHARD_MIN = 64 << 20  # below this, new tensors go into a single pack
# Like IPython's %who: names starting with "_" (output cache, _i1, the extension's own helpers)
# and IPython's helpers are not user variables. ``include`` can still name them.
_HIDDEN = frozenset({"In", "Out", "get_ipython", "exit", "quit"})


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


def _kind(v: Any) -> str:
    t = type(v)
    return t.__name__


class _Run:
    """State of one write: a 2-thread pool for blob writes, progress counters, manifest parts."""

    def __init__(
        self,
        store: Store,
        txn: Any,
        cache: WriteCache | None,
        progress: Callable[[int, int], None] | None,
        estimate: int,
    ) -> None:
        self.store, self.txn, self.cache = store, txn, cache
        self.pool = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="jp-ckpt")
        self.futures: list[cf.Future] = []
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
        self, chunks: Iterable | Callable[[], Iterable], kind: str, size: int, cached: bool = True
    ) -> cf.Future:
        """Write a blob in the pool; the future gives its digest."""
        self.known += size

        def job() -> str:
            x = None
            if cached and self.cache is not None:
                import xxhash

                h = xxhash.xxh3_128()
                for c in chunks:
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


def write(
    namespace: Mapping[str, Any],
    store: Store | str | None,
    *,
    key: bytes,
    stream: str = "default",
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    max_size: int | None = None,
    provenance: Mapping[str, dict] | None = None,
    liveness: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    cache: WriteCache | None = None,
    keep: int | None = 5,
    protect: Iterable[str] = (),
    unit_timeout: float | None = None,
) -> WriteResult:
    """Checkpoint ``namespace`` into ``store``. Never fails because one variable cannot be saved:
    such variables are reported as skipped/stale with a reason. Raises CheckpointError (e.g.
    StorageFullError) only when the checkpoint as a whole could not be written; then nothing of it
    remains and earlier checkpoints are untouched.

    ``keep``: retention afterwards (see :func:`retain`); ``protect``: ids it must never delete
    (e.g. the checkpoints the server's pause depends on)."""
    t0 = time.monotonic()
    if not isinstance(store, Store):
        store = open_store(store)
    if not key:
        raise CheckpointError("no checkpoint key given")
    provenance = provenance or {}
    names = select_names(namespace, include, exclude)
    items = [(n, namespace[n]) for n in names]
    ckpt_id = new_checkpoint_id()
    if cache is not None:
        cache.bind(store.url)
    txn = store.begin(ckpt_id)
    run = _Run(store, txn, cache, progress, 0)
    try:
        # big plain arrays start hashing/writing now, overlapping the walk and the pickling
        prewritten = _prewrite_arrays(run, items, max_size)
        walk = group_variables(items, namespace)
    except BaseException:
        run.shutdown()
        txn.abort()
        raise
    run.estimate = sum(walk.big_bytes.values())
    status: dict[str, tuple[str, str | None]] = {}
    var_group: dict[str, int] = {}
    var_size: dict[str, int] = {}
    groups: list[dict[str, Any]] = []
    bundle: list[tuple[dict[str, Any], bytes]] = []
    storages: dict[int, int] = {}  # storage _cdata -> index into the manifest's tensors
    tw = _TensorWriter(run, cache)
    try:
        run.report(force=True)

        def save_unit(unames: list[str], stream_bytes: bytes, pickler: str, ctx: Any) -> None:
            gi = len(groups)
            nbytes = len(stream_bytes) + sum(mv.nbytes for mv in ctx.buffers)
            nbytes += sum(us.nbytes() for us in ctx.storages if us._cdata not in storages)
            if max_size is not None and nbytes > max_size:
                for n in unames:
                    status[n] = ("skipped", f"{_mb(nbytes)} exceeds the size limit {_mb(max_size)}")
                return
            seen: dict[int, list] = {}
            for t, v, cdata in ctx.tensors:
                seen.setdefault(cdata, []).append((t, v))
            tensor_idx = []
            for us, dt in zip(ctx.storages, ctx.storage_dtype):
                g = storages.get(us._cdata)
                if g is None:
                    g = storages[us._cdata] = tw.add(us, dt, seen.get(us._cdata, []))
                tensor_idx.append(g)
            entry: dict[str, Any] = {
                "names": unames,
                "pickler": pickler,
                "stream": None,
                "buffers": [],
                "tensors": tensor_idx,
            }
            groups.append(entry)
            for n in unames:
                status[n] = ("saved", None)
                var_group[n] = gi
                share = len(stream_bytes) // len(unames)
                var_size[n] = nbytes if len(unames) == 1 else walk.big_bytes.get(n, 0) + share
            if len(stream_bytes) < BUNDLE_MAX:
                bundle.append((entry, stream_bytes))
            else:
                f = run.put([stream_bytes], "pickle", len(stream_bytes))
                entry["stream"] = {"future": f, "offset": 0, "length": len(stream_bytes)}
            entry["buffers"] = [
                prewritten.pop(_address(mv), None) or run.put([mv], "buffer", mv.nbytes)
                for mv in ctx.buffers
            ]
            tw.flush(final=False)
            run.report()

        def dump(group: dict[str, Any], **kw: Any) -> Any:
            # unit_timeout: a unit still pickling after it is skipped with that reason
            return call_with_limit(unit_timeout, dump_group, group, **kw)

        def fail(n: str, e: BaseException) -> None:
            st = e.status if isinstance(e, SkipVariable) else "skipped"
            status[n] = (st, reason_of(e))

        # groups holding large arrays/tensors first: their writes then overlap the pickling of
        # object-heavy groups (which is CPU-bound)
        order = sorted(walk.groups, key=lambda g: -sum(walk.big_bytes.get(n, 0) for n in g))
        for gnames in order:
            if max_size is not None:
                est = sum(walk.big_bytes.get(n, 0) for n in gnames)
                if est > max_size:
                    for n in gnames:
                        status[n] = (
                            "skipped",
                            f"{_mb(est)} exceeds the size limit {_mb(max_size)}",
                        )
                    continue
            try:
                save_unit(
                    gnames, *dump({n: namespace[n] for n in gnames}, array_ids=walk.array_ids)
                )
                continue
            except (KeyboardInterrupt, SystemExit, MemoryError):
                raise
            except BaseException as e:  # noqa: BLE001 - any pickling failure isolates the group
                if len(gnames) == 1:
                    fail(gnames[0], e)
                    continue
            # one of several linked variables failed: find which, keep the others together
            good = []
            for n in gnames:
                try:
                    good.append((n, dump({n: namespace[n]}, array_ids=walk.array_ids)))
                except (KeyboardInterrupt, SystemExit, MemoryError):
                    raise
                except BaseException as e:  # noqa: BLE001
                    fail(n, e)
            if len(good) > 1:
                try:
                    save_unit(
                        [n for n, _ in good],
                        *dump({n: namespace[n] for n, _ in good}, array_ids=walk.array_ids),
                    )
                    continue
                except (KeyboardInterrupt, SystemExit, MemoryError):
                    raise
                except BaseException:  # noqa: BLE001, S110 - then save them one by one
                    pass
            for n, r in good:
                save_unit([n], *r)

        # small streams: one bundle blob
        if bundle:
            chunks, off = [], 0
            for entry, data in bundle:
                entry["stream"] = {"offset": off, "length": len(data)}
                chunks.append(data)
                off += len(data)
            bf = run.put(chunks, "bundle", off)
            for entry, _ in bundle:
                entry["stream"]["future"] = bf

        tw.flush(final=True)
        tensor_entries, new_memos = tw.entries, _Memos(tw.final_memos(), cache)
        run.wait()

        for entry in groups:
            s = entry["stream"]
            s["blob"] = s.pop("future").result()
            entry["buffers"] = [f.result() for f in entry["buffers"]]
        for te in tensor_entries:
            if isinstance(te.get("blob"), cf.Future):
                te["blob"] = te["blob"].result()

        # blobs written but referenced by nothing (a pre-written array whose variable was then
        # skipped): left out of the manifest and removed once it is published
        used = {e["stream"]["blob"] for e in groups} | {b for e in groups for b in e["buffers"]}
        used |= {te["blob"] for te in tensor_entries}
        orphans = set(run.blobs) - used
        for d in orphans:
            run.blobs.pop(d)
        variables = []
        for n, v in items:
            st, reason = status.get(n, ("skipped", "not processed"))
            variables.append(
                {
                    "name": n,
                    "kind": _kind(v),
                    "size": var_size.get(n, walk.big_bytes.get(n, 0)),
                    "status": st,
                    "reason": reason,
                    "group": var_group.get(n),
                    "cell": _cell(provenance.get(n)),
                }
            )
        manifest = Manifest(
            id=ckpt_id,
            stream=stream,
            created=datetime.now(timezone.utc).isoformat(),
            format=FORMAT,
            env=_env.capture(),
            liveness=dict(liveness or {}),
            meta=_jsonable(dict(meta or {})),
            variables=variables,
            groups=groups,
            blobs=dict(sorted(run.blobs.items())),
            tensors=tensor_entries,
            bytes_total=sum(b["size"] for b in run.blobs.values()),
        )
        data = sign(manifest, key)
        store.sync(txn)
        store.publish(txn, stream, data)
    except BaseException:
        run.shutdown()
        txn.abort()
        raise
    run.shutdown()
    txn.release()
    for d in orphans & txn.created:
        store._remove(store.blob_path(d))

    if cache is not None:
        cache.chunks = dict(run.new_chunks)
        cache.storages = new_memos.finalize()
        cache.storage_hashes = {
            x: {k: v for k, v in tensor_entries[gi].items() if k != "key"}
            for gi, x in tw.hashes.items()
        }
    warnings = []
    if keep is not None:
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
    if run.progress:
        run.last_report = 0.0
        run.done = run.known = manifest.bytes_total
        run.estimate = 0
        run.report(force=True)
    res = WriteResult(
        manifest=manifest,
        checkpoint_id=ckpt_id,
        bytes_written=txn.bytes_written,
        bytes_total=manifest.bytes_total,
        variables=[
            VariableReport(v["name"], v["kind"], v["size"], v["status"], v["reason"], v["cell"])
            for v in variables
        ],
        seconds=time.monotonic() - t0,
    )
    res.warnings = warnings
    return res


class _TensorWriter:
    """Manifest tensor entries, aligned with the storages in the order pickling met them.

    Unchanged storages (per the cache) reuse their old pack entry by reference; new ones are
    written in packs of two shards (two threads, performance.md section 7) as soon as enough
    has accumulated, so pack writes overlap the pickling of the remaining groups.
    """

    def __init__(self, run: _Run, cache: WriteCache | None) -> None:
        self.run, self.cache = run, cache
        self.entries: list[dict[str, Any]] = []
        self.memos: dict[int, tuple] = {}  # storage _cdata -> (storage, tensors seen, index)
        self.pending: list[tuple[int, Any, str]] = []
        self.pending_bytes = 0
        self.reuse: dict[str, list[tuple[int, Any, str]]] = {}  # old pack -> unchanged storages
        self.hashes: dict[int, str] = {}  # index -> xxh3 of the storage (tensor_check="xxh3")

    def add(self, us: Any, dtype: str, seen: list) -> int:
        gi = len(self.entries)
        run, cache = self.run, self.cache
        old = None
        # no tensor with a version counter on this storage (inference-mode tensors have none,
        # or only the bare storage is referenced): fall back to hashing its bytes
        hashed = cache is not None and (
            cache.tensor_check == "xxh3" or (cache.tensor_check == "version" and not seen)
        )
        if hashed and us.device.type == "cpu":
            import xxhash

            x = self.hashes[gi] = xxhash.xxh3_128(_tensors.storage_bytes(us)).hexdigest()
            old = cache.storage_hashes.get(x)
            if old is not None and old.get("nbytes") != us.nbytes():
                old = None
        elif cache is not None and cache.tensor_check == "version":
            old = cache.unchanged_storage(us, seen)
        if old is not None and not run.has(old["blob"]):
            old = None
        if old is not None:
            # decided at the end: reused only if enough of the old pack is still in use
            self.entries.append(dict(old, key=f"t{gi}"))
            self.reuse.setdefault(old["blob"], []).append((gi, us, dtype))
        else:
            self.entries.append(self._new_entry(gi, us, dtype))
            self.pending.append((gi, us, dtype))
            self.pending_bytes += us.nbytes()
        if cache is not None:
            self.memos[us._cdata] = (us, seen, gi)
        return gi

    @staticmethod
    def _new_entry(gi: int, us: Any, dtype: str) -> dict[str, Any]:
        return {
            "key": f"t{gi}",
            "blob": None,
            "name": f"t{gi}",
            "device": _tensors.record_device(us),
            "dtype": dtype,
            "shape": [us.nbytes() // max(1, _itemsize(dtype))],
            "nbytes": us.nbytes(),
        }

    def _settle_reuse(self) -> None:
        """Reference an old pack only while at least half of it is still in use; otherwise
        rewrite its few unchanged storages, so a checkpoint never pins (and a restore never
        reads) a whole old pack for a handful of bytes. Bounds the waste at 2x."""
        run = self.run
        for blob, items in self.reuse.items():
            used = sum(us.nbytes() for _, us, _ in items)
            pack_size = self.entries[items[0][0]]["pack_size"]
            if used * 2 >= pack_size:
                run.blobs[blob] = {"size": pack_size, "kind": "tensors"}
                run.add_done(used)
                run.known += used
                continue
            for gi, us, dtype in items:
                self.entries[gi] = self._new_entry(gi, us, dtype)
                self.pending.append((gi, us, dtype))
                self.pending_bytes += us.nbytes()
        self.reuse.clear()

    def final_memos(self) -> dict[int, tuple]:
        return {c: (us, seen, self.entries[gi]) for c, (us, seen, gi) in self.memos.items()}

    def flush(self, final: bool) -> None:
        if final:
            self._settle_reuse()
        if not self.pending or (not final and self.pending_bytes < SHARD_MIN):
            return
        new, self.pending, total, self.pending_bytes = self.pending, [], self.pending_bytes, 0
        nshards = 2 if total >= SHARD_MIN and len(new) > 1 else 1
        shards: list[list] = [[] for _ in range(nshards)]
        loads = [0] * nshards
        for item in sorted(new, key=lambda t: -t[1].nbytes()):
            i = loads.index(min(loads))
            shards[i].append(item)
            loads[i] += item[1].nbytes()
        for shard in shards:
            layout = [(f"t{gi}", us, dt) for gi, us, dt in shard]
            head, _ = _tensors.pack_layout(layout)
            size = len(head) + sum(us.nbytes() for _, us, _ in shard)
            # a source, not a generator: object stores read it twice (name, then upload); device
            # storages are copied to host one at a time, in the writer thread
            f = self.run.put(lambda layout=layout: _tensors.pack_chunks(layout), "tensors", size,
                             cached=False)
            for gi, _, _ in shard:
                self.entries[gi]["blob"] = f
                self.entries[gi]["pack_size"] = size


class _Memos(dict):
    """Storage memos for the cache, built once the pack digests are known."""

    def __init__(self, raw: dict, cache: WriteCache | None) -> None:
        super().__init__()
        for cdata, (us, seen, e) in raw.items():
            if cache is None or e.get("blob") is None:
                continue
            self[cdata] = (us, seen, e)

    def finalize(self) -> dict:
        out = {}
        for cdata, (us, seen, e) in self.items():
            blob = e["blob"]
            if isinstance(blob, cf.Future):
                blob = blob.result()
            fixed = {k: v for k, v in e.items() if k != "key"}
            fixed["blob"] = blob
            out[cdata] = WriteCache.memo(us, seen, fixed)
        return out


def _address(mv: memoryview) -> tuple[int, int]:
    import ctypes

    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(mv)), mv.nbytes
    except TypeError:  # read-only buffer
        np = sys.modules.get("numpy")
        if np is None:
            return (id(mv), -1)
        return np.frombuffer(mv, dtype=np.uint8).ctypes.data, mv.nbytes


def _prewrite_arrays(run: _Run, items: list, max_size: int | None) -> dict[tuple, cf.Future]:
    """Start writing the buffers of large, self-owned numpy arrays held directly by variables.

    Their bytes are what pickle will hand out of band anyway; matched by address later."""
    np = sys.modules.get("numpy")
    out: dict[tuple, cf.Future] = {}
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
                out[key] = run.put([mv], "buffer", mv.nbytes)
    return out


def _itemsize(dtype: str) -> int:
    return _tensors._ST_DTYPES.get(dtype, ("U8", 1))[1]


def _cell(p: Any) -> dict[str, Any] | None:
    if not p:
        return None
    return {"execution_count": p.get("execution_count"), "source": p.get("source")}


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    import json

    return json.loads(json.dumps(d, default=str))


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def retain(
    store: Store,
    stream: str,
    keep: int,
    *,
    key: bytes | None = None,
    protect: Iterable[str] = (),
    skipped: list[dict[str, str]] | None = None,
) -> list[str]:
    """Delete all but the newest ``keep`` authentic manifests of ``stream`` and the blobs only
    they used.

    Only manifests that verify under ``key`` and sit in their own place are counted or deleted;
    anything else is left alone and listed in ``skipped``. Never deleted: ids in ``protect``,
    pinned ids (:meth:`Store.pin`), and the newest checkpoint a server pause wrote (signed
    ``meta.flight``): a pause depends on it even when another session of the notebook keeps
    checkpointing, and this runs in the kernel, which may not know the server's state.
    """
    key = key or store.key
    if not key:
        raise CheckpointError("retention needs the checkpoint key (it deletes checkpoints)")
    found = store.scan(stream, key=key)
    if skipped is not None:
        skipped.extend(found.unverified)
    for u in found.unverified:
        log.info("retention left %s alone: %s", u["path"], u["reason"])
    keep_ids = set(protect) | store.pinned()
    paused = next((m for m in found.verified if isinstance(m.meta, dict) and m.meta.get("flight")),
                  None)
    if paused is not None:
        keep_ids.add(paused.id)
    dropped, candidates = [], set()
    for m in found.verified[max(keep, 1) :]:
        if m.id in keep_ids:
            continue
        store._remove(store.manifest_path(m.stream, m.id))
        candidates.update(m.blobs)
        dropped.append(m.id)
    if candidates:
        store.collect(candidates)
    return dropped
