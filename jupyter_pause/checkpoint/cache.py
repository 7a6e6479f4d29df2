"""In-process memory of the last checkpoint, so the next one writes only what changed.

Change detection compares content, never a proxy for it. Torch's ``_version`` counter looked
cheap but misses writes through ``t.data[...]``, ``t.numpy()[...]`` and ``.data`` of a
parameter, so a checkpoint trusting it said "saved" and kept old bytes. xxh3-128 of a storage
runs at memory speed (about 25 GB/s here: 0.17 s for 4 GiB), a small price next to writing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

# Pack entries that read() handed out, per store, by the xxh3 of their bytes (recorded in the
# signed manifest when they were written): a checkpoint taken right after a restore (resume,
# look, pause again) reuses the entries whose storages still hash the same, even with a fresh
# WriteCache. Bounded: the oldest are forgotten first.
_RESTORED_MAX = 100_000
# xxh3 -> every entry with those bytes: two storages with equal bytes (zero biases, say) are
# two entries, and a write must give each its own, or a restore makes them one memory.
_restored: dict[str, OrderedDict[str, list[dict[str, Any]]]] = {}
_restored_lock = threading.Lock()


def remember_restored(store_url: str, entries: list[dict[str, Any]]) -> None:
    """Record tensor entries of a verified checkpoint that read() turned into storages."""
    with _restored_lock:
        known = _restored.setdefault(store_url, OrderedDict())
        for e in entries:
            if add_entry(known, e):
                known[e["xxh3"]] = known[e["xxh3"]][-64:]  # a bound: more are written again
                known.move_to_end(e["xxh3"])
        while len(known) > _RESTORED_MAX:
            known.popitem(last=False)


def add_entry(by_hash: dict[str, list[dict[str, Any]]], entry: dict[str, Any]) -> bool:
    """File a pack entry under the xxh3 of its bytes, once per place (pack and name): equal
    bytes in two storages are two entries. False when it has no hash or no blob yet."""
    x = entry.get("xxh3")
    if not isinstance(x, str) or not isinstance(entry.get("blob"), str):
        return False
    fixed = {k: v for k, v in entry.items() if k != "key"}
    same = by_hash.setdefault(x, [])
    if not any(_where(o) == _where(fixed) for o in same):
        same.append(fixed)
    return True


def _where(e: dict[str, Any]) -> tuple[Any, Any]:
    """Where an entry's bytes live: its pack and its name in it."""
    return e.get("blob"), e.get("name")


def forget_restored() -> None:
    """Forget every restored entry (tests; a process that changes stores)."""
    with _restored_lock:
        _restored.clear()


@dataclass
class WriteCache:
    """Keep one per process (per store) across checkpoints; pass it to every ``write``.

    Change detection, by content:
    - a torch storage is hashed with xxh3 (CPU storages in place; device storages a piece at a
      time through host memory); a hash the last checkpoint (or a restore) recorded for the same
      size reuses that pack entry by reference;
    - a pickle stream or out-of-band buffer (numpy, pandas) is hashed with xxh3 and, when it
      matches last time's, reuses the old blob without the cryptographic hash or a write.
    Either reuse also needs the blob to be known good (:mod:`.goodblobs`). ``tensor_check="none"``
    rewrites every storage.
    """

    tensor_check: str = "xxh3"  # "xxh3" | "none"
    store_url: str | None = None
    chunks: dict[str, tuple[str, int]] = field(default_factory=dict)
    storage_hashes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # CPU storage address -> the pack it went into last time: only an order to hash them in
    # (see packs.TensorPacks.prehash), never a reason to reuse anything
    pack_of: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tensor_check not in ("xxh3", "none"):
            raise ValueError(f"tensor_check must be 'xxh3' or 'none', not {self.tensor_check!r}")

    def bind(self, store_url: str) -> None:
        if self.store_url != store_url:
            self.clear()
            self.store_url = store_url

    def clear(self) -> None:
        self.chunks.clear()
        self.storage_hashes.clear()
        self.pack_of.clear()

    def storage_entry(self, xxh3: str, nbytes: int,
                      taken: set[tuple[Any, Any]] | None = None) -> dict[str, Any] | None:
        """A pack entry last written (or restored) for a storage of these bytes that this write
        has not given to another storage yet (``taken``: their (blob, name)), if any."""
        cands = list(self.storage_hashes.get(xxh3, ()))
        if self.store_url is not None:
            with _restored_lock:
                restored = _restored.get(self.store_url)
                if restored is not None:
                    cands += restored.get(xxh3, ())
        for old in cands:
            if old.get("nbytes") == nbytes and (taken is None or _where(old) not in taken):
                return old
        return None
