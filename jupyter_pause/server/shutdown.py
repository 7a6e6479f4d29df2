"""Checkpoint on shutdown, and restore after it.

When the server is asked to stop (SIGTERM, SIGINT, ``POST /api/shutdown``, ``jupyter server
stop``), jupyter_server calls the extensions' ``stop_extension`` before it shuts the kernels
down. :func:`checkpoint_on_shutdown` uses that window: every kernel is checkpointed (the pause's
engine and store) within ``PauseApp.shutdown_checkpoint_budget``, and the outcome is journaled
as a flight of kind ``stop``:

    shutdown_requested -> stop_checkpoint_written (per saved kernel) -> stopped

A checkpoint still running when the budget ends is abandoned: its kernel is shut down at once, so
the write can never publish after the journal said "not saved" (the store publishes a manifest
last, by an atomic rename, so the notebook's previous checkpoint stays valid). A server killed
during this step leaves ``stopping`` in the journal; the next start settles it
(:meth:`Lifecycle.load`).

On the next start, a notebook whose kernel was saved is restored when a kernel is started for
its session (the session manager's hook in :mod:`.kernelguard`), inside the session request:
``POST /api/sessions`` answers once the variables are back, so the notebook cannot run a cell
before.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import time
from typing import TYPE_CHECKING, Any

from ..cluster.base import KernelRecord
from ..journal import utcnow_iso
from . import bridge, metrics
from .bridgeresults import RestoreResult
from .pause import checkpoint_kwargs
from .pausereport import trigger_text
from .previous import add_previous, offer_previous
from .recorder import Flight
from .resume import restore_kwargs
from .state import not_restored_kernels

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

# How long the shutdown may spend asking the backend whether the pod was just snapshotted.
HOLD_CHECK_S = 5.0
# How long the not-saved kernels' previous checkpoints may be looked up after the budget (it is
# only to name them in the journal; the server must still exit in time).
PREVIOUS_LOOKUP_S = 3.0


async def checkpoint_on_shutdown(lc: Lifecycle, trigger: str, budget: float,
                                 hub: bool = False) -> dict[str, Any] | None:
    """Checkpoint every kernel before the server shuts them down; the ``stopped`` entry, or None
    when nothing was journaled (the workspace is paused, or a flight outlived the budget)."""
    lc.stopping = True  # refuses new pauses, resumes and restores from now on
    t0 = time.monotonic()
    deadline = t0 + max(0.0, budget)
    app, serverapp = lc.app, lc.serverapp

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    running = lc.flight
    if running is not None and running.task is not None:
        # One flight at a time: a pause or resume under way finishes first, if it can in time.
        try:
            await asyncio.wait_for(asyncio.shield(running.task), left())
        except asyncio.TimeoutError:
            lc.log.warning("jupyter_pause: a %s was still running when the server stopped; no "
                           "shutdown checkpoint (the next start settles it)", running.kind)
            return None
        except Exception as e:  # noqa: BLE001 - the flight journaled its own failure
            lc.log.debug("jupyter_pause: the %s before the stop failed: %s", running.kind, e)
    pause = lc.state.get("pause") or {}
    if pause and not pause.get("offered") and lc.state["state"] == "paused":
        # Paused: its checkpoint is the way back, and no kernel holds newer work. Any other
        # state with a paused record (a resume that failed for some notebooks) has kernels
        # in use: they are saved, all but those whose restore failed (below).
        return None
    empty = not_restored_kernels(lc.state)
    held = await writes_held(lc, min(left(), HOLD_CHECK_S))
    if held:
        # The pod was just snapshotted and is stopped after it: a journal line or a checkpoint
        # written now lands on its volumes after the snapshot, and GKE's restore of a pod whose
        # PVC changed after the snapshot fails (its Pod snapshot troubleshooting page). The
        # restored process is the way back, or on a cold start the last checkpoint.
        lc.log.warning("jupyter_pause: no shutdown checkpoint, nothing written: %s", held)
        return None

    records = await bridge.running_kernels(serverapp)
    flight = lc.new_flight("stop", trigger)
    try:
        await lc.record("shutdown_requested", trigger=trigger, hub=hub, budget_s=budget,
                         kernels=[r.to_dict() for r in records])
        if records:
            lc.set_step("stopping", "Checkpointing the kernels before the server stops",
                         state="stopping")
        abandoned: list[str] = []

        async def one(rec: KernelRecord) -> dict[str, Any]:
            t1 = time.monotonic()
            row: dict[str, Any] = {"path": rec.path, "stream": rec.stream,
                                   "kernel_id": rec.kernel_id, "status": "not_saved",
                                   "reason": None, "checkpoint_id": None}
            try:
                await _save(rec, row)
            finally:
                row["seconds"] = round(time.monotonic() - t1, 3)
            return row

        async def _save(rec: KernelRecord, row: dict[str, Any]) -> None:
            note = empty.get(rec.kernel_id)
            kept = None
            if note is not None:
                # Its restore failed: the kernel holds none of that checkpoint. Untouched, a
                # stop checkpoint of it would only shadow the good one; used since, it holds the
                # person's work, which is saved (the old checkpoint stays in the store).
                if not await bridge.cells_run(serverapp, rec.kernel_id,
                                               min(left(), lc.app.liveness_timeout)):
                    row["reason"] = (f"its restore in the last resume failed "
                                     f"({note.get('reason')}); its checkpoint "
                                     f"{note.get('checkpoint_id')} is kept instead")
                    return
                kept = note.get("checkpoint_id")
            # Never checkpoint mid-cell: a cell that ends within the budget is saved.
            if bridge.execution_state(serverapp, rec.kernel_id) == "busy" and \
                    not await bridge.wait_idle(serverapp, rec.kernel_id, left()):
                dead = bridge.execution_state(serverapp, rec.kernel_id) == "dead"
                row["reason"] = ("the kernel died while running a cell" if dead else
                                 f"busy: still running a cell when the shutdown budget of "
                                 f"{budget:g} s ran out")
                return
            if left() <= 0:
                row["reason"] = f"the shutdown budget of {budget:g} s ran out before its turn"
                return
            kwargs = checkpoint_kwargs(lc, rec, flight, f"shutdown:{trigger}",
                                       secrets.token_urlsafe(24))
            try:
                res = await asyncio.wait_for(bridge.checkpoint(
                    serverapp, rec.kernel_id, timeout=left() + 5.0, **kwargs), left())
            except asyncio.TimeoutError:
                abandoned.append(rec.kernel_id)
                row["reason"] = (f"the shutdown budget of {budget:g} s ran out during its "
                                 "checkpoint; the checkpoint was abandoned")
                return
            except bridge.KernelDied as e:
                row["reason"] = f"the kernel died during the checkpoint ({e.why})"
                return
            except Exception as e:  # noqa: BLE001 - reported per kernel
                row["reason"] = f"checkpoint failed: {e}"
                return
            if res.failure is not None:
                row["reason"] = f"checkpoint failed: {res.failure.error}"
                return
            rec.checkpoint_id = res.checkpoint_id
            rec.bytes_written = res.bytes_written
            rec.bytes_total = res.bytes_total
            rec.variables = list(res.variables)
            rec.token = None  # the kernel goes away: there is no live process to find again
            row.update(status="saved", checkpoint_id=rec.checkpoint_id,
                       bytes_written=rec.bytes_written, bytes_total=rec.bytes_total)
            if kept:
                row["reason"] = (f"the work done since its restore failed; the checkpoint "
                                 f"{kept} it could not restore is still in the store")
            # Per kernel, at once: a server killed before the end still knows what was saved.
            await lc.record("stop_checkpoint_written", path=rec.path,
                             checkpoint_id=rec.checkpoint_id, kernels=[rec.to_dict()])

        rows = list(await asyncio.gather(*(one(r) for r in records)))
        km = serverapp.kernel_manager
        for kid in abandoned:
            # The in-kernel write must not publish after the journal said "not saved".
            try:
                await km.shutdown_kernel(kid, now=True)
            except Exception as e:  # noqa: BLE001 - the server's own clean-up tries again
                lc.log.warning("jupyter_pause: could not stop kernel %s: %s", kid[:8], e)
        offer = await _name_previous(lc, records, rows)
        saved = [r.to_dict() for r in records
                 if any(row["kernel_id"] == r.kernel_id and row["status"] == "saved"
                        for row in rows)]
        # The not-saved notebooks' previous checkpoints are offered to POST resume (state.apply).
        extra: dict[str, Any] = {"resume_from": offer} if offer else {}
        entry = await lc.record(
            "stopped", trigger=trigger, hub=hub, budget_s=budget, rows=rows, kernels=saved,
            **extra,
            restore=bool(app.restore_after_stop),
            durations={"total_s": round(time.monotonic() - t0, 3)},
            bytes_written=sum(int(r.get("bytes_written") or 0) for r in rows),
        )
        for row in rows:
            lc.log.info("jupyter_pause: shutdown checkpoint of %s: %s%s",
                        row["path"] or row["kernel_id"][:8], row["status"],
                        f" ({row['reason']})" if row["reason"] else "")
        return entry
    finally:
        lc.step = None
        if lc.flight is flight:
            lc.flight = None


async def writes_held(lc: Lifecycle, timeout: float) -> str | None:
    """The backend's reason why nothing may be written now (Backend.writes_held), or None. When
    it cannot tell in time, the checkpoint goes ahead: losing the kernels is the worse outcome."""
    try:
        return await asyncio.wait_for(lc.backend.writes_held(), max(timeout, 0.1))
    except Exception as e:  # noqa: BLE001 - a timeout or an API error: checkpoint as usual
        lc.log.warning("jupyter_pause: could not tell whether the pod was just snapshotted "
                       "(%s); checkpointing as usual", f"{type(e).__name__}: {e}".rstrip(": "))
        return None


async def _name_previous(lc: Lifecycle, records: list[KernelRecord],
                         rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Add to each not-saved row which earlier checkpoint of that notebook is still there; the
    offer of those checkpoints (:func:`.previous.offer_previous`), or None."""
    lost = [copy.copy(r) for r in records
            if any(row["kernel_id"] == r.kernel_id and row["status"] != "saved" for row in rows)]
    if not lost:
        return None
    fid = lc.flight.id if lc.flight is not None else None
    try:
        offer = await asyncio.wait_for(asyncio.to_thread(offer_previous, lc.app, lost, fid),
                                       PREVIOUS_LOOKUP_S)
    except Exception as e:  # noqa: BLE001 - the rows say it; nothing is offered then
        lc.log.warning("jupyter_pause: earlier checkpoints not looked up: %s", e)
        return None
    add_previous(rows, offer)
    return offer


# ---------------------------------------------------------------------- restore after a stop


def pending_record(lc: Lifecycle, path: str) -> dict[str, Any] | None:
    stopped = lc.state.get("stopped") or {}
    if path not in (stopped.get("pending") or []):
        return None
    return next((k for k in stopped.get("kernels") or [] if k.get("path") == path), None)


async def restore_after_stop(lc: Lifecycle, path: str, kernel_id: str) -> None:
    """Restore the checkpoint the last stop saved for ``path`` into ``kernel_id`` (once)."""
    app = lc.app
    if not app.restore_after_stop or lc.stopping or lc.app.config_error:
        return
    # A resume starting kernels restores its own checkpoint; never a second one over it.
    if lc.flight is not None or path in lc.restoring_after_stop:
        return
    data = pending_record(lc, path)
    if data is None:
        return
    stopped = lc.state.get("stopped") or {}
    rec = KernelRecord.from_dict(data)
    flight = Flight(id=str(stopped.get("flight_id")), kind="stop",
                    trigger=str(stopped.get("trigger")), started=str(stopped.get("at")))
    lc.restoring_after_stop.add(path)
    how = trigger_text(stopped.get("trigger"), bool(stopped.get("hub")))
    why = f"restored after the server was stopped ({how})"
    requested = utcnow_iso()
    t0 = time.monotonic()
    out: dict[str, Any] = {"outcome": "failed", "reason": None, "variables": [], "warnings": []}
    before = lc.state["state"]
    try:
        message = f"Restoring {path} (the server was stopped)"
        lc.set_step("restoring", message, state="restoring")

        def progress(d: int, t: int, *_: Any) -> None:
            lc.set_step("restoring", message, int(d), int(t))

        try:
            res = await bridge.restore(lc.serverapp, kernel_id, progress=progress,
                                       timeout=app.bridge_timeout, **restore_kwargs(lc, rec))
        except bridge.KernelDied as e:
            res = RestoreResult.failed(f"the kernel died during the restore ({e.why})")
        except Exception as e:  # noqa: BLE001 - journaled below
            res = RestoreResult.failed(str(e), type(e).__name__)
        if res.failure is None:
            out.update(outcome="restored", reason=why, variables=list(res.variables),
                       warnings=list(res.warnings))
        else:
            out["reason"] = f"restore after the server was stopped failed: {res.failure.error}"
        metrics.RESTORES_AFTER_STOP.labels(app.backend_name, out["outcome"]).inc()
        lc.step = None
        await lc.record(
            "restored_after_stop", flight=flight, path=path, kernel_id=kernel_id,
            previous_kernel_id=rec.kernel_id, outcome=out["outcome"], reason=out["reason"],
            checkpoint_id=rec.checkpoint_id, requested=requested, variables=out["variables"],
            warnings=out["warnings"], durations={"restore_s": round(time.monotonic() - t0, 3)})
        if out["outcome"] == "restored":
            lc.watch_first_cell(flight, kernel_id, rec.path)
    finally:
        lc.step = None
        if lc.state["state"] == "restoring":  # "restoring" is only in memory until journaled
            lc.state["state"] = before
        lc.restoring_after_stop.discard(path)
