"""Restores read big blobs with O_DIRECT, several requests in flight, hashed in file order; they
fall back to buffered reads where the file system refuses, and a blob that is not what the
manifest says is still refused."""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import threading
import time

import numpy as np
import pytest

from jupyter_pause.checkpoint import IntegrityError, directio, open_store, read, write
from jupyter_pause.checkpoint.store import blob_hasher

from .helpers import fs_type

pytestmark = pytest.mark.skipif(not directio.supported(), reason="no O_DIRECT on this OS")


@pytest.fixture
def disk_dir(tmp_path):
    if fs_type(str(tmp_path)) in ("tmpfs", "ramfs"):
        pytest.skip("the temporary folder is in memory here: no device to read directly")
    return str(tmp_path)


@pytest.fixture(autouse=True)
def _small_pieces(monkeypatch):
    # small requests, so a few MiB make many pieces in flight, straddling every boundary
    monkeypatch.setattr(directio, "READ_PIECE", 1 << 20)
    monkeypatch.setattr(directio, "_refused", {})


@pytest.fixture
def preads(monkeypatch):
    """Whether each read request ran with O_DIRECT on its descriptor."""
    seen: list[bool] = []
    real = os.preadv

    def spy(fd, bufs, off):
        seen.append(bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT))
        return real(fd, bufs, off)

    monkeypatch.setattr(os, "preadv", spy)
    return seen


def _read(path: str, size: int) -> tuple[bytes, int, str]:
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    h = blob_hasher()
    fd = os.open(path, os.O_RDONLY)
    try:
        got = directio.read_file(fd, path, memoryview(buf), size, h)
        # the descriptor is left as it was: buffered, for the caller's own reads
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    finally:
        os.close(fd)
    return bytes(buf[:got]), got, h.hexdigest()


@pytest.mark.parametrize("tail", [0, 1, 4095, 4097])
def test_direct_read_is_byte_exact_and_hashed_in_order(disk_dir, preads, tail):
    data = np.random.default_rng(tail).bytes(3 * (1 << 20) + 5 * directio.ALIGN + tail)
    path = os.path.join(disk_dir, "blob")
    with open(path, "wb") as f:
        f.write(data)
    got, n, digest = _read(path, len(data))
    h = blob_hasher()
    h.update(data)
    assert (got, n, digest) == (data, len(data), h.hexdigest())
    assert len(preads) >= 4 and preads[0]  # the aligned part went direct
    assert preads[-1] == (tail == 0)  # an unaligned tail is read buffered


def test_a_shorter_file_reads_short(disk_dir):
    data = np.random.default_rng(1).bytes(2 * (1 << 20) + 100)
    path = os.path.join(disk_dir, "blob")
    with open(path, "wb") as f:
        f.write(data)
    got, n, _ = _read(path, len(data) + 3 * (1 << 20))  # the manifest says more than is there
    assert n == len(data) and got == data


def test_o_direct_refused_at_the_first_read_falls_back(disk_dir, monkeypatch, caplog):
    real = os.preadv

    def picky(fd, bufs, off):  # takes the flag, refuses the I/O (some FUSE file systems)
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, off)

    monkeypatch.setattr(os, "preadv", picky)
    data = np.random.default_rng(2).bytes(4 * (1 << 20) + 17)
    path = os.path.join(disk_dir, "blob")
    with open(path, "wb") as f:
        f.write(data)
    with caplog.at_level(logging.INFO, logger=directio.__name__):
        got, n, _ = _read(path, len(data))
    assert (got, n) == (data, len(data))
    assert any("O_DIRECT read refused" in r.getMessage() for r in caplog.records)


def test_o_direct_refused_to_two_readers_at_once_falls_back(disk_dir, monkeypatch):
    """Two reads in flight both refused: the second finds the first already fell back. Its
    read was refused for O_DIRECT all the same, so it reads again (a restore that failed here
    did so under load, when the second reader's answer came after the first one's switch)."""
    monkeypatch.setattr(directio, "READ_PIECE", 1 << 20)  # several readers for 4 MiB
    real = os.preadv
    both = threading.Barrier(2, timeout=30)
    refused = []

    def picky(fd, bufs, off):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            n = len(refused)
            refused.append(off)
            if n < 2:
                both.wait()  # two reads issued while O_DIRECT is on
                if n == 1:  # ... and this one answers after the other switched to buffered
                    deadline = time.monotonic() + 30
                    while fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
                        assert time.monotonic() < deadline, "the first reader never fell back"
                        time.sleep(0.001)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, off)

    monkeypatch.setattr(os, "preadv", picky)
    data = np.random.default_rng(5).bytes(4 * (1 << 20) + 17)
    path = os.path.join(disk_dir, "blob")
    with open(path, "wb") as f:
        f.write(data)
    got, n, _ = _read(path, len(data))
    assert (got, n) == (data, len(data)) and len(refused) >= 2


def test_restore_of_big_blobs_goes_direct_and_refuses_a_changed_one(disk_dir, key, preads):
    store = open_store(os.path.join(disk_dir, "s"))
    rng = np.random.default_rng(3)
    arr = rng.random(3_000_000)  # 24 MB: a blob above the read path's threshold
    res = write({"arr": arr, "small": [1, 2]}, store, key=key)
    out = read(store, key=key).values
    np.testing.assert_array_equal(out["arr"], arr)
    assert out["small"] == [1, 2]
    assert any(preads), "no read request went direct"

    (big,) = [d for d, b in res.manifest.blobs.items() if b["size"] >= 24_000_000]
    path = store.blob_path(big)
    with open(path, "ab") as f:  # one byte more than the manifest says
        f.write(b"\0")
    with pytest.raises(IntegrityError, match="wrong size"):
        read(store, key=key)
    with open(path, "r+b") as f:  # the right size, one byte changed in the middle
        f.truncate(res.manifest.blobs[big]["size"])
        f.seek(12_000_000)
        b = f.read(1)
        f.seek(12_000_000)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(IntegrityError, match="corrupt"):
        read(store, key=key)
