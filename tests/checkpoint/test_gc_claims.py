"""A gc beside a write that reuses (claims) a blob the gc is about to remove: the claim wins.

A claim refreshes the blob's time; the gc's removal renames the blob aside and reads the time
again before it deletes. These tests put the claim exactly where a concurrent write's could
land: just before the gc's first change to the blob's file, and just after it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jupyter_pause.checkpoint import gc, goodblobs, read, write
from jupyter_pause.checkpoint.collect import collect
from jupyter_pause.checkpoint.manifest import blob_names
from jupyter_pause.checkpoint.store import GC_ASIDE, Store

HOUR = 3600.0
NOW = time.time()


def _orphan(store: Store, key: bytes, tmp_path: Path) -> tuple[np.ndarray, str, Any]:
    """An array written, then its checkpoint dropped: its blob is unreferenced, an hour old,
    and known good to this process (a later write of the same bytes would claim it). Returns
    the array, the blob's digest, and a function that publishes the dropped manifest again
    (what the write that claims the blob goes on to do)."""
    x = np.arange(200_000, dtype=np.float64)
    res = write({"x": x}, store, key=key)
    (digest,) = [d for d in blob_names(res.manifest.to_dict()) if store.size(store.blob_path(d))
                 >= x.nbytes]
    manifest = store.manifest_path("default", res.checkpoint_id)
    kept = tmp_path / "manifest"
    os.rename(manifest, kept)
    old = time.time() - HOUR
    os.utime(store.blob_path(digest), (old, old))
    goodblobs.remember(store.url, digest, store.blob_stamp(digest))  # as if written then
    return x, digest, lambda: os.rename(kept, manifest)


def _on_first_touch(monkeypatch: pytest.MonkeyPatch, path: str, before: bool,
                    act: Callable[[], None]) -> None:
    """Run ``act`` when the gc first renames or unlinks ``path``: before or after it does."""
    done: list[bool] = []
    for name in ("rename", "unlink"):
        real = getattr(os, name)

        def hooked(src: Any, *args: Any, _real: Any = real, **kw: Any) -> Any:
            first = os.fspath(src) == path and not done
            if first:
                done.append(True)
                if before:
                    act()
            out = _real(src, *args, **kw)
            if first and not before:
                act()
            return out

        monkeypatch.setattr(os, name, hooked)


def test_a_claim_just_before_the_gc_removes_the_blob_keeps_it(store, key, monkeypatch,
                                                                tmp_path):
    x, digest, publish = _orphan(store, key, tmp_path)
    path = store.blob_path(digest)
    claims: list[bool] = []
    _on_first_touch(monkeypatch, path, True, lambda: claims.append(store.claim_blob(digest)))
    out = collect(store, {digest})
    monkeypatch.undo()
    assert claims == [True]  # the write reuses the blob without writing it...
    assert out["removed"] == [] and os.path.isfile(path)  # ...and the gc left it in place
    assert not [n for n in os.listdir(os.path.dirname(path)) if GC_ASIDE in n]
    publish()  # the write that claimed it publishes: its checkpoint reads back whole
    assert np.array_equal(read(store, key=key).values["x"], x)


def test_a_claim_just_after_the_gc_moved_the_blob_writes_it_again(store, key, monkeypatch,
                                                                  tmp_path):
    x, digest, _ = _orphan(store, key, tmp_path)
    path = store.blob_path(digest)
    claims: list[bool] = []
    _on_first_touch(monkeypatch, path, False, lambda: claims.append(store.claim_blob(digest)))
    out = collect(store, {digest})
    monkeypatch.undo()
    assert claims == [False]  # gone: the write cannot reuse it...
    assert out["removed"] == [digest] and not os.path.exists(path)
    res = write({"x": x}, store, key=key)  # ...so it writes it again
    assert res.bytes_written >= x.nbytes
    assert np.array_equal(read(store, key=key).values["x"], x)


def test_a_blob_a_dead_gc_left_set_aside_is_put_back(store, key, monkeypatch):
    """A gc killed between its rename and its decision: a later gc puts the blob back (a
    claim may have counted on it) and judges it as usual."""
    x = np.arange(100_000, dtype=np.float64)
    res = write({"x": x}, store, key=key)
    digests = [d for d in blob_names(res.manifest.to_dict()) if os.path.getsize(store.blob_path(d))
               >= x.nbytes]
    path = Path(store.blob_path(digests[0]))
    aside = path.with_name(f"{path.name}{GC_ASIDE}0123456789ab")
    os.rename(path, aside)
    # A recent one belongs to a gc still deciding (its rename is the file's last change): a
    # gc leaves it alone...
    gc(store)
    assert aside.exists() and not path.exists()
    # ...but a reader that finds the blob missing puts it back (that only ever keeps a blob).
    assert np.array_equal(read(store, key=key).values["x"], x)
    assert path.is_file() and not aside.exists()
    os.rename(path, aside)
    # Ten minutes later it is put back (a claim may count on it: nothing names it here).
    monkeypatch.setattr(time, "time", lambda: NOW + HOUR)
    gc(store)
    assert path.is_file() and not aside.exists()
    assert np.array_equal(read(store, key=key).values["x"], x)
    # One set aside while the blob was written again meanwhile: the copy in place stays.
    monkeypatch.undo()
    os.link(path, aside)
    inode = path.stat().st_ino
    monkeypatch.setattr(time, "time", lambda: NOW + HOUR)
    gc(store)
    monkeypatch.undo()
    assert not aside.exists() and path.stat().st_ino == inode


def test_on_a_file_system_of_whole_seconds_a_claim_in_the_cutoffs_second_is_kept(store, key,
                                                                                tmp_path):
    """FAT, HFS+ and some FUSE mounts keep whole (or even) seconds: a claim just after the
    gc's cutoff is stored up to 2 s before it. A time of whole seconds is judged 2 s earlier."""
    _, digest, _ = _orphan(store, key, tmp_path)
    path = store.blob_path(digest)
    cutoff = float(int(time.time())) + 0.7
    stored = int(cutoff) * 1_000_000_000  # a claim at cutoff + 0.1 s, truncated to the second
    os.utime(path, ns=(stored, stored))
    assert store.collect_blob(digest, cutoff) is None and os.path.isfile(path)
    # the same time with its nanoseconds kept (a file system that keeps them): it is old
    os.utime(path, ns=(stored + 1, stored + 1))
    assert store.collect_blob(digest, cutoff) is not None and not os.path.exists(path)
