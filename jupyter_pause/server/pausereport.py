"""What a pause, resume or server stop did, in the shapes status and the report serve: the
per-kernel resume report, the last server stop's rows, and their one-line texts."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ..cluster.base import KernelRecord, ResumeContext
from ..journal import parse_iso
from ..variables import as_row

STOP_TRIGGERS = {"signal": "stop signal", "api": "shutdown API", "idle": "idle shutdown",
                 "culler": "culler"}


def trigger_text(trigger: str | None, hub: bool = False) -> str:
    """How a server stop was asked for, in words (status, report, CLI)."""
    text = STOP_TRIGGERS.get(str(trigger), str(trigger or "unknown"))
    return f"{text}, JupyterHub" if hub else text


def resume_report(flight: Any, requested: str, usable: str | None,
                  records: list[KernelRecord], ctx: ResumeContext,
                  outcomes: dict[str, dict[str, Any]], marks: dict[str, float],
                  outcome: str) -> dict[str, Any]:
    """The report of a resume: per notebook what came back (live, restored, fresh) and why."""
    kernels = []
    for rec in records:
        out = outcomes.get(rec.kernel_id, {"outcome": "failed", "reason": "not verified"})
        variables: list[Mapping[str, object]]
        if out["outcome"] == "live":
            variables = [{**as_row(v), "status": "live"} for v in rec.variables
                         if v.get("status") == "saved"]
            variables += [as_row(v) for v in rec.variables if v.get("status") != "saved"]
        else:
            variables = [as_row(v) for v in out.get("variables", [])]
        kernels.append({
            "path": rec.path, "kernel_id": ctx.kernel_map.get(rec.kernel_id),
            "previous_kernel_id": rec.kernel_id, "outcome": out["outcome"],
            "reason": out.get("reason"),
            "checkpoint_id": out.get("checkpoint_id") or rec.checkpoint_id,
            "warnings": out.get("warnings", []), "variables": variables,
            # random generators, working directory, settings: what the restore put back
            "process_state": [as_row(v) for v in out.get("process_state", [])],
            # a restore that was tried and failed (the kernel is empty), and whether the
            # checkpoint itself is unreadable ("missing" / "corrupt"); "lost": started fresh
            "restore_failed": bool(out.get("restore_failed")),
            "unreadable": out.get("unreadable"), "lost": bool(out.get("lost")),
            # the pause was allowed to lose this kernel's state (it could not be
            # checkpointed): why, and it came back as a fresh kernel
            "state_not_saved": rec.state_not_saved,
        })
    return {
        "flight_id": flight.id, "outcome": outcome, "requested": requested, "usable": usable,
        "first_cell": None, "trigger": flight.trigger,
        "durations": {k: round(v, 3) for k, v in marks.items()}, "kernels": kernels,
        # running kernels no paused session owned: not restored into, kept as they are
        "other_kernels": [dict(k) for k in ctx.other_kernels],
    }


def stopped_outcome(rec: KernelRecord, kernel_id: str | None) -> dict[str, Any]:
    """A kernel after a "stop" (no checkpoint): the backend's kernel as it is, never restored."""
    if not kernel_id:
        return {"kernel_id": None, "outcome": "failed",
                "reason": "no kernel came back for this notebook"}
    if kernel_id == rec.kernel_id:  # the backend kept it running (LocalBackend.stop_kernels)
        return {"kernel_id": kernel_id, "outcome": "live",
                "reason": "the kernel kept running through the stop"}
    return {"kernel_id": kernel_id, "outcome": "fresh",
            "reason": "stopped without a checkpoint (idle stop): a fresh kernel; the notebook's "
            "files are as they were saved"}


def stopped_text(stopped: dict[str, Any]) -> str:
    """One line for status: what the last server stop saved and what it did not, and why."""
    how = trigger_text(stopped.get("trigger"), bool(stopped.get("hub")))
    killed = " and was killed during its shutdown checkpoint" if stopped.get("interrupted") else ""
    rows = stopped.get("rows") or []
    saved = [r.get("path") or str(r.get("kernel_id"))[:8] for r in rows
             if r.get("status") == "saved"]
    lost = [f"{r.get('path') or str(r.get('kernel_id'))[:8]} ({r.get('reason')})" for r in rows
            if r.get("status") != "saved"]
    parts = [f"saved: {', '.join(saved)}"] if saved else []
    if lost:
        parts.append(f"not saved: {'; '.join(lost)}")
    return f"the server was stopped ({how}){killed}; " + "; ".join(parts)


def stopped_status(stopped: dict[str, Any] | None) -> dict[str, Any] | None:
    """The last server stop for status: per notebook saved or not (and why), what waits."""
    if not stopped:
        return None
    keys = ("flight_id", "trigger", "hub", "requested", "at", "interrupted", "budget_s", "pending")
    return {**{k: stopped.get(k) for k in keys},
            "kernels": [{k: r.get(k) for k in ("path", "status", "reason", "checkpoint_id",
                                                "previous_checkpoint", "seconds")}
                        for r in stopped.get("rows") or []]}


def resume_from_status(pause: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a resume would restore, with each checkpoint's age (for the UI)."""
    if not pause:
        return None
    if not pause.get("offered"):
        return {"offered": False, "checkpoints": [
            {"path": k.get("path"), "checkpoint_id": k.get("checkpoint_id"),
             "state_not_saved": k.get("state_not_saved")}
            for k in pause.get("kernels") or []]}
    now = datetime.now(timezone.utc)
    items = []
    for p in pause.get("previous") or []:
        try:
            age = round((now - parse_iso(str(p.get("created")))).total_seconds(), 1)
        except (TypeError, ValueError):
            age = None
        items.append({**p, "age_s": age})
    return {"offered": True, "checkpoints": items}
