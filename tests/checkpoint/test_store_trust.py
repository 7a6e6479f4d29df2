"""The store is a trust boundary: unsigned or misplaced files never delete, select or load
anything, and what was verified is exactly what is loaded (issue cases 1 to 7)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from jupyter_pause.checkpoint import (
    CheckpointError,
    IntegrityError,
    localfs,
    open_store,
    read,
    retain,
    write,
)
from jupyter_pause.checkpoint import reader as reader_mod
from jupyter_pause.checkpoint.collect import collect
from jupyter_pause.checkpoint.store import stream_slug

FORGED_ID = "99991231T235959999999Z-ffffff"  # sorts after every real id


def _plant(store, slug: str, name: str, body: dict | bytes) -> str:
    folder = os.path.join(store.root, "manifests", slug)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(body if isinstance(body, bytes) else json.dumps(body).encode())
    return path


def _forged(stream: str, blobs: dict, cid: str = "0", created: str = "2999-01-01") -> dict:
    return {"format": "jupyter-pause/checkpoint@1", "hmac": "0", "id": cid, "stream": stream,
            "created": created, "blobs": blobs}


def _mpath(store, stream: str, cid: str) -> str:
    return store.manifest_path(stream, cid)


# -- case 1: an unsigned manifest dropped by retention deletes files outside the store ---------

def test_unsigned_manifest_dropped_by_retention_deletes_nothing(store, key, tmp_path):
    victim = tmp_path / "victim.ipynb"
    victim.write_text("precious")
    os.utime(victim, (1, 1))  # old: the grace period would not have saved it
    rel = os.path.relpath(victim, os.path.join(store.root, "blobs", "xx"))
    write({"x": 0}, store, key=key, keep=None)
    planted = _plant(store, stream_slug("default"), "00000000T000000000000Z-000000.json",
                     _forged("x", {str(victim): {"size": 1, "kind": "bundle"},
                                   rel: {"size": 1, "kind": "bundle"}}))
    ids = [write({"x": i}, store, key=key, keep=5).checkpoint_id for i in range(1, 8)]
    assert victim.read_text() == "precious"
    assert os.path.exists(planted)  # unverified: reported, never acted on
    assert [m.id for m in store.list(key=key)] == sorted(ids, reverse=True)[:5]
    res = write({"x": 9}, store, key=key, keep=5)
    assert any("left alone" in w for w in res.warnings)


def test_blob_names_are_digests_before_any_path_is_built(store, key, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("v")
    os.utime(victim, (1, 1))
    for bad in (str(victim), "../../../victim", "a" * 63, "A" * 64, "0" * 64 + "/x", ""):
        with pytest.raises(IntegrityError):
            store.blob_path(bad)
    collect(store, [str(victim), os.path.relpath(victim, store.root)])
    assert victim.exists()


# -- case 2 is in tests/policy/test_gc_trust.py (gc through run_gc and the CLI) ----------------

# -- case 3: a forged newest manifest must not block the way back ------------------------------

def test_forged_newest_manifest_is_skipped_and_reported(store, key):
    write({"x": 1}, store, key=key)
    good = write({"x": 2}, store, key=key).checkpoint_id
    _plant(store, stream_slug("default"), f"{FORGED_ID}.json",
           _forged("default", {}, cid=FORGED_ID))
    rr = read(store, key=key)
    assert rr.values == {"x": 2} and rr.manifest.id == good
    assert any("skipped 1 newer unverifiable" in w for w in rr.warnings)
    with pytest.raises(IntegrityError):  # asked for by id, it is refused with its reason
        read(store, key=key, checkpoint_id=FORGED_ID)


def test_no_key_loads_nothing_not_even_an_unsigned_manifest(store, key, tmp_path):
    """Without a key nothing can be verified, so nothing is loaded: a forged manifest whose
    pickle would run code must never be read because a caller passed no key."""
    write({"x": 1}, store, key=key)
    _plant(store, stream_slug("default"), f"{FORGED_ID}.json",
           _forged("default", {}, cid=FORGED_ID))
    for empty in (b"", None):
        with pytest.raises(CheckpointError, match="no checkpoint key"):
            read(store, key=empty)
        with pytest.raises(CheckpointError, match="no checkpoint key"):
            store.choose(empty, "default", FORGED_ID)


# -- case 4: a manifest is bound to where it is found ------------------------------------------

def test_replay_into_another_notebook_is_refused(store, key):
    write({"who": "B"}, store, key=key, stream="b.ipynb")
    a = write({"who": "A"}, store, key=key, stream="a.ipynb").checkpoint_id  # newer than B's
    src = _mpath(store, "a.ipynb", a)
    b_dir = os.path.join(store.root, "manifests", stream_slug("b.ipynb"))
    shutil.copy(src, os.path.join(b_dir, os.path.basename(src)))  # same id, B's folder
    shutil.copy(src, os.path.join(b_dir, f"{FORGED_ID}.json"))  # and under a newer name
    rr = read(store, key=key, stream="b.ipynb")
    assert rr.values == {"who": "B"}
    assert any("another notebook" in w for w in rr.warnings)
    assert {m.stream for m in store.list("b.ipynb", key=key)} == {"b.ipynb"}


def test_rollback_by_renaming_is_refused(store, key):
    old = write({"x": "old"}, store, key=key).checkpoint_id
    write({"x": "new"}, store, key=key)
    shutil.copy(_mpath(store, "default", old), _mpath(store, "default", FORGED_ID))
    rr = read(store, key=key)
    assert rr.values == {"x": "new"}
    assert any("renamed" in w for w in rr.warnings)
    with pytest.raises(IntegrityError, match="renamed"):
        read(store, key=key, checkpoint_id=FORGED_ID)
    # and the renamed copy never counts toward retention
    for i in range(3):
        write({"x": i}, store, key=key, keep=2)
    assert os.path.exists(_mpath(store, "default", FORGED_ID))
    assert len(store.list("default", key=key)) == 2


def test_rollback_by_deletion_is_not_detectable_by_the_store(store, key):
    """Documented limit: deleting the newest manifests rolls back to the one before; only the
    server's journal (which records each pause's checkpoint id) can tell."""
    write({"x": "old"}, store, key=key)
    new = write({"x": "new"}, store, key=key).checkpoint_id
    os.unlink(_mpath(store, "default", new))
    assert read(store, key=key).values == {"x": "old"}


# -- case 5: the bytes verified are the bytes loaded -------------------------------------------

def test_files_swapped_after_verification_change_nothing(store, key, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    arr = np.arange(400_000, dtype=np.float64)  # > 1 MiB: was mapped MAP_PRIVATE
    t = torch.arange(1000, dtype=torch.float32)
    m = write({"arr": arr, "t": t}, store, key=key).manifest
    other = open_store(str(tmp_path / "other"))
    m2 = write({"t": torch.zeros(1000)}, other, key=key).manifest
    pack = next(d for d, i in m.blobs.items() if i["kind"] == "tensors")
    pack2 = next(d for d, i in m2.blobs.items() if i["kind"] == "tensors")
    buf = next(d for d, i in m.blobs.items() if i["kind"] == "buffer" and i["size"] > 1 << 20)
    real_run = reader_mod._Verifier.run

    def run_then_swap(self, digests):
        real_run(self, digests)
        # after every digest was checked: replace the pack by rename, overwrite the array in place
        tmp = store.blob_path(pack) + ".swap"
        shutil.copy(other.blob_path(pack2), tmp)
        os.replace(tmp, store.blob_path(pack))
        with open(store.blob_path(buf), "r+b") as f:
            f.write(b"\xff" * 4096)

    monkeypatch.setattr(reader_mod._Verifier, "run", run_then_swap)
    rr = read(store, key=key)
    assert torch.equal(rr.values["t"], t)
    np.testing.assert_array_equal(rr.values["arr"], arr)
    rr.values["arr"][0] = -1  # restored arrays stay writable
    rr.values["t"][0] = -1


# -- case 6: retention in the kernel keeps what a pause depends on -----------------------------

def test_retention_keeps_the_pause_checkpoint(store, key):
    paused = write({"x": "paused"}, store, key=key, meta={"flight": "f1", "trigger": "server"})
    # a new session on the same notebook keeps checkpointing
    for i in range(6):
        write({"x": i}, store, key=key, keep=5)
    assert read(store, key=key, checkpoint_id=paused.checkpoint_id).values == {"x": "paused"}


def test_retention_honours_protect_and_pins(store, key):
    a = write({"x": "a"}, store, key=key).checkpoint_id
    b = write({"x": "b"}, store, key=key).checkpoint_id
    store.pin(b, "a pause depends on it")
    for i in range(4):
        write({"x": i}, store, key=key, keep=1, protect={a})
    ids = {m.id for m in store.list(key=key)}
    assert {a, b} <= ids and len(ids) == 3
    store.unpin(b)
    assert set(retain(store, "default", 1, key=key)) == {a, b}
    assert len(store.list(key=key)) == 1


def test_kernel_retention_reads_the_servers_protection(store, key, tmp_path, monkeypatch):
    from jupyter_pause.kernel.ops import protected_checkpoints

    state = tmp_path / "state"
    state.mkdir()
    (state / "state.json").write_text(json.dumps(
        {"pause": {"checkpoints": ["c1"], "kernels": [{"checkpoint_id": "c2"}, "junk"]},
         "inflight": ["not", "a", "dict"]}))
    monkeypatch.setenv("JUPYTER_PAUSE_STATE_DIR", str(state))
    assert protected_checkpoints() == {"c1", "c2"}
    (state / "state.json").write_text("[[[")
    assert protected_checkpoints() == set()


def test_retention_without_key_refuses(store, key):
    write({"x": 1}, store, key=key)
    with pytest.raises(Exception, match="key"):
        retain(store, "default", 1)


# -- case 7 (the store's part): everything it creates is private -------------------------------

def test_store_files_and_folders_are_private(tmp_path, key):
    old = os.umask(0o022)
    try:
        root = tmp_path / "deep" / "store"
        s = open_store(str(root))
        write({"x": np.arange(10)}, s, key=key)
        s.pin(s.list(key=key)[0].id)
    finally:
        os.umask(old)
    for d, _dirs, files in os.walk(root):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
        for f in files:
            assert stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode) == 0o600, f


def test_open_narrows_an_existing_store_that_is_too_open(tmp_path, key, caplog):
    root = tmp_path / "store"
    write({"x": 1}, open_store(str(root)), key=key)
    for d in (root, root / "manifests", root / "blobs"):
        os.chmod(d, 0o755)
    s = open_store(str(root))
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root / "blobs").st_mode) == 0o700
    assert "readable by others" in caplog.text
    assert read(s, key=key).values == {"x": 1}


def test_delete_and_restore_by_id_find_the_authentic_one(store, key):
    cid = write({"x": "real"}, store, key=key, stream="b.ipynb").checkpoint_id
    # a forged copy under the same name, in a folder listed before the real one
    forged = _plant(store, "0-first", f"{cid}.json", _forged("b.ipynb", {}, cid=cid))
    assert read(store, key=key, checkpoint_id=cid).values == {"x": "real"}
    keyed = open_store(store.root, key=key)
    keyed.delete(cid)
    assert os.path.exists(forged) and keyed.list(key=key) == []


def test_links_in_the_blob_folders_lead_nowhere(store, key, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("v")
    ns = {"x": np.arange(100)}
    m = write(ns, store, key=key).manifest
    # a blob swapped for a link to a file outside: the next write of it replaces the link
    for d in m.blobs:
        os.unlink(store.blob_path(d))
        os.symlink(victim, store.blob_path(d))
    with pytest.raises(CheckpointError):
        read(store, key=key)
    write(ns, store, key=key)
    assert all(not os.path.islink(store.blob_path(d)) for d in m.blobs)
    assert victim.read_text() == "v"
    np.testing.assert_array_equal(read(store, key=key).values["x"], ns["x"])
    # every blob folder swapped for a link to a folder outside (or a file): nothing lands
    # there, and the write still succeeds; the links it met are set aside, not followed or
    # deleted (refusing would fail every later pause whose blob starts with those characters)
    blobs = os.path.join(store.root, "blobs")
    shutil.rmtree(blobs)
    os.makedirs(blobs)
    for i in range(256):
        if i % 2:
            os.symlink(outside, os.path.join(blobs, f"{i:02x}"))
        else:
            with open(os.path.join(blobs, f"{i:02x}"), "w") as f:
                f.write("planted")
    ns2 = {"y": np.arange(1000), "z": list(range(50))}
    m2 = write(ns2, store, key=key).manifest
    assert sorted(os.listdir(outside)) == ["victim"] and victim.read_text() == "v"
    for d in m2.blobs:
        path = store.blob_path(d)
        assert os.path.isfile(path) and not os.path.islink(os.path.dirname(path))
        aside = [n for n in os.listdir(blobs) if n.startswith(d[:2] + ".set-aside-")]
        assert len(aside) == 1
        kept = os.path.join(blobs, aside[0])
        assert (os.readlink(kept) == str(outside)) if int(d[:2], 16) % 2 else (
            Path(kept).read_text() == "planted")
    back = read(store, key=key).values
    np.testing.assert_array_equal(back["y"], ns2["y"])
    assert back["z"] == ns2["z"]
    # the folders set aside are not blobs to anyone who lists the store
    assert {d for d, _ in store.blob_files()} <= set(m.blobs) | set(m2.blobs)
    # a writer that looked while a link was there, then sets aside what another writer has
    # since made a folder (with the blob of a published checkpoint in it): the folder stays
    d = next(iter(m2.blobs))
    localfs._set_aside(os.path.dirname(store.blob_path(d)))
    assert os.path.isfile(store.blob_path(d))
    assert len([n for n in os.listdir(blobs) if n.startswith(d[:2] + ".")]) == 1
    # the blobs folder itself a link: a set-up someone made, refused rather than moved
    shutil.rmtree(blobs)
    os.symlink(outside, blobs)
    with pytest.raises(CheckpointError, match="not a folder"):
        write({"w": np.arange(10)}, store, key=key)
    assert os.path.islink(blobs) and sorted(os.listdir(outside)) == ["victim"]
