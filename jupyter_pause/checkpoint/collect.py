"""Garbage collection of a store: blobs no manifest references and temp files of dead writes.

A blob is removed only when no manifest file names it (authentic or not: a reference only ever
keeps a blob) and it is older than every running write's lease, so a concurrent checkpoint never
loses a blob it has written but not yet published. A write that reuses an existing blob (a
claim) refreshes its time; locally the removal renames the blob aside and reads that time again
before it deletes, so a claim that lands between the check and the removal keeps the blob (and
one that lands after the rename finds it gone and writes it again). Object stores have no time to
refresh, so there a write records its claims in its lease before it publishes and then checks
that each claimed blob still exists; a gc skips the claimed blobs, copies a blob aside before
removing it, reads the claims again after, and puts back a blob claimed meanwhile. Either the
gc sees the claim, or the write sees the blob gone and publishes nothing (it fails, and the
next write uploads the blob again).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterable
from typing import Any

from . import procid
from .errors import CheckpointError
from .manifest import blob_names, parse
from .store import LEASE_SUFFIX, MANIFEST_MAX, Store, valid_digest

log = logging.getLogger(__name__)

LEASE_MAX_AGE = 6 * 3600.0  # a lease older than this belongs to a writer that is gone
LEASE_MAX = 16 << 20  # bytes of a lease read (its claims name every blob a write reuses)
MANIFEST_TEMP_AGE = 600.0  # seconds before a manifest temp file counts as left by a dead writer


def active_leases(store: Store) -> list[tuple[str, float]]:
    """(checkpoint id, start time) of the writes still running; stale leases are removed."""
    return [(i, started) for i, started, _ in _live_leases(store)]


def active_claims(store: Store) -> set[str]:
    """The blobs running writes reference without having written them (object stores record
    them before publishing: :meth:`.Store.record_claims`). Read from the store: only ever used
    to keep a blob, so a bogus claim costs space, never a checkpoint."""
    return {d for _, _, claims in _live_leases(store) for d in claims}


def _live_leases(store: Store) -> list[tuple[str, float, set[str]]]:
    """(checkpoint id, start time, claims) of the writes still running; stale leases are
    removed."""
    host = socket.gethostname()
    now = time.time()
    out = []
    for n, p in store.temp_files():
        if not n.endswith(LEASE_SUFFIX):
            continue
        try:
            info = json.loads(store.read_bytes(p, LEASE_MAX))
            started = float(info["started"])
            pid = int(info["pid"])
            ident = info.get("proc")
            listed = info.get("claims") or []
            claims = {d for d in listed if isinstance(d, str) and valid_digest(d)}
        except Exception:  # noqa: BLE001 - a malformed lease (huge pid, nan, a list...)
            log.debug("ignoring malformed lease %s", n)
            continue
        alive = now - started < LEASE_MAX_AGE
        if alive and info.get("host") == host:
            try:
                alive = procid.writer_alive(pid, ident)
            except Exception as e:  # noqa: BLE001 - undecided is alive: never collect under a writer
                log.debug("cannot tell whether lease %s's writer runs: %s", n, e)
        if alive:
            out.append((n[: -len(LEASE_SUFFIX)], started, claims))
        else:
            store.remove(p)
    return out


def referenced(store: Store) -> set[str]:
    """Digests named by any manifest file, authentic or not: a reference only ever keeps a
    blob, so an unverifiable manifest (another key, a damaged file) errs on the safe side."""
    refs: set[str] = set()
    for p in store.manifest_files():
        try:
            refs.update(blob_names(parse(store.read_bytes(p, MANIFEST_MAX), p)))
        except (OSError, CheckpointError):
            continue
    return refs


def collect(
    store: Store,
    candidates: Iterable[str] | None = None,
    *,
    dry_run: bool = False,
    grace_s: float = 0.0,
) -> dict[str, Any]:
    """Remove blobs no manifest references (only among ``candidates`` when given) and, without
    candidates, the temp files of writes that died.

    Blobs younger than ``grace_s`` or than a running write's lease are kept.
    """
    # the time first: a write whose lease the listing misses began after it, so each blob it
    # writes (or, locally, claims) is newer than the cutoff (Store stamps them exactly)
    cutoff = time.time() - grace_s
    store.refresh()  # object stores: no listing from before this gc began
    leases = _live_leases(store)
    if leases:
        cutoff = min(cutoff, min(s for _, s, _ in leases) - 5.0)
    claims = {d for _, _, c in leases for d in c}
    refs = referenced(store)
    if candidates is None:
        found = store.blob_files()
    else:
        found = [(d, store.blob_path(d)) for d in set(candidates) if valid_digest(d)]
    removed, freed = [], 0
    held: list[tuple[str, str, str]] = []  # object stores: removed, a copy aside until checked
    sizes: dict[str, int] = {}
    try:
        for digest, path in found:
            if digest in refs or digest in claims:
                continue
            if dry_run:
                m = store.mtime(path)  # 0.0: unknown (a store that keeps none), or gone
                if m > cutoff or (m == 0.0 and not store.exists(path)):
                    continue
                size: int | None = store.size(path)
            else:
                # a write that claims the blob meanwhile refreshes its time (locally) or records
                # its claim (object stores): checked again as it is removed (collect_blob) or
                # below
                size = store.collect_blob(digest, cutoff, held)
                if size is None:
                    continue
            removed.append(digest)
            sizes[digest] = size or 0
            freed += size or 0
    except BaseException:
        _put_back(store, held)  # failed or stopped half-way: nothing is lost
        raise
    if held:
        # A write that claimed one of them after the claims above were read has either seen it
        # gone (and publishes nothing) or recorded its claim before this second reading; one
        # that has published since and dropped its lease names it in its manifest: the claims
        # first, then the manifests (a write publishes before it drops its lease).
        try:
            store.refresh()
            keep = active_claims(store)
            keep |= referenced(store)
        except BaseException:
            _put_back(store, held)
            raise
        for digest, path, aside in held:
            if digest in keep:
                store.put_aside_back(path, aside)
                removed.remove(digest)
                freed -= sizes[digest]
            else:
                store.remove(aside)
    temps = 0
    if candidates is None:
        temps = _collect_temps(store, {i for i, _, _ in leases}, cutoff, dry_run)
    return {
        "removed": removed,
        "bytes_freed": freed,
        "temps_removed": temps,
        "referenced": len(refs),
        "dry_run": dry_run,
    }


def _put_back(store: Store, held: list[tuple[str, str, str]]) -> None:
    for _, path, aside in held:
        store.put_aside_back(path, aside)


def _collect_temps(store: Store, active: set[str], cutoff: float, dry_run: bool) -> int:
    temps = 0
    # blobs a gc that died had renamed aside: back in place when nothing took their place (a
    # claim may have kept them), and the next gc judges them as usual
    for path, aside in store.set_aside_files(time.time() - MANIFEST_TEMP_AGE):
        if not dry_run:
            store.put_aside_back(path, aside)
        temps += 1
    # manifest temp files of writers that died between write and rename
    for p in store.manifest_temps():
        if store.mtime(p) < time.time() - MANIFEST_TEMP_AGE:
            if not dry_run:
                store.remove(p)
            temps += 1
    # a write creates its lease before any temp file and removes it after the last, so temps
    # not covered by a live lease belong to a writer that died
    for n, p in store.temp_files():
        if n.endswith(LEASE_SUFFIX) or _owner(n) in active:
            continue
        if not dry_run:
            store.remove(p)
        temps += 1
    if not dry_run:
        try:
            temps += store.abort_stale_uploads(cutoff)
        except Exception as e:  # noqa: BLE001 - a clean-up; the checkpoints are fine
            log.warning("could not list unfinished uploads in %s: %s", store.url, e)
    return temps


def _owner(tmp_name: str) -> str:
    # temp names are "<checkpoint id>-<random>.part"; checkpoint ids contain one '-'
    parts = tmp_name.split("-")
    return "-".join(parts[:2])


def gc(store: Store, *, dry_run: bool = False, grace_s: float = 0.0) -> dict[str, Any]:
    """Remove blobs that no manifest references, and stale temp files of crashed writes."""
    return collect(store, None, dry_run=dry_run, grace_s=grace_s)
