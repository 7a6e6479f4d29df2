"""Clean-up of a workspace: old checkpoints, unreferenced blobs, expired snapshots and triggers.

Order, so that nothing is ever orphaned or left dangling:

1. the backend's snapshots and triggers (``Backend.gc``; GKE deletes the snapshots before their
   policy, or the bucket files would be orphaned): a snapshot is the fast way back and the
   checkpoint its fallback, so the fallback goes after the snapshot, never before;
2. checkpoint manifests beyond the policy (a manifest is the only thing that references blobs);
3. blobs no remaining manifest references (which also spares blobs of a checkpoint being written
   right now, through its write leases).

Steps 2 and 3 are the checkpoint library's :func:`~jupyter_pause.checkpoint.retention.prune`,
whose policy is the one the write path applies: per notebook, a checkpoint goes when it is beyond
the newest ``keep`` (``keep=0``: no count limit) AND, with ``older_than``, older than that; with
neither rule nothing goes. Never deleted: every checkpoint the workspace needs to resume
(:func:`pause_needs`) and every pinned one. Only manifests that verify under the key and sit in
their own place count: gc loads the key, and a file it cannot authenticate is reported
("unverified, left alone"), never deleted and never counted toward ``keep``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from typing import Any

from ..checkpoint import default_key_path, load_or_create_key, open_store
from ..checkpoint.retention import prune
from ..statefile import needed_ids, protected_ids

ORDER = ("backend snapshots and triggers", "checkpoint manifests", "unreferenced blobs")


class GCError(Exception):
    """A refused gc request; ``str()`` is one line."""


def pause_needs(state_dir: str | None, live_state: Mapping[str, Any] | None = None) -> set[str]:
    """Checkpoint ids the workspace needs to come back: those of the pause in effect or in
    flight, as ``state.json`` in ``state_dir`` records them and, inside the server, as its live
    state holds them (state.json is written behind it)."""
    return protected_ids(state_dir) | needed_ids(live_state)


def _summary(m: Any) -> dict[str, Any]:
    return {"id": m.id, "stream": m.stream, "created": m.created, "bytes_total": m.bytes_total}


def load_key(key_path: str | None, store: Any = None) -> bytes | None:
    """The checkpoint key, never a new one: without the key nothing in the store can be told
    from a forgery, so gc refuses rather than delete on unsigned data. None when there is no key
    and ``store`` holds no manifest at all (nothing to authenticate: only stray blobs go)."""
    path = os.path.expanduser(key_path or default_key_path())
    if not os.path.exists(path):
        if store is not None and not store.manifest_files():
            return None
        raise GCError(f"no checkpoint key at {path}: gc cannot tell authentic checkpoints from "
                      "forged ones, so it deletes nothing (pass the key with --key)")
    try:
        return load_or_create_key(path)
    except Exception as e:  # noqa: BLE001 - CheckpointError and whatever key checks refuse
        raise GCError(str(e)) from None


async def run_gc(*, store_url: str | None, state_dir: str | None, keep: int,
                 older_than: float | None, dry_run: bool, backend: Any = None,
                 now: float | None = None, grace_s: float = 0.0,
                 protected: set[str] | None = None, key_path: str | None = None,
                 key: bytes | None = None) -> dict[str, Any]:
    """The whole clean-up (store I/O runs in a thread; the backend call is async).

    ``keep``: checkpoints kept per notebook, 0 for no count limit (see the module docstring)."""
    if keep < 0:  # before anything is deleted, the backend's part included
        raise GCError("--keep must be 0 or more (0: no count limit)")
    now = time.time() if now is None else now
    key = key or load_key(key_path, open_store(store_url))
    protected = pause_needs(state_dir) | set(protected or ())
    result: dict[str, Any] = {"dry_run": dry_run, "order": list(ORDER),
                              "protected": sorted(protected)}

    # 1. snapshots and triggers, through the backend
    if backend is not None and hasattr(backend, "gc"):
        try:
            result["backend"] = {"name": getattr(backend, "name", "?"),
                                 **(await backend.gc(keep=keep, older_than=older_than,
                                                     dry_run=dry_run) or {})}
        except Exception as e:  # noqa: BLE001 - the store is independent: go on, say so
            result["backend"] = {"name": getattr(backend, "name", "?"), "error": str(e)}
    else:
        result["backend"] = None

    def store_part() -> dict[str, Any]:
        # 2. manifests, 3. blobs
        store = open_store(store_url, key=key)
        done = prune(store, key=key, keep=keep, older_than=older_than, now=now,
                     protected=protected, dry_run=dry_run, grace_s=grace_s)
        return {
            "store": store.url,
            "checkpoints": {"deleted": [_summary(m) for m in done.deleted],
                            "remaining": len(done.kept)},
            "unverified": [{**u, "action": "unverified, left alone"} for u in done.unverified],
            "pinned": sorted(done.pinned),
            "blobs": done.blobs,
            "remaining": done.remaining,
        }

    result.update(await asyncio.get_running_loop().run_in_executor(None, store_part))
    return result


async def run_gc_for_app(app: Any, *, keep: int | None, older_than: float | None,
                         dry_run: bool) -> dict[str, Any]:
    """gc inside the server (``POST jupyter-pause/api/gc``): the app's store, state and backend.

    ``keep=None``: the app's ``keep_checkpoints``; 0 means no count limit. The caller refuses
    while a flight runs; the pause in effect is protected through state.json and, belt and
    braces, through the Lifecycle's in-memory state.
    """
    if keep is None and "keep_checkpoints" in (getattr(app, "config_problems", None) or {}):
        # Its value was refused at start: never clean up by a default nobody chose.
        raise GCError(f"PauseApp.keep_checkpoints is invalid "
                      f"({app.config_problems['keep_checkpoints']}); fix it or pass --keep")
    lc = getattr(app, "lifecycle", None)
    live = pause_needs(None, lc.state) if lc is not None else set()
    return await run_gc(store_url=app.store_url or None, state_dir=app.state_dir,
                        keep=app.keep_checkpoints if keep is None else keep,
                        older_than=older_than, dry_run=dry_run,
                        backend=getattr(app, "backend_instance", None), protected=live,
                        key_path=getattr(app, "key_path", None) or None)


def render(result: dict[str, Any]) -> str:
    """What `jupyter pause gc` prints: what was (or would be) deleted, then what remains."""
    verb = "would delete" if result["dry_run"] else "deleted"
    lines = []
    b = result.get("backend")
    if b is None:
        lines.append("snapshots/triggers: skipped (no backend: run against the server, "
                     "or pass --backend)")
    elif b.get("error"):
        lines.append(f"snapshots/triggers ({b['name']}): failed: {b['error']}")
    else:
        dels = b.get("deleted") or b.get("would_delete") or []
        rem, stuck = b.get("remaining") or [], b.get("stuck") or []
        lines.append(f"snapshots/triggers ({b['name']}): {verb} {len(dels)}, remaining "
                     f"{len(rem)}" + (f", stuck deleting {len(stuck)}" if stuck else ""))
        for d in dels:
            lines.append(f"  - {d if isinstance(d, str) else d.get('name', d)}")
        for d in stuck:
            lines.append(f"  ! stuck: {d}")
    ck = result["checkpoints"]
    lines.append(f"checkpoints: {verb} {len(ck['deleted'])}, remaining {ck['remaining']}")
    for m in ck["deleted"]:
        lines.append(f"  - {m['id']}  {m['stream']}  {m['created']}  {m['bytes_total']} B")
    bl = result["blobs"]
    lines.append(f"blobs: {verb} {bl['deleted']} ({bl['bytes_freed']} B), temp files "
                 f"{bl['temps_removed']}")
    unverified = result.get("unverified") or []
    if unverified:
        lines.append(f"unverified, left alone: {len(unverified)} file(s)")
        for u in unverified[:20]:
            lines.append(f"  ? {u['path']}: {u['reason']}")
        if len(unverified) > 20:
            lines.append(f"  ... and {len(unverified) - 20} more")
    r = result["remaining"]
    lines.append(f"remaining: {r['checkpoints']} checkpoints in {r['streams']} notebooks, "
                 f"{r['blobs']} blobs, {r['bytes']} B in the store")
    if result.get("protected"):
        lines.append(f"kept for resume: {', '.join(result['protected'])}")
    return "\n".join(lines)
