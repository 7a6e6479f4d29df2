"""Torch storages of one checkpoint as manifest tensor entries and safetensors packs."""

from __future__ import annotations

import bisect
import concurrent.futures as cf
import functools
from collections.abc import Callable
from typing import Any

from . import cache as _cache
from . import tensors
from .blobpool import BlobPool
from .cache import WriteCache

SHARD_MIN = 64 << 20  # below this, new tensors go into a single pack
GIVE_BACK_MIN = 64 << 10  # smaller storages are not worth a system call
PREHASH_THREADS = 2  # xxh3 runs at memory speed: more threads gain nothing on most machines


class TensorPacks:
    """Manifest tensor entries, aligned with the storages in the order pickling met them.

    Unchanged storages (per the cache) reuse their old pack entry by reference; new ones are
    written in packs of two shards as soon as enough has accumulated, so pack writes overlap
    the pickling of the remaining groups. Two shards on two threads write about a third faster
    than one file (one thread copies into the page cache while the other waits on writeback);
    more shards lose it again to sequential fsyncs. An object store's packs are further cut to
    at most its ``pack_max`` each.
    """

    def __init__(self, run: BlobPool, cache: WriteCache | None) -> None:
        self.run, self.cache = run, cache
        self.entries: list[dict[str, Any]] = []
        self.pending: list[tuple[int, Any, str]] = []
        self.pending_bytes = 0
        self.reuse: dict[str, list[tuple[int, Any, str]]] = {}  # old pack -> unchanged storages
        self.taken: set[tuple[Any, Any]] = set()  # (blob, name) of old entries given out
        self.sizes: set[int] | None = None  # sizes of the entries this write could reuse
        self.deferred: set[int] = set()  # entries hashed while written, not before
        # Giving memory back (a forked writer, see kernel.forkwrite): ``give_back(storages)``
        # gets each reused storage once the write will not read it again (see read_later).
        self.give_back: Callable[[list[Any]], None] | None = None
        self.read_starts: list[int] = []  # memory read later: disjoint, sorted intervals
        self.read_ends: list[int] = []
        self.unknown_reads = False
        self.used: dict[str, int] = {}  # old pack -> bytes of it this write reuses
        self.waiting: dict[str, list[Any]] = {}  # old pack (not yet sure to be kept) -> storages
        self.given: set[int] = set()  # _cdata of the storages given back
        # storage _cdata -> (xxh3, old entry or None), hashed before the pickling (prehash)
        self.early: dict[int, tuple[str, dict[str, Any] | None]] = {}
        self.addresses: dict[int, int] = {}  # entry index -> a CPU storage's address
        # A local store's old packs can be read back cheaply: a storage given back before its
        # pack is sure to be kept is then rewritten from there (tensors.StoredBytes), so no
        # give-back waits for the pack's fate. An object store's would be a download: there
        # storages wait until their pack is sure to be kept.
        self.from_store = bool(getattr(getattr(run, "store", None), "local", False))

    def add(self, us: Any, dtype: str) -> int:
        gi = len(self.entries)
        cache = self.cache
        x = old = None
        early = self.early.pop(us._cdata, None)
        if early is not None:
            x, old = early  # hashed before the pickling (prehash): its memory may be gone now
        elif (cache is None or cache.tensor_check == "xxh3") and us.device.type != "meta":
            # by content: a storage written through t.data, t.numpy() or .data of a parameter
            # has changed although its _version has not. Recorded even without a cache, so a
            # checkpoint taken after this one is restored can reuse what is unchanged.
            if cache is not None and us.nbytes() in self._reusable_sizes():
                x = tensors.storage_xxh3(us)
                old = self._old_entry(x, us)
            else:
                # nothing of this size to reuse (a first checkpoint): hashed as it is written,
                # so the pack's write starts now instead of after a pass over every storage
                self.deferred.add(gi)
        if us.device.type == "cpu":
            self.addresses[gi] = us.data_ptr()
        if old is not None:
            # one old entry per storage: two storages with equal bytes sharing one entry would
            # come back as one memory (a write through one shows in the other)
            self.taken.add((old.get("blob"), old.get("name")))
            # decided at the end: reused only if enough of the old pack is still in use
            self.entries.append(dict(old, key=f"t{gi}", xxh3=x))
            self.reuse.setdefault(old["blob"], []).append((gi, us, dtype))
            if self.give_back is not None and early is None:
                self._reused(old, us)
            elif self.give_back is not None and not _owned(us):
                self._reused(old, us, count=False)  # counted by prehash, given back only now
        else:
            self.entries.append(self._new_entry(gi, us, dtype, x))
            self.pending.append((gi, us, dtype))
            self.pending_bytes += us.nbytes()
            if self.give_back is not None and us.device.type == "cpu":
                self.read_later(us.data_ptr(), us.nbytes())
        return gi

    def _old_entry(self, x: str, us: Any) -> dict[str, Any] | None:
        """The old pack entry a storage of these bytes may reuse, if any."""
        assert self.cache is not None
        old = self.cache.storage_entry(x, us.nbytes(), self.taken)
        if old is not None and old.get("device") != tensors.record_device(us):
            return None  # same bytes, other device: the entry must say where it lives
        if old is not None and not self.run.has(old["blob"]):
            return None  # gone, or no longer known good: written again
        return old

    def prehash(self, storages: list[Any]) -> None:
        """A forked writer, before any pickling: hash the CPU storages the walk found that may
        be reused, and give back the memory of the unchanged ones as soon as that is safe (see
        _reused: at once in a local store, else once their old pack is sure to be kept),
        instead of after the pickling has met them all.

        Why: until then a cell that writes one of them copies it (see kernel.forkwrite). The
        storages are hashed grouped by the pack each was in last time (``cache.pack_of``: on an
        object store a pack is kept once half of it is known reused), on two threads (xxhash
        lets go of the interpreter lock). ``add`` takes each result: the memory may be gone by
        then.

        Only storages whose memory torch allocated itself are given back this early: one over
        other memory (``torch.frombuffer`` of a bytearray, ``from_numpy``, a restored pack) may
        share it with a buffer the pickling reads out of band before it meets the storage, so
        those wait until ``add``, as without prehash (see _Units._save_unit's read_later)."""
        cache = self.cache
        if (self.give_back is None or cache is None or cache.tensor_check != "xxh3"
                or not getattr(self.give_back, "before_pickling", True)):
            return
        sizes = self._reusable_sizes()
        todo, seen = [], set()
        for us in storages:
            if (us.device.type == "cpu" and us.nbytes() in sizes and us._cdata not in seen
                    and us._cdata not in self.early):
                seen.add(us._cdata)
                todo.append(us)
        order = cache.pack_of  # storages in no pack last time (new since) come last
        todo.sort(key=lambda us: (us.data_ptr() not in order, order.get(us.data_ptr(), "")))
        with cf.ThreadPoolExecutor(PREHASH_THREADS) as ex:
            for us, x in zip(todo, ex.map(tensors.storage_xxh3, todo), strict=True):
                old = self._old_entry(x, us)
                self.early[us._cdata] = (x, old)
                if old is not None:
                    self.taken.add((old.get("blob"), old.get("name")))
                    self._reused(old, us, hold=not _owned(us))

    def _reused(self, old: dict[str, Any], us: Any, *, count: bool = True,
                hold: bool = False) -> None:
        """A storage reuses ``old``'s bytes: it is handed to ``give_back`` at once when the
        store is local (``from_store``: if its pack is rewritten after all, _settle_reuse reads
        it from there), else once its old pack is sure to be kept (at least half of it reused,
        as _settle_reuse decides; that only grows), so that no memory is given back that a
        rewrite would read. ``count``: add its bytes to the pack's use (once per storage);
        ``hold``: not yet."""
        blob = old["blob"]
        if count:
            self.used[blob] = self.used.get(blob, 0) + us.nbytes()
        waiting = self.waiting.setdefault(blob, [])
        if not hold:
            waiting.append(us)
        pack_size = old.get("pack_size")
        if not self.from_store and (not isinstance(pack_size, int)
                                    or self.used[blob] * 2 < pack_size):
            return
        ready = [s for s in waiting if self._unread(s)]
        waiting.clear()
        if ready and self.give_back is not None:
            self.given.update(s._cdata for s in ready)
            self.give_back(ready)

    def read_later(self, a: int, n: int) -> None:
        """Memory this write reads after now (a buffer in flight, a storage to be written): no
        storage over any of it is given back. ``n`` < 0: unknown, then nothing is."""
        if n < 0:
            self.unknown_reads = True
        if n <= 0:
            return
        # kept as disjoint intervals: one that meets or touches the new one is merged into it
        starts, ends = self.read_starts, self.read_ends
        lo, hi = a, a + n
        i, j = bisect.bisect_left(ends, lo), bisect.bisect_right(starts, hi)
        if i < j:
            lo, hi = min(lo, starts[i]), max(hi, ends[j - 1])
        starts[i:j], ends[i:j] = [lo], [hi]

    def _unread(self, us: Any) -> bool:
        """Whether nothing of this write reads the storage's memory again: a CPU storage of at
        least GIVE_BACK_MIN bytes none of whose bytes a later read (see read_later) covers."""
        n = us.nbytes()
        if self.unknown_reads or us.device.type != "cpu" or n < GIVE_BACK_MIN:
            return False
        a = us.data_ptr()
        i = bisect.bisect_right(self.read_ends, a)  # the first interval ending after a
        return i == len(self.read_starts) or self.read_starts[i] >= a + n

    def _reusable_sizes(self) -> set[int]:
        """Sizes of the entries the last write recorded or a restore handed out: a storage of
        any other size cannot be reused, whatever its bytes."""
        if self.sizes is None:
            cache = self.cache
            assert cache is not None
            sizes = {e.get("nbytes") for es in cache.storage_hashes.values() for e in es}
            if cache.store_url is not None:
                with _cache._restored_lock:
                    for es in _cache._restored.get(cache.store_url, {}).values():
                        sizes.update(e.get("nbytes") for e in es)
            self.sizes = {n for n in sizes if isinstance(n, int)}
        return self.sizes

    @staticmethod
    def _new_entry(gi: int, us: Any, dtype: str, xxh3: str | None) -> dict[str, Any]:
        e = {
            "key": f"t{gi}",
            "blob": None,
            "name": f"t{gi}",
            "device": tensors.record_device(us),
            "dtype": dtype,
            "shape": [us.nbytes() // max(1, tensors.itemsize(dtype))],
            "nbytes": us.nbytes(),
        }
        if xxh3 is not None:
            e["xxh3"] = xxh3  # the next write's (or a restore's) change check
        return e

    def _settle_reuse(self) -> None:
        """Reference an old pack only while at least half of it is still in use; otherwise
        rewrite its few unchanged storages, so a checkpoint never pins (and a restore never
        reads) a whole old pack for a handful of bytes. Bounds the waste at 2x.

        A storage whose memory was given back (see _reused) is rewritten from the old pack in
        a local store. Elsewhere its pack is kept even below half: prehash counted storages the
        pickling may not save after all (a variable skipped), and those bytes are no longer in
        memory."""
        run = self.run
        for blob, items in self.reuse.items():
            used = sum(us.nbytes() for _, us, _ in items)
            pack_size = self.entries[items[0][0]]["pack_size"]
            if used * 2 >= pack_size or (not self.from_store and any(
                    us._cdata in self.given for _, us, _ in items)):
                run.blobs[blob] = {"size": pack_size, "kind": "tensors"}
                run.add_done(used)
                run.known += used
                continue
            for gi, us, dtype in items:
                old, src = self.entries[gi], us
                if us._cdata in self.given:  # its memory is gone: copied from the old pack
                    src = tensors.StoredBytes(run.store, blob, old["name"], us.nbytes(),
                                              old["xxh3"])
                self.entries[gi] = self._new_entry(gi, us, dtype, old.get("xxh3"))
                self.pending.append((gi, src, dtype))
                self.pending_bytes += us.nbytes()
        self.reuse.clear()

    def _record(self, name: str, xxh3: str) -> None:
        """A deferred storage's hash, from the writer thread (read after the pool's wait)."""
        self.entries[int(name[1:])]["xxh3"] = xxh3

    def flush(self, final: bool) -> None:
        if final:
            self._settle_reuse()
        if not self.pending or (not final and self.pending_bytes < SHARD_MIN):
            return
        new, self.pending, total, self.pending_bytes = self.pending, [], self.pending_bytes, 0
        nshards = 2 if total >= SHARD_MIN and len(new) > 1 else 1
        pack_max = self.run.store.pack_max
        if pack_max:
            nshards = max(nshards, min(len(new), -(-total // pack_max)))
        shards: list[list[Any]] = [[] for _ in range(nshards)]
        loads = [0] * nshards
        for item in sorted(new, key=lambda t: -t[1].nbytes()):
            i = loads.index(min(loads))
            shards[i].append(item)
            loads[i] += item[1].nbytes()
        for shard in shards:
            layout = [(f"t{gi}", us, dt) for gi, us, dt in shard]
            head, _ = tensors.pack_layout(layout)
            size = len(head) + sum(us.nbytes() for _, us, _ in shard)
            hash_names = {f"t{gi}" for gi, _, _ in shard if gi in self.deferred}
            # a source, not a generator: object stores read it twice (name, then upload); device
            # storages are copied to host one at a time, in the writer thread
            f = self.run.put(functools.partial(tensors.pack_chunks, layout, self._record,
                                               hash_names), "tensors", size, cached=False)
            for gi, _, _ in shard:
                self.entries[gi]["blob"] = f
                self.entries[gi]["pack_size"] = size


def _owned(us: Any) -> bool:
    """Whether torch allocated this storage's memory (only such a storage is resizable: one
    over a numpy array, a bytearray or a mapped file is not)."""
    try:
        return bool(us.resizable())
    except (AttributeError, RuntimeError):
        return False
