"""A gc beside a write that reuses (claims) a blob the gc is about to remove: the claim wins.

A claim refreshes the blob's time; the gc's removal renames the blob aside and reads the time
again before it deletes. These tests put the claim exactly where a concurrent write's could
land: just before the gc's first change to the blob's file, and just after it. On object stores
(no time to refresh) the write records its claims in its lease and checks them, and the gc reads
the claims before and after a removal: the last tests put the gc on either side of that check.
"""

from __future__ import annotations

import os
import threading
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


# -- object stores: no time to refresh, so the claims are recorded in the write's lease -------
# A real emulator (moto for S3, gcp-storage-emulator for GCS; conftest.object_server). Both
# clouds are strongly consistent for a read after a write and for listings (Amazon S3 since
# December 2020, https://aws.amazon.com/s3/consistency/; Cloud Storage:
# https://cloud.google.com/storage/docs/consistency), which the ordering argument of
# Store.record_claims relies on: the lease is written before the blob's existence is checked.


def _remote_orphan(object_server: Any, key: bytes, name: str) -> tuple[Store, Any, np.ndarray,
                                                                       str, Any]:
    """A store on the emulator, a write cache, an array written and its checkpoint's manifest
    removed: the blob is unreferenced and known good to this process, and the next write of
    the same array (with the cache) reuses it."""
    from jupyter_pause.checkpoint import WriteCache, open_store

    store = open_store(object_server.url(name), storage_options=object_server.options())
    cache = WriteCache()
    x = np.arange(300_000, dtype=np.float64)
    res = write({"x": x}, store, key=key, cache=cache)
    (digest,) = [d for d in res.manifest.blobs if res.manifest.blobs[d]["size"] >= x.nbytes]
    store.remove(store.manifest_path("default", res.checkpoint_id))
    return store, cache, x, digest, res


def _first_reading_misses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gc's first reading of the leases (the next one) came before the write recorded its
    claim: it sees no lease; later readings see the store as it is."""
    from jupyter_pause.checkpoint import collect as collect_mod

    real, first = collect_mod._live_leases, [True]

    def live(s: Store) -> Any:
        if first:
            first.clear()
            return []
        return real(s)

    monkeypatch.setattr(collect_mod, "_live_leases", live)


def test_an_object_store_write_whose_reused_blob_a_gc_removed_publishes_nothing(
        object_server, key, monkeypatch):
    """The gc read the claims before this write recorded its own and removed the blob before
    the write checked it: the write fails before publishing, and the next one writes it."""
    from jupyter_pause.checkpoint import CheckpointError

    store, cache, x, digest, _ = _remote_orphan(object_server, key, "claims-gone")
    real = Store.record_claims

    def gc_first(self: Store, txn: Any, digests: set[str]) -> None:
        assert digest in digests  # reused, not written again
        store.delete_blob(digest)  # what the gc did just before
        real(self, txn, digests)

    monkeypatch.setattr(Store, "record_claims", gc_first)
    before = set(store.manifest_files())
    with pytest.raises(CheckpointError, match="removed by a clean-up"):
        write({"x": x}, store, key=key, cache=cache)
    monkeypatch.undo()
    assert set(store.manifest_files()) == before  # nothing published
    res = write({"x": x}, store, key=key, cache=cache)  # forgotten as good: uploaded again
    assert res.bytes_written >= x.nbytes
    assert np.array_equal(read(store, key=key).values["x"], x)


def test_an_object_store_gc_puts_back_a_blob_claimed_while_it_removed_it(
        object_server, key, monkeypatch):
    """The gc read the claims before the write recorded its own (so it removes the blob), and
    the write checked the blob before the gc removed it: the gc's second reading of the claims
    puts the blob back, and the published checkpoint reads back whole."""
    from jupyter_pause.checkpoint import collect as collect_mod

    store, cache, x, digest, _ = _remote_orphan(object_server, key, "claims-back")
    real_record, real_live = Store.record_claims, collect_mod._live_leases
    removals: list[str] = []
    real_delete = Store.delete_blob

    def deleting(self: Store, d: str) -> None:
        removals.append(d)
        real_delete(self, d)

    outs: list[dict[str, Any]] = []

    def then_gc(self: Store, txn: Any, digests: set[str]) -> None:
        real_record(self, txn, digests)  # recorded, and the blob is there
        _first_reading_misses_it(monkeypatch)
        monkeypatch.setattr(Store, "delete_blob", deleting)
        outs.append(collect_mod.collect(store, {digest}))
        monkeypatch.setattr(collect_mod, "_live_leases", real_live)
        monkeypatch.setattr(Store, "delete_blob", real_delete)

    monkeypatch.setattr(Store, "record_claims", then_gc)
    res = write({"x": x}, store, key=key, cache=cache)
    monkeypatch.undo()
    assert removals == [digest]  # the gc did remove it...
    assert outs[0]["removed"] == [] and outs[0]["bytes_freed"] == 0  # ...and put it back
    assert res.bytes_written < x.nbytes  # the write reused it
    store.fs.invalidate_cache()
    folder = store.blob_path(digest).rsplit("/", 1)[0]
    assert not [n for n in store.fs.ls(folder, detail=False) if GC_ASIDE in n]
    assert np.array_equal(read(store, key=key, checkpoint_id=res.checkpoint_id).values["x"], x)


def test_an_object_store_blob_a_dead_gc_left_aside_is_recovered(object_server, key):
    """A gc killed between its removal and its second reading of the claims leaves the copy
    aside: a reader that finds the blob missing puts it back, and so does a later gc."""
    store, cache, x, digest, _ = _remote_orphan(object_server, key, "claims-dead")
    published = write({"x": x}, store, key=key, cache=cache)  # references the blob
    held: list[tuple[str, str, str]] = []
    assert store.collect_blob(digest, time.time() + 60, held) is not None
    assert not store.has_blob(digest) and len(held) == 1  # killed here
    got = read(store, key=key, checkpoint_id=published.checkpoint_id).values["x"]
    assert np.array_equal(got, x) and store.has_blob(digest)
    assert not store.fs.exists(held[0][2])  # the reader took the copy aside back
    # a later gc finds another one left aside (older than its age) and puts the blob back
    held.clear()
    assert store.collect_blob(digest, time.time() + 60, held) is not None
    assert [a for _, a in store.set_aside_files(time.time() + 60)] == [held[0][2]]
    for path, aside in store.set_aside_files(time.time() + 60):
        store.put_aside_back(path, aside)
    assert store.has_blob(digest) and not store.fs.exists(held[0][2])


def test_an_object_store_gc_keeps_a_blob_whose_write_published_while_it_removed_it(
        object_server, key, monkeypatch):
    """The write recorded its claim after the gc's first reading, then published and dropped
    its lease while the gc was removing blobs: the gc's second reading finds no claim, but the
    manifest names the blob (a write publishes before it drops its lease), so it goes back."""
    from jupyter_pause.checkpoint import collect as collect_mod

    store, cache, x, digest, _ = _remote_orphan(object_server, key, "claims-published")
    real_record, real_claims = Store.record_claims, collect_mod.active_claims
    removed, go = threading.Event(), threading.Event()
    outs: list[Any] = []

    def second_reading(s: Store) -> set[str]:
        removed.set()  # the blobs are gone, copies aside: the write now publishes
        assert go.wait(60)
        return real_claims(s)

    def then_gc(self: Store, txn: Any, digests: set[str]) -> None:
        real_record(self, txn, digests)
        _first_reading_misses_it(monkeypatch)
        monkeypatch.setattr(collect_mod, "active_claims", second_reading)

        def run() -> None:
            try:
                outs.append(collect_mod.collect(store, {digest}))
            except BaseException as e:  # noqa: BLE001 - shown by the assertion below
                outs.append(e)

        threading.Thread(target=run, daemon=True).start()
        assert removed.wait(60)
        assert not store.has_blob(digest)

    monkeypatch.setattr(Store, "record_claims", then_gc)
    res = write({"x": x}, store, key=key, cache=cache)  # publishes, drops its lease
    go.set()
    deadline = time.monotonic() + 60
    while not outs and time.monotonic() < deadline:
        time.sleep(0.01)
    monkeypatch.undo()
    assert outs and isinstance(outs[0], dict), outs
    assert outs[0]["removed"] == [] and store.has_blob(digest)
    assert np.array_equal(read(store, key=key, checkpoint_id=res.checkpoint_id).values["x"], x)


def test_an_object_store_gc_that_fails_half_way_puts_back_what_it_removed(
        object_server, key, monkeypatch):
    """A gc stopped by an error (or an interruption) after it removed some blobs puts them back
    before it gives up: whatever the reason, nothing a claim may count on is lost."""
    store, cache, x, digest, _ = _remote_orphan(object_server, key, "claims-fail")
    other = write({"y": np.ones(200_000)}, store, key=key)
    (second,) = [d for d in other.manifest.blobs if other.manifest.blobs[d]["size"] >= 1_600_000]
    store.remove(store.manifest_path("default", other.checkpoint_id))
    real = Store.collect_blob
    calls: list[str] = []

    def then_fail(self: Store, d: str, cutoff: float, held: Any = None) -> Any:
        calls.append(d)
        if len(calls) == 2:
            raise RuntimeError("the store went away")
        return real(self, d, time.time() + 60, held)

    monkeypatch.setattr(Store, "collect_blob", then_fail)
    with pytest.raises(RuntimeError, match="went away"):
        collect(store, {digest, second})
    monkeypatch.undo()
    assert store.has_blob(calls[0])  # removed first, then put back
    store.refresh()
    folder = store.blob_path(calls[0]).rsplit("/", 1)[0]
    assert not [n for n in store.fs.ls(folder, detail=False) if GC_ASIDE in n]
