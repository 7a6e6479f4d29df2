"""Large blobs bypass the page cache (O_DIRECT through aligned bounce buffers), fall back to
buffered writes where the file system refuses, and keep every checkpoint invariant."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile

import numpy as np
import pytest

from jupyter_pause.checkpoint import StorageFullError, directio, open_store, read, write
from jupyter_pause.checkpoint.store import blob_hasher

from .helpers import fs_type

pytestmark = pytest.mark.skipif(not directio.supported(), reason="no O_DIRECT on this OS")



@pytest.fixture
def disk_dir():
    """A folder on a disk-backed file system (O_DIRECT works on ext4/xfs/btrfs)."""
    root = tempfile.mkdtemp(prefix="jp-dio-", dir="/var/tmp")
    if fs_type(root) in ("tmpfs", "ramfs"):
        shutil.rmtree(root)
        pytest.skip("/var/tmp is a tmpfs here")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_refusals(monkeypatch):
    monkeypatch.setattr(directio, "_refused", {})


@pytest.fixture
def opened(monkeypatch):
    """Records (path, direct) of every blob file the store creates."""
    seen: list[tuple[str, bool]] = []
    real = directio.open_new

    def spy(path, *a, **kw):
        fd, direct = real(path, *a, **kw)
        seen.append((path, direct))
        return fd, direct

    monkeypatch.setattr(directio, "open_new", spy)
    return seen


def _put(store, pieces: list[bytes]) -> tuple[str, int]:
    txn = store.begin("20260101T000000000000Z-abcdef")
    try:
        out = store.put_blob(txn, pieces, size_hint=sum(map(len, pieces)))
        store.sync(txn)
    finally:
        txn.release()
    return out


@pytest.mark.parametrize("tail", [0, 1, 4095, 4097, 12345])
def test_direct_blob_is_byte_exact_whatever_the_tail(disk_dir, opened, tail):
    store = open_store(os.path.join(disk_dir, "s"))
    rng = np.random.default_rng(tail)
    n = directio.DIRECT_MIN + 3 * directio.ALIGN + tail
    data = rng.bytes(n)
    # odd piece boundaries: pieces straddle bounce buffers and alignment
    pieces = [data[:7], data[7:1_000_003], data[1_000_003:]]
    digest, size = _put(store, pieces)
    assert [d for _, d in opened] == [True]
    h = blob_hasher()
    h.update(data)
    assert (digest, size) == (h.hexdigest(), n)
    with open(store.blob_path(digest), "rb") as f:
        assert f.read() == data  # padded tail cut back: not one byte more
    assert os.listdir(os.path.join(store.root, "tmp")) == []


def test_small_blobs_stay_buffered(disk_dir, opened):
    store = open_store(os.path.join(disk_dir, "s"))
    _put(store, [b"x" * (directio.DIRECT_MIN - 1)])
    assert [d for _, d in opened] == [False]


def test_o_direct_refused_at_open_falls_back_logged_once(disk_dir, opened, monkeypatch, caplog):
    real = os.open

    def no_direct(path, flags, *a, **kw):  # tmpfs before Linux 6.6, some FUSE file systems
        if flags & os.O_DIRECT:
            real(path, flags & ~os.O_DIRECT, *a, **kw)  # Linux creates the file, then refuses
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", no_direct)
    store = open_store(os.path.join(disk_dir, "s"))
    data = np.random.default_rng(0).bytes(directio.DIRECT_MIN + 100)
    with caplog.at_level(logging.INFO, logger=directio.__name__):
        d1, _ = _put(store, [data])
        d2, _ = _put(store, [data[::-1]])
    assert [d for _, d in opened] == [False, False]
    refusals = [r for r in caplog.records if "written buffered" in r.getMessage()]
    assert len(refusals) == 1 and "O_DIRECT refused at open" in refusals[0].getMessage()
    for digest, want in ((d1, data), (d2, data[::-1])):
        with open(store.blob_path(digest), "rb") as f:
            assert f.read() == want
    assert os.listdir(os.path.join(store.root, "tmp")) == []


def test_tmpfs_blobs_are_byte_exact_direct_or_not():
    if not os.path.isdir("/dev/shm") or fs_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    root = tempfile.mkdtemp(prefix="jp-dio-", dir="/dev/shm")
    try:
        store = open_store(os.path.join(root, "s"))
        data = np.random.default_rng(5).bytes(directio.DIRECT_MIN + 4097)
        digest, _ = _put(store, [data])
        with open(store.blob_path(digest), "rb") as f:
            assert f.read() == data
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_o_direct_refused_at_first_write_falls_back_on_the_same_file(disk_dir, monkeypatch,
                                                                     caplog):
    import fcntl

    real = os.pwrite

    def picky(fd, buf, off):  # a file system that opens with O_DIRECT but refuses its I/O
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buf, off)

    monkeypatch.setattr(os, "pwrite", picky)
    store = open_store(os.path.join(disk_dir, "s"))
    data = np.random.default_rng(1).bytes(2 * directio.DIRECT_MIN + 777)
    with caplog.at_level(logging.INFO, logger=directio.__name__):
        digest, size = _put(store, [data])
    assert size == len(data)
    with open(store.blob_path(digest), "rb") as f:
        assert f.read() == data
    assert any("O_DIRECT write refused" in r.getMessage() for r in caplog.records)


def test_checkpoint_round_trip_through_direct_io(disk_dir, key, opened):
    torch = pytest.importorskip("torch")
    store = open_store(os.path.join(disk_dir, "s"))
    rng = np.random.default_rng(3)
    ns = {
        "arr": rng.random(1_500_000),  # 12 MB: an out-of-band buffer of its own
        "w": torch.randn(3_000_000),  # 12 MB in a tensor pack
        "small": {"k": [1, 2, 3]},
    }
    res = write(ns, store, key=key)
    assert all(v.status == "saved" for v in res.variables)
    assert sum(d for _, d in opened) >= 2  # the array and the pack went direct
    out = read(store, key=key).values
    np.testing.assert_array_equal(out["arr"], ns["arr"])
    torch.testing.assert_close(out["w"], ns["w"])
    assert out["small"] == ns["small"]


def test_disk_full_during_a_direct_write_keeps_the_previous_checkpoint(disk_dir, key,
                                                                       monkeypatch):
    store = open_store(os.path.join(disk_dir, "s"))
    first = write({"n": 1, "a": np.arange(10)}, store, key=key)
    real = os.pwrite
    calls = {"n": 0}

    def full(fd, buf, off):
        calls["n"] += 1
        if calls["n"] > 2:  # a few bounce buffers land, then the device is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buf, off)

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(StorageFullError, match="no space left"):
        write({"n": 2, "big": np.random.default_rng(4).random(4_000_000)}, store, key=key)
    monkeypatch.undo()
    assert calls["n"] > 2
    assert store.manifest_ids("default") == [first.checkpoint_id]
    assert os.listdir(os.path.join(store.root, "tmp")) == []
    assert read(store, key=key).values["n"] == 1


def test_bounce_buffers_stay_within_five_percent_of_the_blob():
    for size in (directio.DIRECT_MIN, 100 << 20, 1 << 30, 8 << 30):
        b = directio.bounce_size(size)
        assert b % directio.ALIGN == 0 and b >= directio.BOUNCE_MIN
        if size >= 64 << 20:
            assert directio.DEPTH * b <= 0.05 * size
