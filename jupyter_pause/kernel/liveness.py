"""Process-local liveness state.

The token lives only in this module's globals, i.e. only in this kernel process's memory: it is
never written anywhere by the kernel. If the process survives a pause (a pod snapshot restored it)
the token is still here; a fresh kernel, even one for the same notebook, has ``None``.
"""

from __future__ import annotations

import os
import time
from typing import Any

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


def mark_restored(checkpoint_id: str | None, by: str) -> None:
    global _restored
    _restored = {"checkpoint_id": checkpoint_id, "at": time.time(), "by": by}


def restored() -> dict[str, Any] | None:
    return dict(_restored) if _restored else None


def state() -> dict[str, Any]:
    """What ``bridge.liveness()`` reports."""
    return {
        "token": _token,
        "pid": os.getpid(),
        "armed_at": _armed_at,
        "never_pause": _never_pause,
        "restored": restored(),
    }
