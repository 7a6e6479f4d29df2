"""The workspace's pause/resume state machine: one flight at a time, every transition journaled.

    running -> checkpointing -> snapshotting -> releasing -> paused
    running -> releasing -> paused                 (mode "stop": no checkpoint, no snapshot)
    paused -> resuming (waiting_for_capacity) -> verifying -> ready (live)
                                                           \\-> restoring -> ready (restored)
    any step -> failed (with reason; the last good checkpoint is still there)

A pause whose kernels lost their memory on the way (a kernel died mid-checkpoint, or the server
died with its kernels) fails with ``resume_from``: the previous good checkpoint of each such
notebook, which becomes the state's ``pause`` (marked ``offered``) so that POST resume restores
it; a new pause replaces the offer.

Each transition is a journal event (contract §4). ``apply()`` is the only code that turns events
into state, so the state after a crash is rebuilt by replaying the journal through it.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from jupyter_core.utils import ensure_async

from ..cluster.base import BackendError, KernelRecord, PauseContext, ResumeContext
from ..policy.report import trigger_text
from . import kernels as kbridge
from . import metrics, shutdown
from .events import emit_lifecycle
from .journal import Journal, parse_iso, utcnow_iso

if TYPE_CHECKING:
    from .app import PauseApp

PAUSE_STATES = ("checkpointing", "snapshotting", "releasing")
PAUSE_MODES = ("pause", "stop")
RESUME_STATES = ("resuming", "waiting_for_capacity", "verifying", "restoring")
# A pause that failed with state "failed" never touched the kernels nor the checkpoints before
# it (a checkpoint becomes visible only once complete): the person must read that, not guess.
PAUSE_FAILED_SAFE = "Your kernels are untouched and the last good checkpoint is intact."
# How often a bridge call checks that its kernel's process is still the one it started on.
KERNEL_WATCH_INTERVAL = 0.5
# Unreferenced blobs younger than this survive the start-up clean-up (a writer of another
# process may still publish them); temp files of dead writers go whatever their age.
STORE_GC_GRACE_S = 3600.0
# Fields kept out of the timeline (they are in the journal and the report).
_BULKY = ("kernels", "report", "variables", "resume_from", "rows")


class KernelDied(Exception):
    """The kernel's process ended (or was replaced by a restart) while a bridge call ran."""


class Refusal(Exception):
    """A request that cannot be accepted now: HTTP ``status`` with a one-line message."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


class StepError(Exception):
    """A step failed for a reason a person can act on (``reason``: a name from
    :data:`jupyter_pause.cluster.reasons.FAILURE_REASONS`)."""

    def __init__(self, message: str, *, reason: str = "other", hint: str | None = None,
                 resume_from: dict[str, Any] | None = None):
        super().__init__(message)
        self.reason = reason
        self.hint = hint
        # A pause record (kernels + checkpoint ids) that POST resume restores: the way back a
        # failure offers when a kernel's memory is already gone.
        self.resume_from = resume_from


@dataclass
class Flight:
    id: str
    kind: str  # "pause" | "resume"
    trigger: str
    started: str
    task: asyncio.Task | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "trigger": self.trigger, "started": self.started}


def default_state() -> dict[str, Any]:
    return {
        "version": 1, "seq": 0, "state": "running", "outcome": None, "reason": None,
        "hint": None, "flight": None, "timeline": [], "inflight": None, "pause": None,
        "last_checkpoint": None, "last_report": None, "last_activity": None,
        # A shutdown checkpoint under way ("stopping"), and the last one that ended ("stopped":
        # what it saved, and which saved notebooks still wait for their restore).
        "stopping": None, "stopped": None,
    }


def apply(st: dict[str, Any], e: dict[str, Any]) -> None:
    """Fold one journal entry into the persistent state (pure; used live and for recovery)."""
    ev, at = e.get("event"), e.get("at")
    st["seq"] = max(int(st.get("seq", 0)), int(e.get("seq", 0)))
    flight = e.get("flight")
    if ev in ("pause_requested", "resume_requested", "shutdown_requested"):
        st["timeline"] = []
        st["flight"] = {"id": flight, "kind": e.get("kind"), "trigger": e.get("trigger"),
                        "started": at}
        st.update(outcome=None, reason=None, hint=None)
    if flight and ev != "activity":
        item = {k: v for k, v in e.items() if k not in ("seq", "flight", "kind", *_BULKY)}
        st.setdefault("timeline", []).append(item)
    if ev == "activity":
        st["last_activity"] = at
    elif ev == "pause_requested":
        # A stop goes straight to releasing; its kernels come with the request (no
        # checkpoint_written will carry them), so a server that dies mid-stop still knows them.
        stop = e.get("mode") == "stop"
        st["state"] = "releasing" if stop else "checkpointing"
        st["inflight"] = {"flight_id": flight, "requested": at, "mode": e.get("mode") or "pause",
                          "kernels": e.get("kernels", []) if stop else [], "checkpoints": []}
        if not stop:
            # Which notebooks were being paused: after a crash mid-checkpoint, these are the
            # ones whose previous checkpoint is offered.
            st["inflight"]["requested_kernels"] = e.get("kernels", [])
        if (st.get("pause") or {}).get("offered"):
            st["pause"] = None  # a new pause supersedes an offered way back
    elif ev == "checkpoint_written":
        # A newer checkpoint of a notebook supersedes what the last server stop saved of it.
        _drop_pending(st, [k.get("path") for k in e.get("kernels") or []])
        inflight = st.get("inflight") or {"flight_id": flight}
        inflight.update(kernels=e.get("kernels", []), checkpoints=e.get("checkpoints", []),
                        bytes_written=e.get("bytes_written", 0), bytes_total=e.get("bytes_total", 0))
        st["inflight"] = inflight
        st["last_checkpoint"] = {
            "id": (e.get("checkpoints") or [None])[0], "ids": e.get("checkpoints", []),
            "created": at, "bytes_total": e.get("bytes_total", 0),
            "bytes_written": e.get("bytes_written", 0), "kernels": len(e.get("kernels", [])),
        }
        st["state"] = "snapshotting"
    elif ev == "snapshot_ready":
        if st.get("inflight") is not None:
            st["inflight"]["snapshot"] = {"snapshot": e.get("snapshot"), "backend": e.get("backend"),
                                          "skipped": e.get("skipped", False)}
        st["state"] = "releasing"
    elif ev == "accelerator_released":
        if st.get("inflight") is not None:
            st["inflight"].update(released_at=at, accelerator=e.get("accelerator"),
                                  released=e.get("released", True))
    elif ev == "paused":
        st["pause"] = st.get("inflight") or st.get("pause")
        st.update(inflight=None, state="paused", flight=None)
    elif ev == "resume_requested":
        st["state"] = "resuming"
    elif ev == "waiting_for_capacity":
        st.update(state="waiting_for_capacity", reason=e.get("reason"))
    elif ev == "pod_scheduled":
        st.update(state="resuming", reason=None)
    elif ev == "verified":
        st["state"] = "restoring" if e.get("outcome") == "fresh" else "verifying"
    elif ev == "ready":
        st.update(state="ready", outcome=e.get("outcome"), pause=None, flight=None, reason=None,
                  hint=None)
        if e.get("report") is not None:
            st["last_report"] = e["report"]
    elif ev == "first_cell_ran":
        report = st.get("last_report")
        if report and report.get("flight_id") == flight and not report.get("first_cell"):
            report["first_cell"] = at
            try:
                report["durations"]["first_cell_s"] = round(
                    (parse_iso(at) - parse_iso(report["requested"])).total_seconds(), 3)
            except (KeyError, TypeError, ValueError):
                pass
    elif ev == "recomputed":
        _merge_recomputed(st.get("last_report"), e)
    elif ev in ("shutdown_requested", "stop_checkpoint_written", "stopped",
                "restored_after_stop"):
        _apply_stop(st, e)
    elif ev == "failed":
        after = e.get("state_after") or "failed"
        if e.get("kind") == "pause":
            if after == "paused":  # kernels may be gone already: keep the way back
                st["pause"] = st.get("inflight") or st.get("pause")
            elif e.get("resume_from"):  # memory is gone: offer the previous good checkpoint
                st["pause"] = e["resume_from"]
            st["inflight"] = None
        st.update(state=after, reason=e.get("message") or e.get("reason"), hint=e.get("hint"),
                  flight=None,
                  outcome="failed" if e.get("kind") == "resume" else None)
        if e.get("report") is not None:
            st["last_report"] = e["report"]


def _merge_recomputed(report: dict[str, Any] | None, e: dict[str, Any]) -> None:
    """Fold a ``recomputed`` event (POST recompute) into the last report's kernel of that path:
    the variables it re-ran become "recomputed" (or "failed", with the reason)."""
    kernel = next((k for k in (report or {}).get("kernels") or []
                   if k.get("path") == e.get("path")), None)
    if kernel is None:
        return
    rows = kernel.setdefault("variables", [])
    by_name = {v.get("name"): v for v in rows}
    for v in e.get("variables") or []:
        row = by_name.get(v.get("name"))
        if row is None:
            row = _variable(v)
            rows.append(row)
            by_name[row["name"]] = row
        row["status"], row["reason"] = v.get("status"), v.get("reason")
        # A failed re-run may be retried; a recomputed variable is done.
        row["recomputable"] = bool(row.get("cell")) and v.get("status") == "failed"


def _drop_pending(st: dict[str, Any], paths: list[str | None]) -> None:
    pending = (st.get("stopped") or {}).get("pending")
    if pending:
        st["stopped"]["pending"] = [p for p in pending if p not in paths]


def _apply_stop(st: dict[str, Any], e: dict[str, Any]) -> None:
    """The shutdown checkpoint's events (see :mod:`.shutdown`)."""
    ev, at, flight = e.get("event"), e.get("at"), e.get("flight")
    if ev == "shutdown_requested":
        st["state"] = "stopping"
        st["stopping"] = {"flight_id": flight, "requested": at, "trigger": e.get("trigger"),
                          "hub": bool(e.get("hub")), "kernels": e.get("kernels", []),
                          "saved": []}
    elif ev == "stop_checkpoint_written":
        if st.get("stopping") is not None:
            st["stopping"]["saved"].extend(e.get("kernels") or [])
    elif ev == "stopped":
        saved = list(e.get("kernels") or [])
        rows = list(e.get("rows") or [])
        stopped = {
            "flight_id": flight, "trigger": e.get("trigger"), "hub": bool(e.get("hub")),
            "requested": (st.get("stopping") or {}).get("requested"), "at": at,
            "interrupted": bool(e.get("interrupted")), "budget_s": e.get("budget_s"),
            "kernels": saved, "rows": rows,
            # Restored when a kernel starts for the notebook's session (the next server).
            "pending": [k["path"] for k in saved if k.get("path")],
        }
        st["stopped"] = stopped
        st.update(state="running", outcome="stopped", flight=None, stopping=None,
                  reason=_stopped_text(stopped) if rows else None,
                  hint=("Open a saved notebook: its variables are restored before its first "
                        "cell runs.") if stopped["pending"] else None)
    elif ev == "restored_after_stop":
        stopped = st.get("stopped") or {}
        path = e.get("path")
        _drop_pending(st, [path])
        report = st.get("last_report")
        if not report or report.get("flight_id") != flight:
            report = {"flight_id": flight, "outcome": None, "requested": e.get("requested") or at,
                      "usable": None, "first_cell": None, "trigger": "stop",
                      "after_stop": {"trigger": stopped.get("trigger"),
                                     "hub": bool(stopped.get("hub")),
                                     "stopped_at": stopped.get("at")},
                      "durations": {}, "kernels": []}
        report["kernels"] = [k for k in report.get("kernels") or [] if k.get("path") != path]
        report["kernels"].append({
            "path": path, "kernel_id": e.get("kernel_id"),
            "previous_kernel_id": e.get("previous_kernel_id"), "outcome": e.get("outcome"),
            "reason": e.get("reason"), "checkpoint_id": e.get("checkpoint_id"),
            "warnings": e.get("warnings") or [],
            "variables": [_variable(v) for v in e.get("variables") or []]})
        report["usable"] = at
        report.setdefault("durations", {}).update(e.get("durations") or {})
        ok = any(k.get("outcome") == "restored" for k in report["kernels"])
        report["outcome"] = "restored" if ok else "failed"
        st["last_report"] = report
        if e.get("outcome") == "restored":
            st.update(state="ready", outcome="restored", reason=None, hint=None)
        else:
            st.update(state="ready" if ok else "running", reason=e.get("reason"),
                      hint="The checkpoint is still there: run %restore in the notebook to "
                      "retry.")


def _stopped_text(stopped: dict[str, Any]) -> str:
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


class Lifecycle:
    """Owns flights, the journal and the state; handlers and backends go through it."""

    def __init__(self, app: PauseApp):
        self.app = app
        self.log = app.log
        self.journal = Journal(app.state_dir, log=app.log)
        self.state: dict[str, Any] = default_state()
        self.flight: Flight | None = None
        self.step: dict[str, Any] | None = None
        self._io = ThreadPoolExecutor(1, thread_name_prefix="jupyter-pause-journal")
        self._last_progress_emit = 0.0
        self._watchers: list[asyncio.Task] = []
        self._backend_desc: dict[str, Any] = {"name": app.backend_name, "configured": True,
                                              "can_pause": True, "why_not": None}
        self._backend_desc_at = 0.0
        self._desc_task: asyncio.Task | None = None
        self._activity_seen: Any = None
        self.temps_cleaned: dict[str, Any] | None = None  # the start-up clean-up's result
        self._cleanup: asyncio.Future | None = None
        # Set once the server stops (no new flight then); notebooks being restored after a stop.
        self.stopping = False
        self.restoring_after_stop: set[str] = set()

    @property
    def backend(self) -> Any:
        return self.app.backend_instance

    @property
    def serverapp(self) -> Any:
        return self.app.serverapp

    # ---------------------------------------------------------------- start-up and recovery

    def load(self) -> None:
        """Rebuild the state from state.json + newer journal lines; settle interrupted flights.

        Runs at server start (before the event loop serves requests), so blocking I/O is fine.
        """
        self.journal.open()
        st = self.journal.load_state() or default_state()
        for entry in self.journal.entries(after_seq=int(st.get("seq", 0))):
            apply(st, entry)
        self.state = {**default_state(), **st}
        self.journal.seq = max(self.journal.seq, int(self.state.get("seq", 0)))
        cur, flight = self.state["state"], self.state.get("flight") or {}
        fid = flight.get("id")
        if cur == "checkpointing":
            # The server died before every checkpoint was written: the pause did not happen.
            # Earlier checkpoints are untouched (a checkpoint becomes visible only when complete).
            self._settle_interrupted_checkpoint(fid)
        elif cur in ("snapshotting", "releasing"):
            # Every checkpoint is written: the way back exists, and the kernels went down with
            # the server (or the pod); count the pause as done so that resume restores them.
            self._record_sync("paused", fid, "pause", recovered=True)
        elif cur in RESUME_STATES:
            self._record_sync("failed", fid, "resume", step=cur, reason="interrupted",
                              message=f"the server stopped during {cur}", state_after="paused",
                              hint="Resume again; the checkpoint is still available.")
        elif cur == "stopping":
            self._settle_interrupted_stop(fid)
        self.journal.save_state(self.state)

    def _settle_interrupted_stop(self, fid: str | None) -> None:
        """The server was killed (the grace period ended) during its shutdown checkpoint: the
        kernels whose checkpoint was journaled are saved; the others keep their previous one."""
        stopping = self.state.get("stopping") or {}
        saved = list(stopping.get("saved") or [])
        done = {k.get("kernel_id"): k for k in saved}
        rows, lost = [], []
        for k in stopping.get("kernels") or []:
            rec = KernelRecord.from_dict(k)
            row: dict[str, Any] = {"path": rec.path, "stream": rec.stream,
                                   "kernel_id": rec.kernel_id, "status": "not_saved",
                                   "checkpoint_id": None, "reason": "the server was killed "
                                   "during its shutdown checkpoint"}
            if rec.kernel_id in done:
                row.update(status="saved", reason=None,
                           checkpoint_id=done[rec.kernel_id].get("checkpoint_id"))
            else:
                lost.append(rec)
            rows.append(row)
        shutdown.add_previous(rows, self._offer_previous(lost, fid) if lost else None)
        self._record_sync("stopped", fid, "stop", trigger=stopping.get("trigger"),
                          hub=bool(stopping.get("hub")), interrupted=True, rows=rows,
                          kernels=saved)

    def _settle_interrupted_checkpoint(self, fid: str | None) -> None:
        """A pause that died mid-checkpoint. Kernels that still run (the same process kept
        them) are untouched: back to running. Kernels that died with the server lost their
        memory: the state offers their previous good checkpoints, which POST resume restores."""
        message = "the server stopped during checkpointing; the pause did not happen"
        requested = [KernelRecord.from_dict(k) for k in
                     (self.state.get("inflight") or {}).get("requested_kernels") or []]
        km = self.serverapp.kernel_manager
        gone = [r for r in requested if r.kernel_id not in km]
        offer = self._offer_previous(gone, fid) if gone else None
        if offer is None:
            hint = ("Pause again; the previous checkpoint is still available." if not gone else
                    "The kernels stopped with the server and no earlier checkpoint of theirs "
                    "exists; pause again once they run.")
            self._record_sync("failed", fid, "pause", step="checkpointing", reason="interrupted",
                              message=message, state_after="running", hint=hint)
            return
        self._record_sync(
            "failed", fid, "pause", step="checkpointing", reason="interrupted",
            message=f"{message}; the kernels stopped with it ({_offer_text(offer)})",
            state_after="failed", resume_from=offer,
            hint="Resume to restore the previous checkpoint into fresh kernels, or pause again.")

    def _offer_previous(self, records: list[KernelRecord], fid: str | None
                        ) -> dict[str, Any] | None:
        """A pause record whose checkpoints are each notebook's newest authentic checkpoint
        (blocking: reads the store). None when no notebook has one."""
        try:
            store = _open_store(self.app)
            kernels = []
            for rec in records:
                found = store.list(rec.stream)
                if found:
                    rec.checkpoint_id, rec.token = found[0].id, None
                    rec.bytes_total = int(found[0].bytes_total or 0)
                    kernels.append((rec, found[0].created))
        except Exception as e:  # noqa: BLE001 - no offer then; the reason goes to the log
            self.log.warning("jupyter_pause: cannot look up earlier checkpoints: %s", e)
            return None
        if not kernels:
            return None
        return {
            "flight_id": fid, "mode": "pause", "offered": True,
            "kernels": [r.to_dict() for r, _ in kernels],
            "checkpoints": [r.checkpoint_id for r, _ in kernels],
            "previous": [{"path": r.path, "stream": r.stream, "checkpoint_id": r.checkpoint_id,
                          "created": created} for r, created in kernels],
        }

    def _record_sync(self, event: str, flight: str | None, kind: str | None, **fields: Any) -> None:
        entry = self._entry(event, flight, kind, fields)
        self.journal.append(entry)
        apply(self.state, entry)

    async def start(self) -> None:
        """After the event loop runs: resume verification for a workspace that came back."""
        self._refresh_backend_desc()
        self._cleanup = asyncio.ensure_future(self._clean_store_temps())
        if self.state["state"] != "paused" and not (
            self.state["state"] == "failed" and self.state.get("pause")
        ):
            return
        if (self.state.get("pause") or {}).get("offered"):
            return  # restoring an older checkpoint is the person's choice, never automatic
        want = self.app.resume_on_start
        if want is None:
            want = bool(getattr(self.backend, "resume_on_start", False))
        if want or list(self.serverapp.kernel_manager.list_kernel_ids()):
            try:
                await self.request_resume("startup")
            except Refusal as e:
                self.log.warning("jupyter_pause: no resume at start: %s", e)

    async def _clean_store_temps(self) -> None:
        """Remove what writes that died (with a server or a kernel) left in the store: temp
        files not covered by a live writer's lease. Off the event loop: a store may be remote."""
        from ..checkpoint import gc as store_gc
        from ..checkpoint import open_store

        url = self.app.store_url or None
        try:
            res = await asyncio.to_thread(store_gc, open_store(url), grace_s=STORE_GC_GRACE_S)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - clean-up must never stop the server
            self.log.warning("jupyter_pause: store clean-up at start failed: %s", e)
            return
        if res.get("temps_removed") or res.get("removed"):
            self.log.info("jupyter_pause: removed %d temp files and %d unreferenced blobs "
                          "(%d bytes) left by interrupted checkpoints",
                          res.get("temps_removed", 0), len(res.get("removed") or []),
                          res.get("bytes_freed", 0))
        self.temps_cleaned = res

    async def stop(self) -> None:
        for task in self._watchers:
            task.cancel()
        if self._cleanup is not None:
            self._cleanup.cancel()
        if self.flight and self.flight.task:
            self.flight.task.cancel()
        self._io.shutdown(wait=True)

    # ---------------------------------------------------------------- recording

    def _entry(self, event: str, flight: str | None, kind: str | None,
               fields: dict[str, Any]) -> dict[str, Any]:
        return {"seq": self.journal.next_seq(), "at": utcnow_iso(), "flight": flight, "kind": kind,
                "event": event, **fields}

    async def _record(self, event: str, *, flight: Flight | None | bool = True,
                      **fields: Any) -> dict[str, Any]:
        """Journal the event (durable before returning), fold it into the state, emit it."""
        f = self.flight if flight is True else (flight or None)
        entry = self._entry(event, f.id if f else None, f.kind if f else None, fields)
        apply(self.state, entry)
        snapshot = copy.deepcopy(self.state)
        loop = asyncio.get_running_loop()
        # One worker thread: journal lines and state.json are written in call order.
        journal_done = loop.run_in_executor(self._io, self.journal.append, entry)
        state_done = loop.run_in_executor(self._io, self.journal.save_state, snapshot)
        await journal_done
        await state_done
        self._emit(event)
        return entry

    async def _note(self, event: str, **fields: Any) -> dict[str, Any]:
        """Like _record, in memory only: for the moments nothing may be written to disk."""
        f = self.flight
        entry = self._entry(event, f.id if f else None, f.kind if f else None, fields)
        apply(self.state, entry)
        self._emit(event)
        return entry

    def record_event(self, event: str, **fields: Any) -> asyncio.Task:
        """Public: journal an event outside a flight (policy: auto_pause_announced/cancelled)."""
        return asyncio.ensure_future(self._record(event, flight=False, **fields))

    async def record_recompute(self, path: str, kernel_id: str,
                               variables: list[dict[str, Any]]) -> None:
        """Journal a POST recompute's outcome; ``apply`` marks it in ``last_report`` (persisted
        with state.json) and the event makes the UI re-read the report."""
        await self._record("recomputed", flight=False, path=path, kernel_id=kernel_id,
                           variables=[_variable(v) for v in variables])

    def _emit(self, event: str) -> None:
        emit_lifecycle(self.serverapp, {
            "state": self.state["state"], "outcome": self.state.get("outcome"),
            "step": self.step, "reason": self.state.get("reason"),
            "flight_id": self.flight.id if self.flight else None, "event": event,
        })

    def _set_step(self, name: str, message: str, done: int = 0, total: int = 0,
                  state: str | None = None) -> None:
        self.step = {"name": name, "done": done, "total": total, "message": message}
        if state and state != self.state["state"]:
            self.state["state"] = state  # in-memory sub-step; the journal has the real events
            self._emit("progress")
            self._last_progress_emit = time.monotonic()
        else:
            self._progress_event()

    def _progress_event(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_progress_emit >= self.app.progress_interval:
            self._last_progress_emit = now
            self._emit("progress")

    # ---------------------------------------------------------------- status

    async def status(self) -> dict[str, Any]:
        self._refresh_backend_desc()
        st = self.state
        kernels = []
        try:
            for rec in await kbridge.running_kernels(self.serverapp):
                kernels.append({"id": rec.kernel_id, "name": rec.kernel_name, "path": rec.path,
                                "execution_state": kbridge.execution_state(self.serverapp,
                                                                           rec.kernel_id)})
        except Exception as e:  # noqa: BLE001
            self.log.debug("jupyter_pause: listing kernels failed: %s", e)
        return {
            "state": st["state"], "outcome": st.get("outcome"), "step": self.step,
            "reason": st.get("reason"), "hint": st.get("hint"),
            "flight": self.flight.to_dict() if self.flight else None,
            "timeline": st.get("timeline", []), "backend": dict(self._backend_desc),
            "kernels": kernels, "last_checkpoint": st.get("last_checkpoint"),
            "last_report": st.get("last_report"),
            # What POST resume would bring back now (the UI's one action after a failure).
            "resume_available": self.can_resume() and self.flight is None,
            "resume_from": _resume_from(st.get("pause")),
            "stopped": _stopped_status(st.get("stopped")),
        }

    def _refresh_backend_desc(self) -> None:
        if self.app.config_error:  # never pause with a half-applied config (another store)
            self._backend_desc = {"name": self.app.backend_name, "configured": False,
                                  "can_pause": False, "why_not": f"{self.app.config_error}; "
                                  "fix it and restart the server"}
            return
        if time.monotonic() - self._backend_desc_at < 30 or (
            self._desc_task and not self._desc_task.done()
        ):
            return

        async def refresh() -> None:
            try:
                desc = await asyncio.wait_for(self.backend.describe(), 30)
                self._backend_desc = {"name": self.app.backend_name, "configured": True,
                                      "can_pause": True, "why_not": None, **desc}
            except Exception as e:  # noqa: BLE001 - shown as why_not
                self._backend_desc = {"name": self.app.backend_name, "configured": False,
                                      "can_pause": False, "why_not": f"backend check failed: {e}"}
            self._backend_desc_at = time.monotonic()

        self._desc_task = asyncio.ensure_future(refresh())

    # ---------------------------------------------------------------- requests

    def can_resume(self) -> bool:
        return self.state.get("pause") is not None

    async def request_pause(self, trigger: str = "manual", interrupt: bool = False,
                            mode: str = "pause") -> Flight:
        """Start (or join) a pause. ``mode="stop"`` shuts the kernels down without a checkpoint
        or snapshot (the idle policy's stop profiles): files stay, memory does not, and the
        resume starts fresh kernels."""
        # No await before self.flight is set: concurrent requests must see each other.
        if mode not in PAUSE_MODES:
            raise Refusal(f"unknown pause mode {mode!r} (expected pause or stop)", 400)
        self._refuse_while_stopping("pause")
        if self.flight is not None:
            if self.flight.kind == "pause":
                return self.flight
            raise Refusal("a resume is in progress; pause again when it has finished")
        if self.can_resume() and not (self.state.get("pause") or {}).get("offered"):
            raise Refusal("the workspace is already paused; resume it first")
        desc = self._backend_desc
        if not desc.get("can_pause", True):
            raise Refusal(f"pausing is not possible here: {desc.get('why_not') or 'backend'}")
        flight = self._new_flight("pause", trigger)
        flight.task = asyncio.ensure_future(self._run_pause(
            flight, interrupt or self.app.interrupt_busy, mode))
        return flight

    async def request_resume(self, trigger: str = "manual") -> Flight:
        self._refuse_while_stopping("resume")
        if self.flight is not None:
            if self.flight.kind == "resume":
                return self.flight
            raise Refusal("a pause is in progress; resume when it has finished")
        if not self.can_resume():
            raise Refusal("the workspace is not paused; there is nothing to resume")
        if self.app.config_error:  # its checkpoints are in the configured store, not the default
            raise Refusal(f"resuming is not possible: {self.app.config_error}; fix it and "
                          "restart the server")
        flight = self._new_flight("resume", trigger)
        flight.task = asyncio.ensure_future(self._run_resume(flight))
        return flight

    def _refuse_while_stopping(self, what: str) -> None:
        if self.stopping or (self.flight is not None and self.flight.kind == "stop"):
            raise Refusal(f"the server is stopping (its kernels are being checkpointed); {what} "
                          "after it has started again", 503)
        if self.restoring_after_stop:
            raise Refusal(f"{', '.join(sorted(self.restoring_after_stop))} is being restored "
                          f"after the server was stopped; {what} when it has finished")

    def _new_flight(self, kind: str, trigger: str) -> Flight:
        flight = Flight(id=f"{kind}-{uuid.uuid4().hex[:12]}", kind=kind, trigger=trigger,
                        started=utcnow_iso())
        self.flight = flight
        self.step = None
        for task in self._watchers:
            task.cancel()
        self._watchers = []
        metrics.FLIGHTS.labels(self.app.backend_name, kind, metrics.trigger_label(trigger)).inc()
        return flight

    async def wait(self) -> None:
        """Wait for the flight in progress (tests, CLI helpers)."""
        if self.flight and self.flight.task:
            await asyncio.shield(self.flight.task)

    # ---------------------------------------------------------------- pause

    async def _run_pause(self, flight: Flight, interrupt: bool, mode: str = "pause") -> None:
        t0 = time.monotonic()
        step = "checkpointing"
        held = False  # the cluster stops this pod after its snapshot: write nothing more
        stop = mode == "stop"
        try:
            if stop:
                records = await kbridge.running_kernels(self.serverapp)
                await self._record("pause_requested", trigger=flight.trigger, mode=mode,
                                   kernels=[r.to_dict() for r in records])
            else:
                # The kernels go into the journal first: a server that dies mid-checkpoint then
                # knows which notebooks' previous checkpoints to offer.
                records = await kbridge.running_kernels(self.serverapp)
                await self._record("pause_requested", trigger=flight.trigger, mode=mode,
                                   kernels=[r.to_dict() for r in records])
            await self._wait_idle(records, interrupt)  # a stop never kills a running cell either
            ctx = PauseContext(
                flight_id=flight.id, trigger=flight.trigger, serverapp=self.serverapp,
                kernels=records, accelerator=dict(self.app.accelerator),
                _report=self._backend_report, _progress=self._backend_progress, mode=mode,
            )
            snap: dict[str, Any] = {}
            if not stop:
                await self._checkpoint_all(records, flight)
                total = sum(r.bytes_total for r in records)
                written = sum(r.bytes_written for r in records)
                ctx.checkpoints = [r.checkpoint_id for r in records]
                await self._record(
                    "checkpoint_written", bytes_written=written, bytes_total=total,
                    checkpoints=ctx.checkpoints, kernels=[r.to_dict() for r in records],
                )
                metrics.CHECKPOINT_BYTES.labels(self.app.backend_name).inc(written)
                metrics.CHECKPOINT_SIZE.labels(self.app.backend_name).set(total)

                step = "snapshotting"
                self._set_step("snapshotting", "Snapshotting the workspace")
                snap = await self.backend.snapshot(ctx) or {}
                ctx.snapshot = snap
                # The cluster stops this pod right after its snapshot (GKE postCheckpoint: stop,
                # the rule for pods with a PVC): a write to the pod's volumes now would make the
                # restore fail. The journal stays at "snapshotting" (checkpoint_written), which
                # settles both ways: a restored copy of this process journals on from here, and
                # a cold start's next server start counts the pause as done and restores the
                # checkpoint (load()).
                hold = bool(snap.get("hold_writes")) and not snap.get("woke_up")
                record = self._note if hold else self._record
                held = hold
                await record("snapshot_ready", snapshot=snap.get("snapshot"),
                             backend=self.app.backend_name, skipped=bool(snap.get("skipped")))
            else:
                record = self._record

            step = "releasing"
            self._set_step("releasing", "Stopping the kernels" if stop
                           else "Releasing the accelerator")
            rel = await self.backend.release(ctx) or {}
            await record("accelerator_released", accelerator=dict(self.app.accelerator),
                         released=bool(rel.get("released", True)),
                         stopped_kernels=rel.get("stopped_kernels", []))
            self.step = None
            await record("paused")
            metrics.PAUSE_DURATION.labels(self.app.backend_name).observe(time.monotonic() - t0)
            woke_up = bool(snap.get("woke_up") or rel.get("woke_up"))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - every failure is journaled
            woke_up = False
            # A failed release after a checkpoint still leaves a way back (paused); a stop
            # has no checkpoint, so its failed release is a failure. After a snapshot whose pod
            # the cluster stops, the failure is not written either (see above).
            await self._fail(flight, step, e, state_after="paused"
                             if step == "releasing" and not stop else "failed", persist=not held)
        finally:
            self.step = None
            if self.flight is flight:
                self.flight = None
        if woke_up:
            # A pod snapshot restore resumed this very process inside the pause: go on with a
            # resume at once, which verifies the kernels (live) and reports it.
            await self.request_resume("startup")

    async def _wait_idle(self, records: list[KernelRecord], interrupt: bool) -> None:
        """Never checkpoint mid-cell: wait for idle, interrupt if asked, else refuse."""
        timeout = self.app.busy_timeout
        for rec in records:
            if kbridge.execution_state(self.serverapp, rec.kernel_id) != "busy":
                continue
            self._set_step("checkpointing", f"Waiting for {rec.label} to finish its cell")
            if await kbridge.wait_idle(self.serverapp, rec.kernel_id, timeout):
                continue
            if interrupt:
                self._set_step("checkpointing", f"Interrupting {rec.label}")
                await kbridge.interrupt(self.serverapp, rec.kernel_id)
                if await kbridge.wait_idle(self.serverapp, rec.kernel_id, 15):
                    continue
            raise StepError(
                f"{rec.label} is still running a cell after {timeout:g} s; pause refused, "
                "nothing was changed",
                reason="kernel_busy",
                hint="Wait for the cell to finish or interrupt the kernel, then pause again.",
            )

    async def _checkpoint_all(self, records: list[KernelRecord], flight: Flight) -> None:
        done: dict[str, int] = {}
        totals: dict[str, int] = {}
        label = ", ".join(r.label for r in records) or "no kernels"
        self._set_step("checkpointing", f"Checkpointing {label}", state="checkpointing")

        def progress_for(rec: KernelRecord) -> Any:
            def progress(d: int, t: int, *_: Any) -> None:
                done[rec.kernel_id], totals[rec.kernel_id] = int(d), int(t)
                self.step = {"name": "checkpointing", "done": sum(done.values()),
                             "total": sum(totals.values()),
                             "message": f"Checkpointing {rec.label}"}
                self._progress_event()
            return progress

        async def one(rec: KernelRecord) -> None:
            token = secrets.token_urlsafe(24)
            kwargs: dict[str, Any] = {}
            if self.app.variable_timeout > 0:
                kwargs["variable_timeout"] = self.app.variable_timeout
            try:
                res = await self._call_watched(
                    rec.kernel_id, "checkpoint", progress=progress_for(rec),
                    timeout=self.app.bridge_timeout, store_url=self.app.store_url or None,
                    key_path=self.app.key_path or None, stream=rec.stream, token=token,
                    meta={"trigger": flight.trigger, "flight": flight.id,
                          "kernel_id": rec.kernel_id, "path": rec.path},
                    keep=self.app.keep_checkpoints or None, **kwargs,
                )
            except KernelDied as e:
                raise await self._kernel_died(rec, flight, str(e)) from e
            except Exception as e:
                raise StepError(f"checkpoint of {rec.label} failed: {e}",
                                reason="checkpoint_error") from e
            if not res.get("ok"):
                err = str(res.get("error") or "unknown error")
                reason = "storage_full" if "space" in err.lower() else "checkpoint_error"
                raise StepError(f"checkpoint of {rec.label} failed: {err}", reason=reason,
                                hint="Fix the cause and pause again.")
            rec.token = res.get("token") or token
            rec.pid = res.get("pid")
            rec.checkpoint_id = res.get("checkpoint_id")
            rec.bytes_written = int(res.get("bytes_written") or 0)
            rec.bytes_total = int(res.get("bytes_total") or 0)
            rec.variables = list(res.get("variables") or [])

        tasks = [asyncio.ensure_future(one(r)) for r in records]
        try:
            # The first kernel that fails (one that died, above all) ends the step at once.
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()  # no-op for finished ones; stops the others' progress updates
            await asyncio.gather(*tasks, return_exceptions=True)
        self._progress_event(force=True)

    async def _call_watched(self, kernel_id: str, func: str, **kwargs: Any) -> dict[str, Any]:
        """``kbridge.call`` raced against the kernel's death: a kernel whose process ends, or is
        replaced by a restart, can never answer, so the call ends at once (KernelDied) instead
        of waiting out its timeout."""
        km = self.serverapp.kernel_manager
        try:
            kernel = km.get_kernel(kernel_id)
        except KeyError:
            raise KernelDied("the kernel is not running") from None
        pid = _kernel_pid(kernel)
        call = asyncio.ensure_future(kbridge.call(self.serverapp, kernel_id, func, **kwargs))
        watch = asyncio.ensure_future(_watch_death(km, kernel_id, pid))
        try:
            done, _ = await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
            if call in done:
                if call.exception() is not None:
                    # A call that failed because the kernel went away says so.
                    why = await _death(km, kernel_id, pid)
                    if why:
                        raise KernelDied(why) from call.exception()
                return call.result()
            raise KernelDied(watch.result())
        finally:
            for task in (call, watch):
                if not task.done():
                    task.cancel()
            # Let the call's own clean-up (closing its client) run before going on.
            await asyncio.gather(call, watch, return_exceptions=True)

    async def _kernel_died(self, rec: KernelRecord, flight: Flight, why: str) -> StepError:
        """The truth about a kernel that died mid-checkpoint, and the way back it leaves."""
        offer = await asyncio.to_thread(self._offer_previous, [copy.copy(rec)], flight.id)
        if offer:
            last = offer["previous"][0]
            prev = (f"its last checkpoint is {last['checkpoint_id']} "
                    f"({_age_text(last.get('created'))})")
            hint = ("Its memory is gone. Resume to restore that checkpoint into it, or pause "
                    "again to checkpoint the kernels as they are now.")
        else:
            prev = "it has no earlier checkpoint"
            hint = "Its memory is gone and no earlier checkpoint of it exists; pause again."
        return StepError(f"the kernel of {rec.label} died during the checkpoint ({why}); {prev}",
                         reason="kernel_died", hint=hint, resume_from=offer)

    # ---------------------------------------------------------------- resume

    async def _run_resume(self, flight: Flight) -> None:
        t0 = time.monotonic()
        requested = utcnow_iso()
        step = "resuming"
        pause = copy.deepcopy(self.state.get("pause") or {})
        records = [KernelRecord.from_dict(k) for k in pause.get("kernels", [])]
        ctx = ResumeContext(
            flight_id=flight.id, trigger=flight.trigger, serverapp=self.serverapp,
            kernels=records, accelerator=dict(pause.get("accelerator") or self.app.accelerator),
            _report=self._backend_report, _progress=self._backend_progress, pause=pause,
        )
        outcomes: dict[str, dict[str, Any]] = {}
        marks: dict[str, float] = {}
        try:
            entry = await self._record("resume_requested", trigger=flight.trigger)
            requested = entry["at"]
            self._count_released(pause, requested)
            self._set_step("resuming", "Bringing the kernels back")
            await self.backend.resume(ctx)
            marks["resume_s"] = time.monotonic() - t0
            for rec in records:
                kid = ctx.kernel_map.get(rec.kernel_id)
                if kid:
                    self._watch_first_cell(flight, kid, rec)

            fresh: list[KernelRecord] = []
            if pause.get("mode") == "stop":
                # Stopped without a checkpoint: nothing to verify, nothing to restore, ever.
                for rec in records:
                    outcomes[rec.kernel_id] = _stopped_outcome(rec, ctx.kernel_map.get(
                        rec.kernel_id))
            else:
                step = "verifying"
                t1 = time.monotonic()
                self._set_step("verifying", "Checking whether the live kernels came back",
                               state="verifying")
                platform = await self.backend.restored_live(ctx)
                await asyncio.gather(*(self._verify(ctx, rec, outcomes) for rec in records))
                fresh = [r for r in records if outcomes[r.kernel_id]["outcome"] == "fresh"]
                why = getattr(self.backend, "restore_reason", None) if platform is False \
                    else None
                if why:
                    # Say why the live process did not come back (e.g. "pod was cold-started:
                    # snapshot for another GPU model ..."), not only that it did not.
                    for r in fresh:
                        prior = outcomes[r.kernel_id].get("reason")
                        outcomes[r.kernel_id]["reason"] = f"{why}; {prior}" if prior else why
                await self._record(
                    "verified", platform_live=platform, restore_reason=why,
                    outcome="live" if all(o["outcome"] == "live" for o in outcomes.values())
                    else "fresh",
                    kernels=[{"path": r.path, "kernel_id": ctx.kernel_map.get(r.kernel_id),
                              "live": outcomes[r.kernel_id]["outcome"] == "live"}
                             for r in records],
                )
                marks["verify_s"] = time.monotonic() - t1

            if fresh:
                step = "restoring"
                t2 = time.monotonic()
                await self._restore_all(ctx, fresh, outcomes)
                restored_bytes = sum(o.get("bytes", 0) for o in outcomes.values())
                await self._record(
                    "restored", bytes=restored_bytes,
                    kernels=[{"path": r.path, "outcome": outcomes[r.kernel_id]["outcome"],
                              "checkpoint_id": r.checkpoint_id} for r in fresh])
                marks["restore_s"] = time.monotonic() - t2
            step = "attaching"
            await self.backend.attach(ctx)
            failed = [r for r in records if outcomes[r.kernel_id]["outcome"] == "failed"]
            if failed:
                first = outcomes[failed[0].kernel_id]
                raise StepError(f"restore of {failed[0].label} failed: {first.get('reason')}",
                                reason="restore_error",
                                hint="The checkpoint is still there: resume again to retry.")
            usable = await self._record("kernel_usable")
            kinds = {o["outcome"] for o in outcomes.values()}
            outcome = ("live" if kinds == {"live"} else "restored" if "restored" in kinds
                       else "fresh")
            marks["total_s"] = time.monotonic() - t0
            report = self._report(flight, "ok", requested, usable["at"], records, ctx, outcomes,
                                  marks, outcome)
            self.step = None
            await self._record("ready", outcome=outcome, report=report)
            metrics.RESUME_DURATION.labels(self.app.backend_name, outcome).observe(
                time.monotonic() - t0)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - every failure is journaled
            marks["total_s"] = time.monotonic() - t0
            report = self._report(flight, "failed", requested, None, records, ctx, outcomes,
                                  marks, "failed")
            await self._fail(flight, step, e, state_after="failed", report=report)
        finally:
            self.step = None
            if self.flight is flight:
                self.flight = None

    def _count_released(self, pause: dict[str, Any], requested: str) -> None:
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
                self.app.backend_name, str(acc.get("type") or "unknown")).inc(seconds * count)

    async def _verify(self, ctx: ResumeContext, rec: KernelRecord,
                      outcomes: dict[str, dict[str, Any]]) -> None:
        kid = ctx.kernel_map.get(rec.kernel_id)
        out: dict[str, Any] = {"kernel_id": kid, "outcome": "fresh", "reason": None}
        outcomes[rec.kernel_id] = out
        if not kid:
            out.update(outcome="failed", reason="no kernel came back for this notebook")
            return
        # A kernel busy with %resume restores itself in that cell: let it finish, so liveness
        # sees "restored" and the server never restores a second time over it.
        await kbridge.wait_idle(self.serverapp, kid, self.app.bridge_timeout)
        try:
            # retries=1: an unanswered liveness call is sent once more on a new connection
            # before we give up. A kernel that still answers neither may be alive and busy with
            # the person's memory in it: it is never restored over (that could overwrite live
            # work); it is reported failed, and Resume again verifies it afresh.
            res = await kbridge.call(self.serverapp, kid, "liveness", retries=1,
                                     timeout=self.app.liveness_timeout)
        except Exception as e:  # noqa: BLE001 - no answer: neither live nor safely restorable
            out.update(outcome="failed", reason=f"the kernel did not answer the liveness "
                       f"check ({e})")
            return
        if res.get("ok") is False:
            out["reason"] = f"liveness check failed ({res.get('error')}); treating it as fresh"
            return
        token = res.get("token")
        restored = res.get("restored") or None
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

    async def _restore_all(self, ctx: ResumeContext, fresh: list[KernelRecord],
                           outcomes: dict[str, dict[str, Any]]) -> None:
        done: dict[str, int] = {}
        totals: dict[str, int] = {}
        self._set_step("restoring", "Restoring from the checkpoint", state="restoring")

        def progress_for(rec: KernelRecord) -> Any:
            def progress(d: int, t: int, *_: Any) -> None:
                done[rec.kernel_id], totals[rec.kernel_id] = int(d), int(t)
                self.step = {"name": "restoring", "done": sum(done.values()),
                             "total": sum(totals.values()), "message": f"Restoring {rec.label}"}
                self._progress_event()
            return progress

        async def one(rec: KernelRecord) -> None:
            out = outcomes[rec.kernel_id]
            kid = out["kernel_id"]
            if not kid:
                return
            try:
                res = await self._call_watched(
                    kid, "restore", progress=progress_for(rec),
                    timeout=self.app.bridge_timeout, store_url=self.app.store_url or None,
                    key_path=self.app.key_path or None, stream=rec.stream,
                    checkpoint_id=rec.checkpoint_id, device=self.app.restore_device, only=None,
                )
            except KernelDied as e:  # at once, not after bridge_timeout
                out.update(outcome="failed", reason=f"the kernel died during the restore ({e})")
                return
            except Exception as e:  # noqa: BLE001 - reported per kernel
                out.update(outcome="failed", reason=str(e))
                return
            if not res.get("ok"):
                out.update(outcome="failed", reason=str(res.get("error") or "unknown error"))
                return
            variables = list(res.get("variables") or [])
            out.update(outcome="restored", variables=variables,
                       warnings=list(res.get("warnings") or []),
                       checkpoint_id=res.get("checkpoint_id") or rec.checkpoint_id,
                       reason="restored from checkpoint (the live process did not come back: "
                       f"{out.get('reason') or 'fresh kernel'})",
                       bytes=sum(int(v.get("size") or 0) for v in variables
                                 if v.get("status") == "restored"))
            metrics.FALLBACK_RESTORES.labels(self.app.backend_name).inc()

        await asyncio.gather(*(one(r) for r in fresh))

    def _report(self, flight: Flight, status: str, requested: str, usable: str | None,
                records: list[KernelRecord], ctx: ResumeContext,
                outcomes: dict[str, dict[str, Any]], marks: dict[str, float],
                outcome: str) -> dict[str, Any]:
        kernels = []
        for rec in records:
            out = outcomes.get(rec.kernel_id, {"outcome": "failed", "reason": "not verified"})
            if out["outcome"] == "live":
                variables = [{**_variable(v), "status": "live"} for v in rec.variables
                             if v.get("status") == "saved"]
                variables += [_variable(v) for v in rec.variables if v.get("status") != "saved"]
            else:
                variables = [_variable(v) for v in out.get("variables", [])]
            kernels.append({
                "path": rec.path, "kernel_id": ctx.kernel_map.get(rec.kernel_id),
                "previous_kernel_id": rec.kernel_id, "outcome": out["outcome"],
                "reason": out.get("reason"),
                "checkpoint_id": out.get("checkpoint_id") or rec.checkpoint_id,
                "warnings": out.get("warnings", []), "variables": variables,
            })
        return {
            "flight_id": flight.id, "outcome": outcome, "requested": requested, "usable": usable,
            "first_cell": None, "trigger": flight.trigger,
            "durations": {k: round(v, 3) for k, v in marks.items()}, "kernels": kernels,
        }

    def _watch_first_cell(self, flight: Flight, kernel_id: str, rec: KernelRecord) -> None:
        async def watch() -> None:
            try:
                if await kbridge.wait_first_execute(self.serverapp, kernel_id,
                                                    self.app.first_cell_watch):
                    for task in self._watchers:
                        if task is not asyncio.current_task():
                            task.cancel()
                    await self._record("first_cell_ran", flight=flight, path=rec.path,
                                       kernel_id=kernel_id)
            except asyncio.CancelledError:
                pass
            except Exception as e:  # noqa: BLE001
                self.log.debug("jupyter_pause: first-cell watch ended: %s", e)

        self._watchers.append(asyncio.ensure_future(watch()))

    # ---------------------------------------------------------------- failure and backends

    async def _fail(self, flight: Flight, step: str, exc: Exception, *, state_after: str,
                    report: dict[str, Any] | None = None, persist: bool = True) -> None:
        reason = getattr(exc, "reason", None) or (
            "timeout" if isinstance(exc, asyncio.TimeoutError) else "other")
        message = str(exc) or exc.__class__.__name__
        hint = getattr(exc, "hint", None)
        resume_from = getattr(exc, "resume_from", None)
        if flight.kind == "pause" and state_after == "failed" and reason != "kernel_died":
            hint = f"{PAUSE_FAILED_SAFE} {hint or 'Pause again to retry.'}"
        if not isinstance(exc, (StepError, BackendError)):
            self.log.exception("jupyter_pause: %s failed during %s", flight.kind, step)
            message = f"{step} failed: {message}"
        metrics.FAILURES.labels(self.app.backend_name, flight.kind,
                                metrics.failure_reason(reason)).inc()
        fields: dict[str, Any] = {"step": step, "reason": reason, "message": message,
                                  "hint": hint, "state_after": state_after}
        if report is not None:
            fields["report"] = report
        if resume_from and flight.kind == "pause" and state_after == "failed":
            fields["resume_from"] = resume_from
        self.step = None
        if persist:
            await self._record("failed", flight=flight, **fields)
        else:
            await self._note("failed", **fields)

    def _backend_report(self, event: str, **fields: Any) -> asyncio.Task:
        return asyncio.ensure_future(self._record(event, **fields))

    def _backend_progress(self, message: str) -> None:
        name = self.step["name"] if self.step else self.state["state"]
        self._set_step(name, message)

    # ---------------------------------------------------------------- activity (policy input)

    async def sample_activity(self) -> None:
        """Journal kernel activity at most once per call (the app calls it once a minute)."""
        km = self.serverapp.kernel_manager
        ids = list(km.list_kernel_ids())
        busy = sum(1 for k in ids if kbridge.execution_state(self.serverapp, k) == "busy")
        last = getattr(km, "last_kernel_activity", None)
        if busy == 0 and last == self._activity_seen:
            return
        self._activity_seen = last
        connections = sum(getattr(km, "_kernel_connections", {}).get(k, 0) for k in ids)
        await self._record("activity", flight=False, busy_kernels=busy, connections=connections,
                           kernels=len(ids))


def _open_store(app: PauseApp) -> Any:
    """The configured store with its key: listings hold authentic checkpoints only."""
    from ..checkpoint import load_or_create_key, open_store

    url = app.store_url or None
    return open_store(url, key=load_or_create_key(app.key_path or None, store=open_store(url)))


def _kernel_pid(kernel: Any) -> int | None:
    provisioner = getattr(kernel, "provisioner", None)
    pid = getattr(provisioner, "pid", None)
    return pid if isinstance(pid, int) else None


async def _death(km: Any, kernel_id: str, pid: int | None) -> str | None:
    """Why the kernel that ran as ``pid`` can no longer answer, or None while it can."""
    try:
        kernel = km.get_kernel(kernel_id)
    except KeyError:
        return "the kernel was shut down"
    now = _kernel_pid(kernel)
    if pid is not None and now is not None and now != pid:
        return "its process ended and jupyter_server restarted it empty"
    if getattr(kernel, "execution_state", None) in ("dead", "restarting"):
        return "its process ended"
    try:
        alive = await ensure_async(kernel.is_alive())
    except Exception:  # noqa: BLE001 - a provisioner that cannot tell: assume alive
        alive = True
    return None if alive else "its process ended"


async def _watch_death(km: Any, kernel_id: str, pid: int | None) -> str:
    while True:
        try:
            why = await _death(km, kernel_id, pid)
        except Exception:  # noqa: BLE001 - a watcher that cannot tell must not fail the call
            why = None
        if why:
            return why
        await asyncio.sleep(KERNEL_WATCH_INTERVAL)


def _age_text(created: str | None) -> str:
    try:
        seconds = max(0.0, (datetime.now(timezone.utc) - parse_iso(str(created))).total_seconds())
    except (TypeError, ValueError):
        return "of unknown age"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''} old"
    return f"{int(seconds)} s old"


def _offer_text(offer: dict[str, Any]) -> str:
    items = [f"{p.get('path') or p.get('stream')}: checkpoint {p.get('checkpoint_id')}, "
             f"{_age_text(p.get('created'))}" for p in offer.get("previous") or []]
    return "previous checkpoints: " + "; ".join(items)


def _resume_from(pause: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a resume would restore, with each checkpoint's age (for the UI)."""
    if not pause:
        return None
    if not pause.get("offered"):
        return {"offered": False, "checkpoints": [
            {"path": k.get("path"), "checkpoint_id": k.get("checkpoint_id")}
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


def _stopped_status(stopped: dict[str, Any] | None) -> dict[str, Any] | None:
    """The last server stop for status: per notebook saved or not (and why), what waits."""
    if not stopped:
        return None
    keys = ("flight_id", "trigger", "hub", "requested", "at", "interrupted", "budget_s", "pending")
    return {**{k: stopped.get(k) for k in keys},
            "kernels": [{k: r.get(k) for k in ("path", "status", "reason", "checkpoint_id",
                                                "previous_checkpoint", "seconds")}
                        for r in stopped.get("rows") or []]}


def _stopped_outcome(rec: KernelRecord, kernel_id: str | None) -> dict[str, Any]:
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


def _variable(v: dict[str, Any]) -> dict[str, Any]:
    status = v.get("status")
    cell = v.get("cell")
    return {
        "name": v.get("name"), "kind": v.get("kind"), "size": v.get("size"), "status": status,
        "reason": v.get("reason"), "cell": cell,
        "recomputable": bool(cell) and status in ("skipped", "stale", "failed"),
    }
