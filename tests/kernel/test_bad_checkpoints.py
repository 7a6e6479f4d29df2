"""Missing, foreign and corrupt checkpoints: one line, namespace untouched, old checkpoint intact."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def _error_line(out) -> str:
    assert out.status == "error", out.text
    assert "Traceback" not in out.text and out.errors == []
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


def _store_files(tmp_path: Path) -> list[Path]:
    root = tmp_path / "data" / "jupyter-pause" / "checkpoints"
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_missing_checkpoint(kernel, tmp_path):
    kernel.ok("x = 1")
    line = _error_line(kernel.run(f"%restore --from {tmp_path / 'empty-store'}"))
    assert line.startswith("UsageError: %restore failed: ")
    assert kernel.eval("x") == 1
    kernel.ok("%checkpoint")
    line = _error_line(kernel.run("%restore --id 20200101T000000000000Z-000000"))
    assert "20200101T000000000000Z-000000" in line
    line = _error_line(kernel.run("%restore --stream other.ipynb"))
    assert "other.ipynb" in line
    assert kernel.eval("x") == 1


def test_foreign_key_refused(kernel, tmp_path):
    kernel.ok("x = 1")
    kernel.ok("%checkpoint")
    kernel.ok("x = 2")
    other = tmp_path / "other.key"
    kernel.run(f"__import__('os').environ['JUPYTER_PAUSE_KEY_PATH'] = {str(other)!r}", silent=True)
    line = _error_line(kernel.run("%restore"))
    assert "key" in line.lower()
    assert kernel.eval("x") == 2
    kernel.run("__import__('os').environ.pop('JUPYTER_PAUSE_KEY_PATH')", silent=True)
    kernel.ok("%restore")
    assert kernel.eval("x") == 1


def test_corrupt_blob_refused_namespace_untouched(kernel, tmp_path):
    kernel.ok("import numpy as np\nv = np.arange(50_000)\nw = {'k': [1, 2, 3]}")
    kernel.ok("%checkpoint")
    kernel.ok("v = 'changed'\nw = None")
    blobs = [
        p
        for p in _store_files(tmp_path)
        if "manifest" not in str(p) and not p.name.endswith(".json") and p.stat().st_size > 0
    ]
    assert blobs
    for blob in blobs:  # flip one byte in every blob: whatever is read first is corrupt
        os.chmod(blob, 0o644)
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
    line = _error_line(kernel.run("%restore"))
    assert line.startswith("UsageError: %restore failed: ")
    assert kernel.eval("(v, w)") == ("changed", None)


def test_failed_checkpoint_keeps_previous(kernel, tmp_path):
    kernel.ok("x = 41")
    kernel.ok("%checkpoint")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    line = _error_line(kernel.run(f"%checkpoint --to {blocker / 'store'}"))
    assert line.startswith("UsageError: %checkpoint failed: ")
    kernel.ok("x = 0")
    kernel.ok("%restore")
    assert kernel.eval("x") == 41


@pytest.fixture
def tiny_fs(mount_tmpfs):
    return mount_tmpfs("1m")


def test_disk_full_one_line_previous_intact(kernel, tiny_fs):
    store = tiny_fs / "store"
    kernel.ok("import numpy as np\nsmall = np.arange(1000)")
    kernel.ok(f"%checkpoint --to {store}")
    kernel.ok("big = np.random.default_rng(0).random(400_000)")  # 3 MiB > 1 MiB of space
    line = _error_line(kernel.run(f"%checkpoint --to {store}"))
    assert line.startswith("UsageError: %checkpoint failed: ")
    assert "space" in line.lower() or "full" in line.lower()
    kernel.ok("small = None\ndel big")
    kernel.ok(f"%restore --from {store}")
    assert kernel.eval("(int(small.sum()), 'big' in globals())") == (sum(range(1000)), False)
