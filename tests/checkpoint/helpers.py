"""Shared bits for the checkpoint tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_py(
    code: str, *args: str, timeout: float = 120, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run ``code`` as a fresh ``__main__`` script (so its definitions live in __main__)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
        check=False,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"subprocess failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def statuses(report) -> dict[str, str]:
    return {v.name: v.status for v in report}


class SideEffect:
    """Unpickling this writes a marker file: proof that a stream was (or was not) unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __getstate__(self):
        return {"marker": self.marker}

    def __setstate__(self, state):
        self.marker = state["marker"]
        with open(self.marker, "w") as f:
            f.write("unpickled")


def fs_type(path: str) -> str:
    """The file system type of the mount that holds ``path`` (from /proc/mounts)."""
    best, kind = "", ""
    with open("/proc/mounts") as f:
        for line in f:
            mnt, fstype = line.split()[1:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best, kind = mnt, fstype
    return kind


def flip_a_byte_of_each_storage(path: str) -> None:
    """Damage a tensor pack in place: the first byte of every storage's data is flipped."""
    from jupyter_pause.checkpoint.tensors import pack_offsets

    with open(path, "r+b") as f:
        hlen = int.from_bytes(f.read(8), "little")
        base, offsets = pack_offsets(f.read(hlen), os.path.getsize(path) - 8 - hlen)
        for start, end in offsets.values():
            if end > start:
                f.seek(base + start)
                b = f.read(1)
                f.seek(base + start)
                f.write(bytes([b[0] ^ 1]))
