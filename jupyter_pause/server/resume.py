"""A resume in flight: bring the kernels back, verify which came back live, restore the others
from the checkpoint, and report per notebook; each step journaled through the Lifecycle."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import TYPE_CHECKING, Any

from ..cluster.base import KernelRecord, ResumeContext
from ..cluster.results import RestoreVerdict, ResumeResult, checked_result
from ..journal import parse_iso, utcnow_iso
from . import bridge, metrics
from .pausereport import resume_report, stopped_outcome
from .recorder import Flight, StepError

if TYPE_CHECKING:
    from .lifecycle import Lifecycle


async def run_resume(lc: Lifecycle, flight: Flight) -> None:
    """The whole resume; its failure is journaled (with the report so far), never raised."""
    app = lc.app
    t0 = time.monotonic()
    requested = utcnow_iso()
    step = "resuming"
    pause = copy.deepcopy(lc.state.get("pause") or {})
    records = [KernelRecord.from_dict(k) for k in pause.get("kernels", [])]
    ctx = ResumeContext(
        flight_id=flight.id, trigger=flight.trigger, serverapp=lc.serverapp,
        kernels=records, accelerator=dict(pause.get("accelerator") or app.accelerator),
        _report=lc.backend_report, _progress=lc.backend_progress, pause=pause,
    )
    outcomes: dict[str, dict[str, Any]] = {}
    marks: dict[str, float] = {}
    before = set(lc.serverapp.kernel_manager.list_kernel_ids())
    try:
        entry = await lc.record("resume_requested", trigger=flight.trigger)
        requested = entry["at"]
        _count_released(lc, pause, requested)
        lc.set_step("resuming", "Bringing the kernels back")
        checked_result(await lc.backend.resume(ctx), ResumeResult, "resume")
        marks["resume_s"] = time.monotonic() - t0
        for rec in records:
            kid = ctx.kernel_map.get(rec.kernel_id)
            if kid:
                lc.watch_first_cell(flight, kid, rec.path)

        fresh: list[KernelRecord] = []
        if pause.get("mode") == "stop":
            # Stopped without a checkpoint: nothing to verify, nothing to restore, ever.
            for rec in records:
                outcomes[rec.kernel_id] = stopped_outcome(rec, ctx.kernel_map.get(rec.kernel_id))
        else:
            step = "verifying"
            t1 = time.monotonic()
            lc.set_step("verifying", "Checking whether the live kernels came back",
                        state="verifying")
            verdict = checked_result(await lc.backend.restored_live(ctx), RestoreVerdict,
                                     "restored_live")
            await asyncio.gather(*(_verify(lc, ctx, rec, outcomes) for rec in records))
            # A kernel whose state the pause did not save has nothing to restore.
            fresh = [r for r in records if outcomes[r.kernel_id]["outcome"] == "fresh"
                     and not r.state_not_saved]
            why = verdict.restore_reason
            if why:
                # Say why the live process did not come back (e.g. "pod was cold-started:
                # snapshot for another GPU model ..."), not only that it did not.
                for r in fresh:
                    prior = outcomes[r.kernel_id].get("reason")
                    outcomes[r.kernel_id]["reason"] = f"{why}; {prior}" if prior else why
            await lc.record(
                "verified", platform_live=verdict.live, restore_reason=why,
                outcome="live" if all(outcomes[r.kernel_id]["outcome"] == "live"
                                      for r in records if not r.state_not_saved)
                else "fresh",
                kernels=[{"path": r.path, "kernel_id": ctx.kernel_map.get(r.kernel_id),
                          "live": outcomes[r.kernel_id]["outcome"] == "live"}
                         for r in records],
            )
            marks["verify_s"] = time.monotonic() - t1

        if fresh:
            step = "restoring"
            t2 = time.monotonic()
            await _restore_all(lc, fresh, outcomes, pause.get("not_restored") or {})
            restored_bytes = sum(o.get("bytes", 0) for o in outcomes.values())
            await lc.record(
                "restored", bytes=restored_bytes,
                kernels=[{"path": r.path, "outcome": outcomes[r.kernel_id]["outcome"],
                          "checkpoint_id": r.checkpoint_id} for r in fresh])
            marks["restore_s"] = time.monotonic() - t2
        step = "attaching"
        await lc.backend.attach(ctx)
        failed = [r for r in records if outcomes[r.kernel_id]["outcome"] == "failed"]
        if failed:
            raise _restore_failure(failed, outcomes)
        usable = await lc.record("kernel_usable")
        kinds = {o["outcome"] for o in outcomes.values()}
        outcome = ("live" if kinds == {"live"} else "restored" if "restored" in kinds
                   else "fresh")
        marks["total_s"] = time.monotonic() - t0
        report = resume_report(flight, requested, usable["at"], records, ctx, outcomes, marks,
                               outcome)
        lc.step = None
        await lc.record("ready", outcome=outcome, report=report)
        metrics.RESUME_DURATION.labels(app.backend_name, outcome).observe(time.monotonic() - t0)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure is journaled
        marks["total_s"] = time.monotonic() - t0
        await _drop_unowned(lc, ctx, before, outcomes)
        report = resume_report(flight, requested, None, records, ctx, outcomes, marks, "failed")
        await lc.record_failure(flight, step, e, state_after="failed", report=report)
    finally:
        lc.step = None
        if lc.flight is flight:
            lc.flight = None


def _count_released(lc: Lifecycle, pause: dict[str, Any], requested: str) -> None:
    acc = pause.get("accelerator") or {}
    if not pause.get("released_at") or not pause.get("released", True):
        return
    try:
        seconds = (parse_iso(requested) - parse_iso(pause["released_at"])).total_seconds()
    except (TypeError, ValueError):
        return
    count = float(acc.get("count") or 0)
    if seconds > 0 and count > 0:
        metrics.ACCELERATOR_SECONDS_RELEASED.labels(
            lc.app.backend_name, str(acc.get("type") or "unknown")).inc(seconds * count)


async def _verify(lc: Lifecycle, ctx: ResumeContext, rec: KernelRecord,
                  outcomes: dict[str, dict[str, Any]]) -> None:
    kid = ctx.kernel_map.get(rec.kernel_id)
    out: dict[str, Any] = {"kernel_id": kid, "outcome": "fresh", "reason": None}
    outcomes[rec.kernel_id] = out
    if not kid:
        out.update(outcome="failed", reason="no kernel came back for this notebook")
        return
    if rec.state_not_saved:
        # Shut down without a checkpoint at the pause: whatever runs now is a new process.
        out.update(outcome="fresh", lost=True, state_not_saved=rec.state_not_saved,
                   reason=f"state not saved: {rec.state_not_saved}; the pause was allowed to "
                   "lose it, so this is a fresh kernel (the notebook file is intact)")
        return
    # A kernel busy with %resume restores itself in that cell: let it finish, so liveness
    # sees "restored" and the server never restores a second time over it.
    await bridge.wait_idle(lc.serverapp, kid, lc.app.bridge_timeout)
    try:
        # retries=1: an unanswered liveness call is sent once more on a new connection
        # before we give up. A kernel that still answers neither may be alive and busy with
        # the person's memory in it: it is never restored over (that could overwrite live
        # work); it is reported failed, and Resume again verifies it afresh.
        res = await bridge.liveness(lc.serverapp, kid, retries=1,
                                    timeout=lc.app.liveness_timeout)
    except Exception as e:  # noqa: BLE001 - no answer: neither live nor safely restorable
        out.update(outcome="failed", reason=f"the kernel did not answer the liveness "
                   f"check ({e})")
        return
    if res.failure is not None:
        out["reason"] = f"liveness check failed ({res.failure.error}); treating it as fresh"
        return
    token, restored = res.token, res.restored
    if restored and not (rec.token and token == rec.token):
        # Already rebuilt from a checkpoint (an earlier attempt, or %restore/%resume in the
        # kernel): restoring again would overwrite what the person did since.
        out.update(outcome="restored", checkpoint_id=restored.get("checkpoint_id"),
                   reason=f"already restored from checkpoint {restored.get('checkpoint_id')} "
                   f"(by {restored.get('by')})", already=True,
                   # the kernel's own restore rows, so the report lists what came back
                   variables=list(restored.get("variables") or []))
        return
    # Only the exact token proves the same process: a kernel that reopened the notebook has
    # none, and a kernel of another pause has a different one.
    if rec.token and token == rec.token:
        out.update(outcome="live", reason="the kernel process came back with its memory")
    else:
        out["reason"] = ("a new kernel process (no liveness token)" if not token else
                         "a different kernel process (another liveness token)")


def restore_kwargs(lc: Lifecycle, rec: KernelRecord) -> dict[str, Any]:
    """The bridge's ``restore`` arguments for one notebook's checkpoint."""
    app = lc.app
    return {"store_url": app.store_url or None, "key_path": app.key_path or None,
            "stream": rec.stream, "checkpoint_id": rec.checkpoint_id,
            "device": app.restore_device, "only": None}


UNREADABLE = {"missing": "is missing from the store", "corrupt": "is corrupt"}


def _restore_failure(failed: list[KernelRecord], outcomes: dict[str, dict[str, Any]]
                     ) -> StepError:
    """The failure of a resume whose restores did not all succeed, with the truth about each
    checkpoint: a missing or corrupt one will never restore, so "retry" would be a lie; the
    way out is a second resume, which starts those notebooks fresh (see _restore_all)."""
    outs = [outcomes[r.kernel_id] for r in failed]
    what = "; ".join(f"{r.label}: {o.get('reason')}" for r, o in zip(failed, outs, strict=False))
    gone = [r.label for r, o in zip(failed, outs, strict=False) if o.get("unreadable")]
    kept = [r.label for r, o in zip(failed, outs, strict=False) if not o.get("unreadable")]
    parts = []
    if gone:
        parts.append(f"The checkpoint of {', '.join(gone)} cannot be restored (missing or "
                     "corrupt). Resume again to go on without it: "
                     f"{'it starts' if len(gone) == 1 else 'they start'} in a fresh kernel "
                     "(the variables are lost; the notebook files are intact).")
    if kept:
        parts.append(f"The checkpoint of {', '.join(kept)} is still there: fix the cause if "
                     "one is named and resume again to retry.")
    kinds = {o.get("unreadable") for o in outs}
    reason = ("not_found" if kinds == {"missing"} else "integrity_error" if kinds == {"corrupt"}
              else "restore_error")
    return StepError(f"restore failed: {what}", reason=reason, hint=" ".join(parts))


async def _drop_unowned(lc: Lifecycle, ctx: ResumeContext, before: set[str],
                        outcomes: dict[str, dict[str, Any]]) -> None:
    """A failed resume leaves no kernel that nobody can reach: the kernels it started that no
    session owns and that hold nothing (not restored, not live) are shut down; a retry starts
    them again. Restored ones stay (the journal records them as the notebook's kernel)."""
    km = lc.serverapp.kernel_manager
    try:
        owned = {m["kernel"]["id"] for m in await lc.serverapp.session_manager.list_sessions()
                 if m.get("kernel")}
    except Exception as e:  # noqa: BLE001 - then nothing is shut down: never a session's kernel
        lc.log.warning("jupyter_pause: cannot list sessions after the failed resume: %s", e)
        return
    for old, kid in list(ctx.kernel_map.items()):
        keep = (outcomes.get(old) or {}).get("outcome") in ("restored", "live")
        if kid in before or kid in owned or keep:
            continue
        ctx.kernel_map.pop(old, None)
        if kid not in km:
            continue
        try:
            await km.shutdown_kernel(kid, now=True)
            lc.log.info("jupyter_pause: shut down kernel %s, started by the failed resume "
                        "and owned by no session", kid[:8])
        except Exception as e:  # noqa: BLE001 - the failure itself is what gets reported
            lc.log.warning("jupyter_pause: could not shut down kernel %s: %s", kid[:8], e)


async def _restore_all(lc: Lifecycle, fresh: list[KernelRecord],
                       outcomes: dict[str, dict[str, Any]],
                       not_restored: dict[str, dict[str, Any]]) -> None:
    lc.set_step("restoring", "Restoring from the checkpoint", state="restoring")
    progress_for = lc.kernels_progress("restoring", "Restoring")

    async def one(rec: KernelRecord) -> None:
        out = outcomes[rec.kernel_id]
        kid = out["kernel_id"]
        if not kid:
            return
        try:
            res = await bridge.restore(lc.serverapp, kid, progress=progress_for(rec),
                                       timeout=lc.app.bridge_timeout,
                                       silence=lc.app.kernel_silence_timeout,
                                       **restore_kwargs(lc, rec))
        except bridge.KernelDied as e:  # at once, not after bridge_timeout
            out.update(outcome="failed", reason=f"the kernel died during the restore ({e.why})",
                       restore_failed=True)
            return
        except Exception as e:  # noqa: BLE001 - reported per kernel (a stalled one too)
            out.update(outcome="failed", reason=str(e), restore_failed=True)
            return
        if res.failure is not None:
            error = res.failure.error
            kind = res.failure.unreadable  # by the exception's type the kernel sent
            out.update(outcome="failed", reason=error, restore_failed=True, unreadable=kind)
            if kind:
                out["reason"] = f"its checkpoint {rec.checkpoint_id} {UNREADABLE[kind]} ({error})"
            if kind and (not_restored.get(rec.stream) or {}).get("unreadable"):
                # The person was told, and resumed again: go on without it rather than
                # refuse forever. Its kernel is fresh (a failed restore changes nothing).
                out.update(outcome="fresh", lost=True, restore_failed=False,
                           reason=f"not restored: {out['reason']}; its variables are lost, "
                           "the notebook file is intact, and it runs in a fresh kernel")
            return
        variables = list(res.variables)
        out.update(outcome="restored", variables=variables,
                   process_state=list(res.process_state), warnings=list(res.warnings),
                   checkpoint_id=res.checkpoint_id or rec.checkpoint_id,
                   reason="restored from checkpoint (the live process did not come back: "
                   f"{out.get('reason') or 'fresh kernel'})",
                   bytes=sum(int(v.get("size") or 0) for v in variables
                             if v.get("status") == "restored"))
        metrics.FALLBACK_RESTORES.labels(lc.app.backend_name).inc()

    await asyncio.gather(*(one(r) for r in fresh))
