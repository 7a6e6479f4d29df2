"""Incremental checkpoints, retention and garbage collection."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jupyter_pause.checkpoint import WriteCache, gc, read, write


def _blobs_on_disk(store):
    root = os.path.join(store.root, "blobs")
    return {f for _, _, fs in os.walk(root) for f in fs}


def test_unchanged_writes_nothing_and_one_changed_tensor_writes_only_it(store, key):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    state = {f"w{i}": torch.randn(4096) for i in range(150)}  # 150 x 16 KiB
    model = torch.nn.Linear(64, 64)
    ns = {"state": state, "model": model, "arr": np.arange(300_000), "meta": {"step": 1}}
    cache = WriteCache()
    r1 = write(ns, store, key=key, cache=cache)
    assert r1.bytes_written >= 150 * 16384
    r2 = write(ns, store, key=key, cache=cache)
    assert r2.bytes_written == 0, r2.bytes_written
    assert r2.bytes_total == r1.bytes_total
    with torch.no_grad():
        state["w7"].add_(1.0)
    r3 = write(ns, store, key=key, cache=cache)
    assert 16384 <= r3.bytes_written <= 16384 + 4096, r3.bytes_written
    # each checkpoint reads back its own values; the old pack was never modified
    v1 = read(store, key=key, checkpoint_id=r1.checkpoint_id).values
    v3 = read(store, key=key, checkpoint_id=r3.checkpoint_id).values
    torch.testing.assert_close(v3["state"]["w7"], state["w7"])
    torch.testing.assert_close(v1["state"]["w7"], state["w7"] - 1.0)
    torch.testing.assert_close(v3["state"]["w8"], state["w8"])
    # a python-level change rewrites only the small stream
    ns["meta"]["step"] = 2
    r4 = write(ns, store, key=key, cache=cache)
    assert 0 < r4.bytes_written < 16384  # the small-stream bundle only, no tensor data
    assert read(store, key=key).values["meta"] == {"step": 2}
    # replacing a tensor object (new storage) is detected
    state["w9"] = torch.zeros(4096)
    r5 = write(ns, store, key=key, cache=cache)
    assert r5.bytes_written >= 16384
    assert read(store, key=key).values["state"]["w9"].sum().item() == 0


def test_changed_numpy_buffer_is_rewritten(store, key):
    arr = np.zeros(500_000)
    ns = {"arr": arr}
    cache = WriteCache()
    write(ns, store, key=key, cache=cache)
    assert write(ns, store, key=key, cache=cache).bytes_written == 0
    arr[123] = 5
    r = write(ns, store, key=key, cache=cache)
    assert r.bytes_written >= arr.nbytes
    assert read(store, key=key).values["arr"][123] == 5


def test_cache_survives_blob_loss(store, key):
    """A cached blob removed behind the cache's back is written again, never referenced dead."""
    ns = {"arr": np.ones(300_000)}
    cache = WriteCache()
    r1 = write(ns, store, key=key, cache=cache, keep=1)
    store.delete(r1.checkpoint_id)
    gc(store)
    assert _blobs_on_disk(store) == set()
    r2 = write(ns, store, key=key, cache=cache)
    assert r2.bytes_written >= 2_400_000
    assert read(store, key=key).values["arr"].sum() == 300_000


def test_retention_and_gc_remove_exactly_unreferenced(store, key):
    refs = []
    for i in range(4):
        r = write({"a": np.full(200_000, i), "i": i}, store, key=key, keep=2)
        refs.append(set(r.manifest.blobs))
    ids = store.manifest_ids("default")
    assert len(ids) == 2
    assert _blobs_on_disk(store) == refs[2] | refs[3]
    other = write({"b": np.full(200_000, 9)}, store, key=key, stream="other", keep=None)
    store.delete(ids[1])  # the older of the two kept
    dry = gc(store, dry_run=True)
    assert set(dry["removed"]) == refs[2] - refs[3]
    assert _blobs_on_disk(store) == refs[2] | refs[3] | set(other.manifest.blobs)
    out = gc(store)
    assert set(out["removed"]) == refs[2] - refs[3] and out["bytes_freed"] > 0
    assert _blobs_on_disk(store) == refs[3] | set(other.manifest.blobs)
    assert read(store, key=key).values["i"] == 3
    assert read(store, key=key, stream="other").values["b"][0] == 9


def test_checkpoint_after_restore_reuses_entries_but_sees_changes(store, key):
    torch = pytest.importorskip("torch")
    ns = {"a": torch.randn(100_000), "b": torch.randn(100_000), "c": torch.randn(100_000)}
    write(ns, store, key=key)
    v = read(store, key=key).values
    with torch.no_grad():
        v["b"].mul_(2)  # modified after the restore: must be written again
    r = write(v, store, key=key, cache=WriteCache())
    # b only (plus small streams): a and c are 2/3 of the old pack, still referenced there
    assert 400_000 <= r.bytes_written < 500_000, r.bytes_written
    v2 = read(store, key=key).values
    torch.testing.assert_close(v2["a"], ns["a"])
    torch.testing.assert_close(v2["b"], ns["b"] * 2)


def test_gc_spares_blobs_a_running_write_is_about_to_reference(store, key):
    r = write({"arr": np.ones(300_000)}, store, key=key)
    blob = next(d for d, b in r.manifest.blobs.items() if b["kind"] == "buffer")
    old = os.path.getmtime(store.blob_path(blob)) - 3600
    os.utime(store.blob_path(blob), (old, old))
    txn = store.begin("20991231T000000000000Z-abcdef")  # another writer, in flight
    store.delete(r.checkpoint_id)
    assert store.claim_blob(blob)  # it found the blob and will reference it
    assert blob not in gc(store)["removed"]
    txn.release()
    assert blob in gc(store)["removed"]


def test_prewritten_array_of_a_skipped_variable_leaves_no_orphan(store, key, monkeypatch):
    from jupyter_pause.checkpoint import writer

    real = writer.dump_group

    def failing(values, **kw):
        if "a" in values:
            raise TypeError("cannot pickle this one")
        return real(values, **kw)

    monkeypatch.setattr(writer, "dump_group", failing)
    r = write({"a": np.arange(1_000_000.0), "b": np.ones(500_000)}, store, key=key)
    assert {v.name: v.status for v in r.variables} == {"a": "skipped", "b": "saved"}
    assert _blobs_on_disk(store) == set(r.manifest.blobs)
    assert read(store, key=key).values["b"].sum() == 500_000


def test_xxh3_tensor_check_sees_changes_behind_torchs_back(store, key):
    torch = pytest.importorskip("torch")
    ns = {f"t{i}": torch.zeros(50_000) for i in range(3)}
    cache = WriteCache(tensor_check="xxh3")
    write(ns, store, key=key, cache=cache)
    assert write(ns, store, key=key, cache=cache).bytes_written < 4096
    ns["t1"].numpy()[7] = 3.0  # no _version bump
    r = write(ns, store, key=key, cache=cache)
    assert 200_000 <= r.bytes_written < 210_000, r.bytes_written
    assert read(store, key=key).values["t1"][7].item() == 3.0
