"""Tampering and bad input are refused before anything is unpickled."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jupyter_pause.checkpoint import (
    CheckpointError,
    IntegrityError,
    KeyMismatchError,
    load_or_create_key,
    read,
    write,
)

from .helpers import SideEffect


def _blob_files(store):
    root = os.path.join(store.root, "blobs")
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.fixture
def signed(store, key, tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "unpickled.marker"
    ns = {
        "boom": SideEffect(str(marker)),
        "arr": np.ones(300_000),
        "t": torch.ones(1000),
        "x": [1, 2, 3],
    }
    res = write(ns, store, key=key)
    marker.unlink(missing_ok=True)  # __getstate__ path never writes it, but be sure
    assert len(_blob_files(store)) >= 3
    return res, marker


def test_flipped_byte_in_every_blob_is_refused_before_unpickling(store, key, signed):
    _res, marker = signed
    for path in _blob_files(store):
        size = os.path.getsize(path)
        for off in sorted({0, size // 2, size - 1}):
            _flip(path, off)
            with pytest.raises(IntegrityError, match="corrupt|digest|refusing"):
                read(store, key=key)
            assert not marker.exists(), "a stream was unpickled before verification"
            _flip(path, off)  # restore
    rr = read(store, key=key)
    assert marker.exists() and rr.values["x"] == [1, 2, 3]


def test_flipped_byte_in_manifest_and_foreign_key(store, key, signed, tmp_path):
    res, marker = signed
    mpath = store.manifest_path("default", res.checkpoint_id)
    size = os.path.getsize(mpath)
    for off in range(0, size, max(1, size // 40)):
        _flip(mpath, off)
        with pytest.raises(IntegrityError) as ei:
            read(store, key=key)
        assert "\n" not in str(ei.value)
        _flip(mpath, off)
    other = load_or_create_key(str(tmp_path / "other.key"))
    with pytest.raises(KeyMismatchError, match="another key"):
        read(store, key=other)
    assert not marker.exists()
    assert store.list(key=other) == []  # foreign manifests are not listed as valid


def test_missing_and_truncated_blob(store, key, signed):
    _res, marker = signed
    files = sorted(_blob_files(store), key=os.path.getsize)
    big = files[-1]
    with open(big, "rb") as f:
        data = f.read()
    with open(big, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(IntegrityError, match="wrong size|corrupt"):
        read(store, key=key)
    os.unlink(big)
    with pytest.raises(IntegrityError, match="missing"):
        read(store, key=key)
    assert not marker.exists()


def test_bad_device_policy_and_bad_key_file(store, key, tmp_path):
    write({"a": 1}, store, key=key)
    with pytest.raises(CheckpointError, match="device policy"):
        read(store, key=key, device="tpu")
    bad = tmp_path / "bad.key"
    bad.write_text("not hex")
    with pytest.raises(CheckpointError, match="not a valid key"):
        load_or_create_key(str(bad))
