"""Bridge failures keep their type: the kernel side sends ``error_type`` (the exception's class
in checkpoint.errors) and the server reads the reason from it (server.bridgeresults)."""

from __future__ import annotations

import errno

import pytest

from jupyter_pause.checkpoint import errors
from jupyter_pause.server.bridgeresults import CheckpointResult, RestoreResult

from .bridge_util import bridge

pytestmark = pytest.mark.timeout(120)


def test_full_store_crosses_the_bridge_as_storage_full(kernel_factory, mount_tmpfs, tmp_path):
    store = str(mount_tmpfs("1m") / "store")
    k = kernel_factory()
    k.ok("import numpy as np\nbig = np.random.default_rng(0).random(400_000)")  # 3 MiB
    raw = bridge(k, "checkpoint", store_url=store, key_path=str(tmp_path / "k.key"))
    assert raw["ok"] is False and raw["error_type"] == "StorageFullError", raw
    res = CheckpointResult.from_json(raw)
    assert res.failure is not None and res.failure.reason("checkpoint_error") == "storage_full"
    assert res.failure.unreadable is None


def test_missing_checkpoint_is_unreadable_by_type(kernel_factory, tmp_path):
    k = kernel_factory()
    raw = bridge(k, "restore", store_url=str(tmp_path / "empty-store"),
                 key_path=str(tmp_path / "k.key"), checkpoint_id="no-such-checkpoint")
    assert raw["ok"] is False and raw["error_type"] == "NotFoundError", raw
    res = RestoreResult.from_json(raw)
    assert res.failure is not None and res.failure.unreadable == "missing"
    assert res.failure.reason("restore_error") == "not_found"


def test_error_type_names():
    assert errors.error_type(errors.KeyMismatchError("other key")) == "KeyMismatchError"
    assert errors.error_type(type("Mine", (errors.StorageFullError,), {})()) == \
        "StorageFullError"  # a subclass elsewhere reads as the engine's own type
    assert errors.error_type(OSError(errno.ENOSPC, "No space left")) == "StorageFullError"
    assert errors.error_type(ValueError("x")) == "ValueError"
