"""Retention and clean-up: old checkpoints, unreferenced blobs, expired snapshots and triggers.

Order, so that nothing is ever orphaned or left dangling:

1. the backend's snapshots and triggers (``Backend.gc``; GKE deletes the snapshots before their
   policy, or the bucket files would be orphaned): a snapshot is the fast way back and the
   checkpoint its fallback, so the fallback goes after the snapshot, never before;
2. checkpoint manifests beyond the policy (a manifest is the only thing that references blobs);
3. blobs no remaining manifest references (the checkpoint library's ``gc``, which also spares
   blobs of a checkpoint being written right now, through its write leases).

Policy: a checkpoint goes when it is beyond the newest ``keep`` of its notebook AND (with
``older_than``) older than that. ``keep=0`` needs ``older_than`` (it would delete everything).
Never deleted: every checkpoint the workspace needs to resume (``state.json``: the pause in
effect or in flight) and every pinned one. Only manifests that verify under the key and sit in
their own place count: gc loads the key, and a file it cannot authenticate is reported
("unverified, left alone"), never deleted and never counted toward ``keep``; ordering uses the
signed id, never an unsigned field.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from typing import Any

from ..statefile import protected_ids
from .journal import parse_time

ORDER = ("backend snapshots and triggers", "checkpoint manifests", "unreferenced blobs")


class GCError(Exception):
    """A refused gc request; ``str()`` is one line."""


def _created(m: Any) -> float | None:
    try:
        return parse_time(m.created)
    except (ValueError, TypeError):
        return None


def plan(manifests: list[Any], *, keep: int, older_than: float | None, now: float,
         protected: set[str]) -> tuple[list[Any], list[Any]]:
    """(delete, keep) lists of manifests under the retention policy."""
    if keep < 0:
        raise GCError("--keep must be 0 or more")
    if keep == 0 and older_than is None:
        raise GCError("--keep 0 would delete every checkpoint; add --older-than AGE")
    by_stream: dict[str, list[Any]] = defaultdict(list)
    for m in manifests:
        by_stream[m.stream].append(m)
    delete, kept = [], []
    for ms in by_stream.values():
        # the signed id, bound to the file name: a forged ``created`` cannot push real ones out
        ms.sort(key=lambda m: m.id, reverse=True)
        for rank, m in enumerate(ms):
            created = _created(m)
            # Both rules keep: the newest ``keep`` and, with older_than, anything younger.
            old_enough = older_than is None or (created is not None
                                                and now - created > older_than)
            doomed = rank >= keep and old_enough
            (delete if doomed and m.id not in protected else kept).append(m)
    return delete, kept


def usage(store: Any) -> dict[str, int]:
    """Every object and byte in the store: manifests, blobs, temp files."""
    def size(path: str) -> int:
        try:
            return os.path.getsize(path) if store.local else int(store.fs.size(path))
        except (OSError, FileNotFoundError):
            return 0

    out = {"manifests": 0, "manifest_bytes": 0, "blobs": 0, "blob_bytes": 0, "temp_files": 0,
           "temp_bytes": 0}
    for p in store._manifest_files():
        out["manifests"] += 1
        out["manifest_bytes"] += size(p)
    blobs = store._join("blobs")
    for sub in store._ls(blobs):
        for d in store._ls(store._join("blobs", sub)):
            out["blobs"] += 1
            out["blob_bytes"] += size(store._join("blobs", sub, d))
    for n in store._ls(store._join("tmp")):
        out["temp_files"] += 1
        out["temp_bytes"] += size(store._join("tmp", n))
    out["bytes"] = out["manifest_bytes"] + out["blob_bytes"] + out["temp_bytes"]
    return out


def _summary(m: Any) -> dict[str, Any]:
    return {"id": m.id, "stream": m.stream, "created": m.created, "bytes_total": m.bytes_total}


def load_key(key_path: str | None, store: Any = None) -> bytes | None:
    """The checkpoint key, never a new one: without the key nothing in the store can be told
    from a forgery, so gc refuses rather than delete on unsigned data. None when there is no key
    and ``store`` holds no manifest at all (nothing to authenticate: only stray blobs go)."""
    from ..checkpoint import default_key_path, load_or_create_key

    path = os.path.expanduser(key_path or default_key_path())
    if not os.path.exists(path):
        if store is not None and not store._manifest_files():
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
    """The whole clean-up (store I/O runs in a thread; the backend call is async)."""
    from ..checkpoint import store as store_mod

    now = time.time() if now is None else now
    # before anything is deleted, the backend's part included
    key = key or load_key(key_path, store_mod.open_store(store_url))
    protected = protected_ids(state_dir) | set(protected or ())
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
        store = store_mod.open_store(store_url, key=key)
        found = store.scan(key=key) if key is not None else store_mod.Scan()
        pins = store.pinned()
        delete, kept = plan(found.verified, keep=keep, older_than=older_than, now=now,
                            protected=protected | pins)
        # 2. manifests: each at the place it was verified (never a lookup by an unsigned name)
        if not dry_run:
            for m in delete:
                store._remove(store.manifest_path(m.stream, m.id))
        # 3. blobs (in a dry run: those only the doomed manifests reference, plus strays)
        if dry_run:
            still = {d for m in kept for d in (m.blobs or {})}
            freed = {}
            for m in delete:
                for d, info in (m.blobs or {}).items():
                    if d not in still:
                        freed[d] = int((info or {}).get("size") or 0)
            strays = store_mod.gc(store, dry_run=True, grace_s=grace_s)
            blobs = {"deleted": len(freed) + len(strays["removed"]),
                     "bytes_freed": sum(freed.values()) + strays["bytes_freed"],
                     "temps_removed": strays["temps_removed"]}
        else:
            res = store_mod.gc(store, dry_run=False, grace_s=grace_s)
            blobs = {"deleted": len(res["removed"]), "bytes_freed": res["bytes_freed"],
                     "temps_removed": res["temps_removed"]}
        left = usage(store)
        if dry_run:  # project what would remain
            gone = 0
            for m in delete:
                try:
                    p = store.manifest_path(m.stream, m.id)
                    gone += os.path.getsize(p) if store.local else int(store.fs.size(p))
                except (OSError, FileNotFoundError):
                    pass
            left["manifests"] -= len(delete)
            left["manifest_bytes"] -= gone
            left["blobs"] -= blobs["deleted"]
            left["blob_bytes"] -= blobs["bytes_freed"]
            left["temp_files"] -= blobs["temps_removed"]
            left["bytes"] = left["manifest_bytes"] + left["blob_bytes"] + left["temp_bytes"]
        streams = ({m.stream for m in kept} if dry_run or key is None
                   else {m.stream for m in store.scan(key=key).verified})
        return {
            "store": store.url,
            "checkpoints": {"deleted": [_summary(m) for m in delete],
                            "remaining": len(kept)},
            "unverified": [{**u, "action": "unverified, left alone"}
                           for u in found.unverified],
            "pinned": sorted(pins),
            "blobs": blobs,
            "remaining": {**left, "checkpoints": len(kept), "streams": len(streams)},
        }

    result.update(await asyncio.get_running_loop().run_in_executor(None, store_part))
    return result


async def run_gc_for_app(app: Any, *, keep: int | None, older_than: float | None,
                         dry_run: bool) -> dict[str, Any]:
    """gc inside the server (``POST jupyter-pause/api/gc``): the app's store, state and backend.

    The caller refuses while a flight runs; the pause in effect is protected through state.json
    and, belt and braces, through the Lifecycle's in-memory state.
    """
    lc = getattr(app, "lifecycle", None)
    extra: set[str] = set()
    if lc is not None:
        for part in ("pause", "inflight"):
            p = lc.state.get(part) or {}
            extra.update(i for i in p.get("checkpoints") or [] if i)
    return await run_gc(store_url=app.store_url or None, state_dir=app.state_dir,
                        keep=app.keep_checkpoints if keep is None else keep,
                        older_than=older_than, dry_run=dry_run,
                        backend=getattr(app, "backend_instance", None), protected=extra,
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
