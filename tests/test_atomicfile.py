"""The one atomic small-file write: private, whole or absent, fsync'd as asked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from jupyter_pause import atomicfile
from jupyter_pause.atomicfile import replace_file


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
def test_new_and_replaced_files_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    old = os.umask(0)
    try:
        replace_file(target, '{"a": 1}')
        assert target.read_text() == '{"a": 1}' and _mode(target) == 0o600
        target.chmod(0o644)  # the old file's mode is not carried over: the new file is ours
        replace_file(target, b"\x00\x01")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"\x00\x01" and _mode(target) == 0o600
    assert os.listdir(tmp_path) == ["state.json"]  # no temp file left


def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # a rename over a folder fails
    with pytest.raises(OSError):
        replace_file(target, "new")
    assert sorted(os.listdir(tmp_path)) == ["taken"] and target.is_dir()


def test_a_planted_temp_name_is_never_written_through(tmp_path: Path) -> None:
    # a link where a fixed temp name would be: the write must not follow it
    outside = tmp_path / "outside"
    outside.write_text("untouched")
    target = tmp_path / "marker.json"
    (tmp_path / "marker.json.tmp").symlink_to(outside)
    replace_file(target, "mine")
    assert target.read_text() == "mine" and not target.is_symlink()
    assert outside.read_text() == "untouched"


@pytest.mark.parametrize(("durable", "sync_dir", "want"), [
    (True, False, ["file"]), (False, False, []), (True, True, ["file", "dir"]),
])
def test_fsync_as_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool,
                        sync_dir: bool, want: list[str]) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(atomicfile.os, "fsync", fsync)
    replace_file(tmp_path / "f", "x", durable=durable, sync_dir=sync_dir)
    assert synced == want
