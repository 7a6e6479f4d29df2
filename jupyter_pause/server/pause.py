"""A pause in flight: wait for idle kernels, checkpoint them, snapshot the workspace, release
the accelerator; each step journaled through the :class:`~.lifecycle.Lifecycle`."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import secrets
import time
from typing import TYPE_CHECKING, Any

from ..cluster.base import KernelRecord, PauseContext
from ..cluster.results import ReleaseResult, SnapshotResult, checked_result
from . import bridge, checkpointable, metrics
from .previous import age_text, offer_previous
from .recorder import PAUSE_FAILED_SAFE, Flight, StepError
from .state import not_restored_kernels

if TYPE_CHECKING:
    from .lifecycle import Lifecycle


async def run_pause(lc: Lifecycle, flight: Flight, interrupt: bool, mode: str = "pause", *,
                    lose_state: checkpointable.LoseState = ()) -> None:
    """The whole pause; its failure is journaled, never raised. ``lose_state``: the kernels
    that cannot be checkpointed and may be shut down without a checkpoint (see
    :mod:`.checkpointable`)."""
    app = lc.app
    t0 = time.monotonic()
    step = "checkpointing"
    held = False  # the cluster stops this pod after its snapshot: write nothing more
    stop = mode == "stop"
    try:
        # The kernels go into the journal first: a server that dies mid-checkpoint then knows
        # which notebooks' previous checkpoints to offer (and a stop, which kernels it stops).
        records = await bridge.running_kernels(lc.serverapp)
        # A pause from a failed resume: the paused record it replaces is still the way back
        # for the notebooks that resume did not bring back (see _carry_over).
        before = lc.state.get("pause") or {}
        before = copy.deepcopy(before) if not before.get("offered") else {}
        # ... but only while untouched: a kernel the person used since holds their work
        empty = {kid: note for kid, note in not_restored_kernels(lc.state).items()
                 if not await bridge.cells_run(lc.serverapp, kid, lc.app.liveness_timeout)}
        await lc.record("pause_requested", trigger=flight.trigger, mode=mode,
                        kernels=[r.to_dict() for r in records])
        await _wait_idle(lc, records, interrupt)  # a stop never kills a running cell either
        ctx = PauseContext(
            flight_id=flight.id, trigger=flight.trigger, serverapp=lc.serverapp,
            kernels=records, accelerator=dict(app.accelerator),
            _report=lc.backend_report, _progress=lc.backend_progress, mode=mode,
        )
        snap = SnapshotResult(skipped=True)
        if not stop:
            lost = await _uncheckpointable(lc, records, lose_state)
            await _checkpoint_all(lc, [r for r in records if r.kernel_id not in empty
                                       and not r.state_not_saved], flight)
            _carry_over(records, before, empty)
            total = sum(r.bytes_total for r in records)
            written = sum(r.bytes_written for r in records)
            ctx.checkpoints = [r.checkpoint_id for r in records]
            await lc.record(
                "checkpoint_written", bytes_written=written, bytes_total=total,
                checkpoints=ctx.checkpoints, kernels=[r.to_dict() for r in records],
                # the kernels the request let lose their state (each "state not saved: why")
                state_not_saved=[{"path": r.path, "kernel_id": r.kernel_id,
                                  "kernel": r.kernel_name, "why": r.state_not_saved}
                                 for r in lost],
            )
            await _shut_down_lost(lc, lost)
            metrics.CHECKPOINT_BYTES.labels(app.backend_name).inc(written)
            metrics.CHECKPOINT_SIZE.labels(app.backend_name).set(total)

            step = "snapshotting"
            lc.set_step("snapshotting", "Snapshotting the workspace")
            snap = checked_result(await lc.backend.snapshot(ctx), SnapshotResult, "snapshot")
            ctx.snapshot = snap
            # The cluster stops this pod right after its snapshot (GKE postCheckpoint: stop,
            # the rule for pods with a PVC): a write to the pod's volumes now would make the
            # restore fail. The journal stays at "snapshotting" (checkpoint_written), which
            # settles both ways: a restored copy of this process journals on from here, and
            # a cold start's next server start counts the pause as done and restores the
            # checkpoint (recovery.load).
            held = snap.hold_writes and not snap.woke_up
            await lc.record("snapshot_ready", persist=not held, snapshot=snap.snapshot,
                            backend=app.backend_name, skipped=snap.skipped)

        step = "releasing"
        gpu = int((app.accelerator or {}).get("count") or 0) > 0  # name one only if there is one
        lc.set_step("releasing", "Releasing the accelerator" if gpu and not stop
                    else "Stopping the kernels")
        rel = checked_result(await lc.backend.release(ctx), ReleaseResult, "release")
        await lc.record("accelerator_released", persist=not held,
                        accelerator=dict(app.accelerator), released=rel.released,
                        stopped_kernels=list(rel.stopped_kernels))
        lc.step = None
        await lc.record("paused", persist=not held)
        metrics.PAUSE_DURATION.labels(app.backend_name).observe(time.monotonic() - t0)
        woke_up = snap.woke_up or rel.woke_up
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure is journaled
        woke_up = False
        # A failed release after a checkpoint still leaves a way back (paused); a stop
        # has no checkpoint, so its failed release is a failure. After a snapshot whose pod
        # the cluster stops, the failure is not written either (see above).
        after = ("paused" if step == "releasing" and not stop else
                 # nothing was changed and the kernels run on: back to work
                 "running" if getattr(e, "reason", None) in ("kernel_stalled", "uncheckpointable")
                 else "failed")
        await lc.record_failure(flight, step, e, state_after=after, persist=not held)
    finally:
        lc.step = None
        if lc.flight is flight:
            lc.flight = None
    if woke_up:
        # A pod snapshot restore resumed this very process inside the pause: go on with a
        # resume at once, which verifies the kernels (live) and reports it.
        await lc.request_resume("startup")


async def _uncheckpointable(lc: Lifecycle, records: list[KernelRecord],
                            lose_state: checkpointable.LoseState) -> list[KernelRecord]:
    """The kernels that cannot be checkpointed, asked once they are idle: each one the request
    allowed is marked ``state_not_saved``; any other refuses the pause, nothing changed."""
    # asked afresh: a state is lost only on what the kernel says now, never on an old answer
    found = await checkpointable.find(lc.serverapp, records, lc.app.liveness_timeout,
                                      fresh=True)
    refused = [u for u in found if not checkpointable.allowed(u, lose_state)]
    if refused:
        raise StepError(
            checkpointable.refusal_message(refused), reason="uncheckpointable",
            hint="Your kernels are untouched. Pause anyway to lose the state of "
            f"{'that kernel' if len(refused) == 1 else 'those kernels'}, or save it "
            "yourself first (or install what the reason names) and pause again.")
    by_id = {u.kernel_id: u for u in found}
    lost = [r for r in records if r.kernel_id in by_id]
    for rec in lost:
        rec.state_not_saved = by_id[rec.kernel_id].why
    return lost


async def _shut_down_lost(lc: Lifecycle, lost: list[KernelRecord]) -> None:
    """Shut down, without a checkpoint, the kernels a pause was allowed to lose: after the
    other checkpoints succeeded (a failed pause leaves them running), before the snapshot (a
    pod snapshot would otherwise bring back a process the report calls lost)."""
    km = lc.serverapp.kernel_manager
    for rec in lost:
        if rec.kernel_id in km:
            lc.set_step("checkpointing", f"Stopping {rec.label} (state not saved)")
            await km.shutdown_kernel(rec.kernel_id)


def _carry_over(records: list[KernelRecord], before: dict[str, Any],
                empty: dict[str, dict[str, Any]]) -> None:
    """The paused checkpoints a pause from a failed resume keeps: a kernel whose restore
    failed holds none of its notebook's checkpoint, so it is not checkpointed (that would
    replace the good checkpoint with an empty one) but recorded with that checkpoint; a
    notebook of that resume with no kernel running now is kept as it was recorded."""
    old = {k.get("stream"): k for k in before.get("kernels") or []}
    for rec in records:
        if rec.kernel_id in empty and rec.stream in old:
            prev = KernelRecord.from_dict(old[rec.stream])
            rec.checkpoint_id, rec.variables = prev.checkpoint_id, list(prev.variables)
            rec.bytes_total, rec.bytes_written, rec.token = prev.bytes_total, 0, None
    running = {r.stream for r in records}
    for stream, k in old.items():
        if stream not in running:
            rec = KernelRecord.from_dict(k)
            rec.token, rec.bytes_written = None, 0  # its process is gone
            records.append(rec)


async def _wait_idle(lc: Lifecycle, records: list[KernelRecord], interrupt: bool) -> None:
    """Never checkpoint mid-cell: wait for idle, interrupt if asked, else refuse."""
    timeout = lc.app.busy_timeout
    serverapp = lc.serverapp
    for rec in records:
        if bridge.execution_state(serverapp, rec.kernel_id) != "busy":
            continue
        lc.set_step("checkpointing", f"Waiting for {rec.label} to finish its cell")
        if await bridge.wait_idle(serverapp, rec.kernel_id, timeout):
            continue
        if interrupt:
            lc.set_step("checkpointing", f"Interrupting {rec.label}")
            await bridge.interrupt(serverapp, rec.kernel_id)
            if await bridge.wait_idle(serverapp, rec.kernel_id, 15):
                continue
        raise StepError(
            f"{rec.label} is still running a cell after {timeout:g} s; pause refused, "
            "nothing was changed",
            reason="kernel_busy",
            hint="Wait for the cell to finish or interrupt the kernel, then pause again.",
        )


def checkpoint_kwargs(lc: Lifecycle, rec: KernelRecord, flight: Flight, trigger: str,
                      token: str) -> dict[str, Any]:
    """The bridge's ``checkpoint`` arguments for one kernel (a pause's or a server stop's)."""
    app = lc.app
    kwargs: dict[str, Any] = {}
    if app.variable_timeout > 0:
        kwargs["variable_timeout"] = app.variable_timeout
    return dict(store_url=app.store_url or None, key_path=app.key_path or None,
                stream=rec.stream, token=token,
                meta={"trigger": trigger, "flight": flight.id, "kernel_id": rec.kernel_id,
                      "path": rec.path},
                keep=app.keep_checkpoints or None, **kwargs)


async def _checkpoint_all(lc: Lifecycle, records: list[KernelRecord], flight: Flight) -> None:
    label = ", ".join(r.label for r in records) or "no kernels"
    lc.set_step("checkpointing", f"Checkpointing {label}", state="checkpointing")
    progress_for = lc.kernels_progress("checkpointing", "Checkpointing")

    async def one(rec: KernelRecord) -> None:
        token = secrets.token_urlsafe(24)
        try:
            res = await bridge.checkpoint(
                lc.serverapp, rec.kernel_id, progress=progress_for(rec),
                timeout=lc.app.bridge_timeout, silence=lc.app.kernel_silence_timeout,
                **checkpoint_kwargs(lc, rec, flight, flight.trigger, token))
        except bridge.KernelDied as e:
            raise await _kernel_died(lc, rec, flight, e.why) from e
        except bridge.KernelStalled as e:
            # Interrupt it: a stopped process gets the signal when it runs again, so its
            # checkpoint ends there instead of publishing after we said it failed; the
            # kernel and its memory are left as they are (the last checkpoint too).
            with contextlib.suppress(Exception):
                await bridge.interrupt(lc.serverapp, rec.kernel_id)
            raise StepError(
                f"checkpoint of {rec.label} failed: {e}; pause refused, nothing was stopped",
                reason="kernel_stalled",
                hint=f"{PAUSE_FAILED_SAFE} Look at {rec.label}'s kernel (a process stopped "
                "with kill -STOP, a frozen or swapping machine), then pause again.") from e
        except Exception as e:
            raise StepError(f"checkpoint of {rec.label} failed: {e}",
                            reason="checkpoint_error") from e
        if res.failure is not None:
            err = res.failure.error
            if res.failure.kind == "kernel_side":  # the error names the command to run
                raise StepError(f"checkpoint of {rec.label} failed: {err}", reason="kernel_side",
                                hint=f"{PAUSE_FAILED_SAFE} Run that command for {rec.label}'s "
                                "kernel, restart the kernel, then pause again.")
            # by the exception's type the kernel sent (StorageFullError: storage_full)
            raise StepError(f"checkpoint of {rec.label} failed: {err}",
                            reason=res.failure.reason("checkpoint_error"),
                            hint="Fix the cause and pause again.")
        rec.token = res.token or token
        rec.pid = res.pid
        rec.checkpoint_id = res.checkpoint_id
        rec.bytes_written = res.bytes_written
        rec.bytes_total = res.bytes_total
        rec.variables = list(res.variables)

    tasks = [asyncio.ensure_future(one(r)) for r in records]
    try:
        # The first kernel that fails (one that died, above all) ends the step at once.
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()  # no-op for finished ones; stops the others' progress updates
        await asyncio.gather(*tasks, return_exceptions=True)
    lc.progress(force=True)


async def _kernel_died(lc: Lifecycle, rec: KernelRecord, flight: Flight, why: str) -> StepError:
    """The truth about a kernel that died mid-checkpoint, and the way back it leaves."""
    offer = await asyncio.to_thread(offer_previous, lc.app, [copy.copy(rec)], flight.id)
    if offer:
        last = offer["previous"][0]
        prev = (f"its last checkpoint is {last['checkpoint_id']} "
                f"({age_text(last.get('created'))})")
        hint = ("Its memory is gone. Resume to restore that checkpoint into it, or pause "
                "again to checkpoint the kernels as they are now.")
    else:
        prev = "it has no earlier checkpoint"
        hint = "Its memory is gone and no earlier checkpoint of it exists; pause again."
    return StepError(f"the kernel of {rec.label} died during the checkpoint ({why}); {prev}",
                     reason="kernel_died", hint=hint, resume_from=offer)
