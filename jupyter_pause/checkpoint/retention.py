"""Which checkpoints go: one policy for the write path (:func:`retain`, after each checkpoint)
and for ``jupyter pause gc`` (:func:`prune`).

Per notebook (stream), newest first by the signed id (never an unsigned field), a checkpoint
goes when every rule given says so:

- ``keep``: it is beyond the newest ``keep``. ``keep=0`` means no count limit;
- ``older_than`` (seconds, optional): it was created longer ago than that.

With no rule at all (``keep=0`` and no ``older_than``) nothing goes: ``keep=0`` keeps every
checkpoint unless an age rule says otherwise.

Autosaves (signed ``meta.kind == "autosave"``) are ranked apart from the other checkpoints of
their notebook, so a stream of autosaves never pushes a pause or shutdown checkpoint out;
:func:`retain_autosaves` keeps the newest few of them, bounded in bytes. Protected ids (the checkpoints a pause needs to come
back, pinned ones) never go. Only manifests that verify under the key and sit in their own place
are counted or deleted; any other file is reported as left alone.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .collect import collect, gc
from .errors import CheckpointError
from .manifest import Manifest
from .store import Scan, Store

log = logging.getLogger(__name__)


def plan(
    manifests: Iterable[Manifest],
    *,
    keep: int,
    older_than: float | None = None,
    now: float | None = None,
    protected: Iterable[str] = (),
) -> tuple[list[Manifest], list[Manifest]]:
    """(delete, kept): the manifests the policy removes and those it keeps, newest first per
    notebook. Raises ValueError for a negative ``keep``."""
    if keep < 0:
        raise ValueError("keep must be 0 or more (0: no count limit)")
    now = time.time() if now is None else now
    protected = set(protected)
    by_stream: dict[tuple[str, bool], list[Manifest]] = defaultdict(list)
    for m in manifests:
        by_stream[(m.stream, is_autosave(m))].append(m)
    delete: list[Manifest] = []
    kept: list[Manifest] = []
    for ms in by_stream.values():
        # the signed id, bound to the file name: a forged ``created`` cannot push real ones out
        ms.sort(key=lambda m: m.id, reverse=True)
        for rank, m in enumerate(ms):
            doomed = _doomed(m, rank, keep, older_than, now)
            (delete if doomed and m.id not in protected else kept).append(m)
    return delete, kept


def _doomed(m: Manifest, rank: int, keep: int, older_than: float | None, now: float) -> bool:
    if keep == 0 and older_than is None:
        return False  # no rule: keep everything
    if keep and rank < keep:
        return False
    if older_than is None:
        return True
    created = m.created_at()
    return created is not None and now - created > older_than


AUTOSAVE = "autosave"


def is_autosave(m: Manifest) -> bool:
    """Whether ``m`` is an autosave (the signed meta says so; anything else is not)."""
    return isinstance(m.meta, dict) and m.meta.get("kind") == AUTOSAVE


def plan_autosaves(manifests: Iterable[Manifest], *, keep: int, max_bytes: int | None = None,
                   protected: Iterable[str] = ()) -> tuple[list[Manifest], list[Manifest]]:
    """(delete, kept) among one notebook's autosaves: the newest ``keep`` (at least one),
    fewer when together they hold more than ``max_bytes`` (each counted whole: blobs shared
    between them make that an upper bound). The newest is always kept."""
    protected = set(protected)
    ms = sorted((m for m in manifests if is_autosave(m)), key=lambda m: m.id, reverse=True)
    delete: list[Manifest] = []
    kept: list[Manifest] = []
    total = 0
    for rank, m in enumerate(ms):
        total += max(0, int(m.bytes_total or 0))
        over = rank >= max(1, keep) or (max_bytes is not None and rank > 0 and total > max_bytes)
        (delete if over and m.id not in protected else kept).append(m)
    return delete, kept


def retain_autosaves(store: Store, stream: str, *, keep: int, max_bytes: int | None = None,
                     key: bytes | None = None, protect: Iterable[str] = ()) -> list[str]:
    """Delete the autosaves of ``stream`` beyond :func:`plan_autosaves`; other kinds are never
    touched. Returns the deleted ids."""
    key = key or store.key
    if not key:
        raise CheckpointError("retention needs the checkpoint key (it deletes checkpoints)")
    found = store.scan(stream, key=key)
    delete, _ = plan_autosaves(found.verified, keep=keep, max_bytes=max_bytes,
                               protected=set(protect) | store.pinned())
    return _delete(store, delete)


def newest_paused(manifests: Iterable[Manifest]) -> Manifest | None:
    """The newest checkpoint a server pause wrote (signed ``meta.flight``), given newest first."""
    return next((m for m in manifests if isinstance(m.meta, dict) and m.meta.get("flight")), None)


def retain(
    store: Store,
    stream: str,
    keep: int,
    *,
    key: bytes | None = None,
    protect: Iterable[str] = (),
    skipped: list[dict[str, str]] | None = None,
) -> list[str]:
    """Delete all but the newest ``keep`` authentic manifests of ``stream`` (``keep=0``: no count limit, none deleted)
    and the blobs only they used; returns the deleted ids.

    Only manifests that verify under ``key`` and sit in their own place are counted or deleted;
    anything else is left alone and listed in ``skipped``. Never deleted: ids in ``protect``,
    pinned ids (:meth:`Store.pin`), and the newest checkpoint a server pause wrote: a pause
    depends on it even when another session of the notebook keeps checkpointing, and this runs
    in the kernel, which may not know the server's state.
    """
    key = key or store.key
    if not key:
        raise CheckpointError("retention needs the checkpoint key (it deletes checkpoints)")
    found = store.scan(stream, key=key)
    if skipped is not None:
        skipped.extend(found.unverified)
    for u in found.unverified:
        log.info("retention left %s alone: %s", u["path"], u["reason"])
    keep_ids = set(protect) | store.pinned()
    paused = newest_paused(found.verified)
    if paused is not None:
        keep_ids.add(paused.id)
    delete, _ = plan(found.verified, keep=keep, protected=keep_ids)
    return _delete(store, delete)


def _delete(store: Store, delete: list[Manifest]) -> list[str]:
    """Remove the manifests, then the blobs only they used; their ids."""
    candidates: set[str] = set()
    for m in delete:
        store.remove_manifest(m)
        candidates.update(m.blobs)
    if candidates:
        collect(store, candidates)
    return [m.id for m in delete]


@dataclass
class Pruned:
    """What :func:`prune` deleted (or, in a dry run, would delete) and what remains."""

    deleted: list[Manifest] = field(default_factory=list)
    kept: list[Manifest] = field(default_factory=list)
    unverified: list[dict[str, str]] = field(default_factory=list)  # {"path", "reason"}
    pinned: set[str] = field(default_factory=set)
    blobs: dict[str, int] = field(default_factory=dict)  # deleted, bytes_freed, temps_removed
    # the store's usage afterwards (projected in a dry run), plus checkpoints and streams
    remaining: dict[str, int] = field(default_factory=dict)


def prune(
    store: Store,
    *,
    key: bytes | None,
    keep: int,
    older_than: float | None = None,
    now: float | None = None,
    protected: Iterable[str] = (),
    dry_run: bool = False,
    grace_s: float = 0.0,
) -> Pruned:
    """The whole store under the policy: manifests first (each at the place it was verified,
    never looked up by an unsigned name), then every blob no remaining manifest references and
    the temp files of dead writes. Without a key (allowed only for a store with no manifest)
    only strays go."""
    found = store.scan(key=key) if key is not None else Scan()
    pins = store.pinned()
    delete, kept = plan(found.verified, keep=keep, older_than=older_than, now=now,
                        protected=set(protected) | pins)
    if dry_run:
        blobs = _dry_blobs(store, delete, kept, grace_s)
    else:
        for m in delete:
            store.remove_manifest(m)
        res = gc(store, dry_run=False, grace_s=grace_s)
        blobs = {"deleted": len(res["removed"]), "bytes_freed": res["bytes_freed"],
                 "temps_removed": res["temps_removed"]}
    left = store.usage()
    if dry_run:  # project what would remain
        gone = sum(store.size(store.manifest_path(m.stream, m.id)) for m in delete)
        left["manifests"] -= len(delete)
        left["manifest_bytes"] -= gone
        left["blobs"] -= blobs["deleted"]
        left["blob_bytes"] -= blobs["bytes_freed"]
        left["temp_files"] -= blobs["temps_removed"]
        left["bytes"] = left["manifest_bytes"] + left["blob_bytes"] + left["temp_bytes"]
    streams = ({m.stream for m in kept} if dry_run or key is None
               else {m.stream for m in store.scan(key=key).verified})
    return Pruned(deleted=delete, kept=kept, unverified=found.unverified, pinned=pins,
                  blobs=blobs, remaining={**left, "checkpoints": len(kept),
                                          "streams": len(streams)})


def _dry_blobs(store: Store, delete: list[Manifest], kept: list[Manifest],
               grace_s: float) -> dict[str, Any]:
    """The blobs a real run would remove: those only the doomed manifests reference, plus
    strays."""
    still = {d for m in kept for d in (m.blobs or {})}
    freed: dict[str, int] = {}
    for m in delete:
        for d, info in (m.blobs or {}).items():
            if d not in still:
                freed[d] = int((info or {}).get("size") or 0)
    strays = gc(store, dry_run=True, grace_s=grace_s)
    return {"deleted": len(freed) + len(strays["removed"]),
            "bytes_freed": sum(freed.values()) + strays["bytes_freed"],
            "temps_removed": strays["temps_removed"]}
