"""Torch storages of one checkpoint as manifest tensor entries and safetensors packs."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

from . import tensors
from .blobpool import BlobPool
from .cache import WriteCache

SHARD_MIN = 64 << 20  # below this, new tensors go into a single pack


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
            import xxhash  # only with a change-detection cache

            x = self.hashes[gi] = xxhash.xxh3_128(tensors.storage_bytes(us)).hexdigest()
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
            "device": tensors.record_device(us),
            "dtype": dtype,
            "shape": [us.nbytes() // max(1, tensors.itemsize(dtype))],
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
        pack_max = self.run.store.pack_max
        if pack_max:
            nshards = max(nshards, min(len(new), -(-total // pack_max)))
        shards: list[list] = [[] for _ in range(nshards)]
        loads = [0] * nshards
        for item in sorted(new, key=lambda t: -t[1].nbytes()):
            i = loads.index(min(loads))
            shards[i].append(item)
            loads[i] += item[1].nbytes()
        for shard in shards:
            layout = [(f"t{gi}", us, dt) for gi, us, dt in shard]
            head, _ = tensors.pack_layout(layout)
            size = len(head) + sum(us.nbytes() for _, us, _ in shard)
            # a source, not a generator: object stores read it twice (name, then upload); device
            # storages are copied to host one at a time, in the writer thread
            f = self.run.put(lambda layout=layout: tensors.pack_chunks(layout), "tensors", size,
                             cached=False)
            for gi, _, _ in shard:
                self.entries[gi]["blob"] = f
                self.entries[gi]["pack_size"] = size


class Memos(dict):
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
