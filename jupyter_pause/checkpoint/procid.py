"""Which process wrote a lease, and whether it still runs.

A pid alone is not enough: a killed writer stays a zombie until it is reaped, and a pid is given
anew after a restart (a container restarted under the same host name numbers its processes from
1 again). A lease therefore names its writer by the boot, the pid namespace and the process's
start time in clock ticks since boot (``/proc/<pid>/stat`` field 22): unlike a start time in
wall-clock seconds, none of them moves when the clock is stepped.
"""

from __future__ import annotations

import os
from typing import Any

import psutil

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def identity(pid: int | None = None) -> dict[str, Any] | None:
    """``{"boot", "pidns", "start"}`` of process ``pid`` (this one when None); None where the
    system does not say (not Linux, /proc hidden)."""
    try:
        with open(BOOT_ID) as f:
            boot = f.read().strip()
        which = "self" if pid is None else str(pid)
        pidns = os.readlink(f"/proc/{which}/ns/pid")
        _, start = _stat(which)
    except (OSError, ValueError, IndexError):
        return None
    return {"boot": boot, "pidns": pidns, "start": start}


def _stat(which: str) -> tuple[str, int]:
    """(state, start time in ticks since boot) from ``/proc/<which>/stat``."""
    with open(f"/proc/{which}/stat") as f:
        data = f.read()
    fields = data[data.rindex(")") + 2:].split()  # the name in parentheses may hold anything
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)


def writer_alive(pid: int, ident: Any = None) -> bool:
    """Whether the process that wrote a lease on this host (``pid``, ``ident`` as the lease has
    it: untrusted) still runs. Errs on the side of alive: a live writer judged dead would have
    its temp files and unpublished blobs collected under it."""
    if isinstance(ident, dict) and {"boot", "pidns", "start"} <= ident.keys():
        mine = identity()
        if mine is None or ident["boot"] != mine["boot"] or ident["pidns"] != mine["pidns"]:
            return True  # its pids are not ours to look up: the lease's age decides
        try:
            state, start = _stat(str(pid))
        except FileNotFoundError:
            return psutil.pid_exists(pid)  # gone, or hidden from us (hidepid): kill(0) tells
        except (OSError, ValueError, IndexError):
            return True
        return state != "Z" and start == ident["start"]
    # a lease without its writer's identity (older, or not Linux): the pid alone
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True
