"""One server per state directory: an exclusive ``flock`` on ``<state_dir>/server.lock``.

Two servers writing one journal would repeat its sequence numbers and overwrite each other's
state.json (two pods on one volume, a restarted pod whose old one has not died yet). The lock
file holds the holder's identity (host, pid, process start time, boot id) so the refusal can
name it. The kernel releases a flock when its holder dies, however it dies, so a server that
finds the lock free may take over: the previous holder is provably gone.

Limits: on a local file system this is exact. On NFS, Linux emulates flock with byte-range
(fcntl) locks that the server holds for the client; a client that dies without unlocking keeps
the lock until the NFS server's lease expires (NFSv4, about 90 s), and NFSv3 without lockd gives
no lock at all. On fsspec-only storage (no POSIX locks) there is no lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

from ..journal import make_private_dir

LOCK_FILE = "server.lock"


class StateDirBusy(Exception):
    """Another live process holds the state directory; ``holder`` is what it wrote."""

    def __init__(self, message: str, holder: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.holder = holder


def identity() -> dict[str, Any]:
    """Who holds the lock: enough to tell this process from any other, here or elsewhere."""
    info: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    try:
        import psutil

        info["started"] = psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - optional detail
        info["started"] = None
    try:
        info["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        info["boot_id"] = None
    return info


class StateLock:
    """One server per state directory: an flock on a file naming its holder (host, pid)."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> dict[str, Any]:
        """Take the lock or raise StateDirBusy naming the holder. Returns this holder's identity."""
        make_private_dir(self.path.parent)  # the state directory is private (0700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            who = (f"host {holder.get('host')}, pid {holder.get('pid')}" if holder
                   else "an unknown process")
            raise StateDirBusy(
                f"another Jupyter server ({who}) uses the state directory {self.path.parent}; "
                "only one server may use a state directory (set c.PauseApp.state_dir to "
                "another one, or stop the other server)", holder) from None
        except OSError as e:  # a file system without locks: say so, run without one
            os.close(fd)
            raise OSError(f"cannot lock {self.path}: {e.strerror or e}") from e
        me = identity()
        data = json.dumps(me).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        self._fd = fd
        return me

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = None


def _read(fd: int) -> dict[str, Any] | None:
    try:
        raw = os.pread(fd, 4096, 0)
        data = json.loads(raw) if raw else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
