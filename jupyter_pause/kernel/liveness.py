"""Process-local liveness state.

The token lives only in this module's globals, i.e. only in this kernel process's memory: it is
never written anywhere by the kernel. If the process survives a pause (a pod snapshot restored it)
the token is still here; a fresh kernel, even one for the same notebook, has ``None``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..variables import VariableRow

_token: str | None = None
_armed_at: float | None = None
_never_pause: bool = False
# Set when this process's namespace was rebuilt from a checkpoint (by %restore/%resume or the
# server's fallback restore), so the server can tell "already restored" from "fresh".
_restored: dict[str, Any] | None = None


def arm(token: str | None) -> None:
    """Remember the server's token for this pause (None disarms)."""
    global _token, _armed_at
    _token = token
    _armed_at = time.time() if token is not None else None


def token() -> str | None:
    return _token


def set_never_pause(value: bool) -> None:
    global _never_pause
    _never_pause = bool(value)


def never_pause() -> bool:
    return _never_pause


def mark_restored(
    checkpoint_id: str | None, by: str, variables: list[VariableRow] | None = None
) -> None:
    """Remember the restore, with its per-variable rows: the server reports them when it finds
    a kernel that restored itself (``%resume``), as it does for a restore it ran."""
    global _restored
    _restored = {
        "checkpoint_id": checkpoint_id,
        "at": time.time(),
        "by": by,
        "variables": [dict(v) for v in variables or []],
    }


def update_restored(rows: list[VariableRow]) -> None:
    """Replace the restore's rows that a later recompute changed (matched by name)."""
    if not _restored:
        return
    changed = {r["name"]: dict(r) for r in rows if r.get("name")}
    _restored["variables"] = [changed.get(v["name"], v) for v in _restored["variables"]]


def restored() -> dict[str, Any] | None:
    if not _restored:
        return None
    return {**_restored, "variables": [dict(v) for v in _restored["variables"]]}


def state() -> dict[str, Any]:
    """What ``bridge.liveness()`` reports."""
    return {
        "token": _token,
        "pid": os.getpid(),
        "armed_at": _armed_at,
        "never_pause": _never_pause,
        "restored": restored(),
        "cells_run": _cells_run(),
    }


def _cells_run() -> int | None:
    """Cells the person ran in this process (IPython's execution counter starts at 1; the
    server's own calls are not stored in the history, so they do not count)."""
    try:
        from IPython import get_ipython

        ip = get_ipython()
        return None if ip is None else max(0, int(ip.execution_count) - 1)
    except Exception:  # noqa: BLE001 - unknown is not zero: the caller treats it as used
        return None
