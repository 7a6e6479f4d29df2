"""The server's ``state.json`` as the other layers read it.

The server's journal writes the file; the kernel (``%checkpoint``'s retention) and the policy
tools (gc) only read which checkpoints the workspace still needs. Standard library only, so the
kernel side can import it without pulling in server code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

STATE_FILE = "state.json"


def read_state(state_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The server's state.json as a dict; None when it is missing or not a JSON object.

    Other OSErrors (permissions) propagate: the server must not start over an unreadable state.
    """
    try:
        with open(os.path.join(state_dir, STATE_FILE), encoding="utf-8") as fh:
            st = json.load(fh)
    except (FileNotFoundError, ValueError):
        return None
    return st if isinstance(st, dict) else None


def needed_ids(state: Mapping[str, Any] | None) -> set[str]:
    """Checkpoint ids a state (as state.json or the server's live state holds it) needs to come
    back: those of the pause in effect and of the one in flight, per notebook and per kernel."""
    out: set[str] = set()
    for part in ("pause", "inflight"):
        p = (state or {}).get(part)
        if not isinstance(p, Mapping):
            continue
        ids = p.get("checkpoints")
        out.update(i for i in (ids if isinstance(ids, list) else []) if isinstance(i, str) and i)
        kernels = p.get("kernels")
        out.update(k["checkpoint_id"] for k in (kernels if isinstance(kernels, list) else [])
                   if isinstance(k, Mapping) and isinstance(k.get("checkpoint_id"), str))
    # what a kernel death or a killed server offers, until it is restored or dismissed
    offers = (state or {}).get("offers")
    out.update(o["checkpoint_id"] for o in (offers.values() if isinstance(offers, Mapping)
                                             else [])
               if isinstance(o, Mapping) and isinstance(o.get("checkpoint_id"), str))
    return out


def protected_ids(state_dir: str | None) -> set[str]:
    """Checkpoint ids the workspace still needs to come back (from the server's state.json)."""
    try:
        return needed_ids(read_state(state_dir) if state_dir else None)
    except OSError:
        return set()
