"""In-process memory of the last checkpoint, so the next one writes only what changed."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _StorageMemo:
    data_ptr: int
    nbytes: int
    tensors: list[tuple[Any, int]]  # (weakref to a tensor on this storage, its _version)
    entry: dict[str, Any]  # the manifest tensor entry (blob, name, dtype, shape, device, nbytes)


# Storages that read() created from pack entries, per store: a checkpoint taken right after a
# restore (resume, look, pause again) then reuses those entries instead of rewriting every
# tensor, even with a fresh WriteCache. Weak: entries die with the tensors.
_restored: dict[tuple[str, int], _StorageMemo] = {}


def remember_restored(store_url: str, us: Any, tensors: list[Any], entry: dict[str, Any]) -> None:
    refs = []
    for t in tensors:
        try:
            refs.append((weakref.ref(t), t._version))
        except TypeError:
            continue
    if refs:
        fixed = {k: v for k, v in entry.items() if k != "key"}
        _restored[(store_url, us._cdata)] = _StorageMemo(us.data_ptr(), us.nbytes(), refs, fixed)


def prune_restored() -> None:
    """Forget restored storages whose tensors are all gone."""
    for k in [k for k, m in _restored.items() if all(r() is None for r, _ in m.tensors)]:
        del _restored[k]


@dataclass
class WriteCache:
    """Keep one per process (per store) across checkpoints; pass it to every ``write``.

    Change detection, cheapest first:
    - a torch storage is unchanged when its address and size are the same and every tensor seen
      on it last time is still alive with the same ``_version`` (in-place ops bump it); then its
      old pack entry is reused by reference, nothing is read or written;
    - a pickle stream or out-of-band buffer (numpy, pandas) is hashed with xxh3 (~8 GB/s) and, when
      it matches last time's, reuses the old blob without the cryptographic hash or a write.
    Mutating a tensor's memory behind torch's back (e.g. through ``t.numpy()``) does not bump
    ``_version``; ``tensor_check="xxh3"`` hashes every CPU storage instead (about 0.12 s/GB),
    ``"none"`` rewrites every storage.
    """

    tensor_check: str = "version"  # "version" | "xxh3" | "none"
    store_url: str | None = None
    chunks: dict[str, tuple[str, int]] = field(default_factory=dict)
    storages: dict[int, _StorageMemo] = field(default_factory=dict)
    storage_hashes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def bind(self, store_url: str) -> None:
        if self.store_url != store_url:
            self.clear()
            self.store_url = store_url

    def clear(self) -> None:
        self.chunks.clear()
        self.storages.clear()
        self.storage_hashes.clear()

    def unchanged_storage(self, us: Any, seen: list[tuple[Any, int]]) -> dict[str, Any] | None:
        m = self.storages.get(us._cdata)
        if m is None and self.store_url is not None:
            m = _restored.get((self.store_url, us._cdata))
        if m is None or m.data_ptr != us.data_ptr() or m.nbytes != us.nbytes():
            return None
        alive = 0
        for ref, version in m.tensors:
            t = ref()
            if t is None:
                continue
            try:
                if t._version != version or t.untyped_storage()._cdata != us._cdata:
                    return None
            except (RuntimeError, NotImplementedError, TypeError):
                return None
            alive += 1
        return m.entry if alive else None

    @staticmethod
    def memo(us: Any, seen: list[tuple[Any, int]], entry: dict[str, Any]) -> _StorageMemo:
        refs = []
        for t, v in seen:
            try:
                refs.append((weakref.ref(t), v))
            except TypeError:
                pass
        return _StorageMemo(us.data_ptr(), us.nbytes(), refs, entry)
