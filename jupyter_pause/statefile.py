"""The server's ``state.json`` as the other layers read it.

The server's journal writes the file; the kernel (``%checkpoint``'s retention) and the policy
tools (gc) only read which checkpoints the workspace still needs. Standard library only, so the
kernel side can import it without pulling in server code.
"""

from __future__ import annotations

import json
import os

STATE_FILE = "state.json"


def protected_ids(state_dir: str | None) -> set[str]:
    """Checkpoint ids the workspace still needs to come back (from the server's state.json)."""
    if not state_dir:
        return set()
    try:
        with open(os.path.join(state_dir, STATE_FILE), encoding="utf-8") as fh:
            st = json.load(fh)
    except (OSError, ValueError):
        return set()
    out: set[str] = set()
    if not isinstance(st, dict):
        return out
    for part in ("pause", "inflight"):
        p = st.get(part)
        if not isinstance(p, dict):
            continue
        ids = p.get("checkpoints")
        out.update(i for i in (ids if isinstance(ids, list) else []) if isinstance(i, str) and i)
        kernels = p.get("kernels")
        out.update(k["checkpoint_id"] for k in (kernels if isinstance(kernels, list) else [])
                   if isinstance(k, dict) and isinstance(k.get("checkpoint_id"), str))
    return out
