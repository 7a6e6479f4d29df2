"""Flights, and the one way their events are recorded: journaled, folded into the state
(:func:`.state.apply`) and announced on the event bus, with the step in progress beside them."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..cluster.base import BackendError
from ..journal import Journal, utcnow_iso
from . import metrics
from .events import emit_lifecycle
from .state import apply, default_state

if TYPE_CHECKING:
    from .app import PauseApp

# A pause that failed with state "failed" never touched the kernels nor the checkpoints before
# it (a checkpoint becomes visible only once complete): the person must read that, not guess.
PAUSE_FAILED_SAFE = "Your kernels are untouched and the last good checkpoint is intact."


@dataclass
class Flight:
    """One pause, resume or server stop under way (its task runs it)."""

    id: str
    kind: str  # "pause" | "resume" | "stop"
    trigger: str
    started: str
    task: asyncio.Task | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "trigger": self.trigger, "started": self.started}


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


class Recorder:
    """The state, the flight and its step; every change of the state is a recorded event."""

    def __init__(self, app: PauseApp):
        self.app = app
        self.log = app.log
        self.journal = Journal(app.state_dir, log=app.log)
        self.state: dict[str, Any] = default_state()
        self.flight: Flight | None = None
        self.step: dict[str, Any] | None = None
        self._io = ThreadPoolExecutor(1, thread_name_prefix="jupyter-pause-journal")
        self._last_progress_emit = 0.0
        # Orders events against status reads (a page may get an event after a newer read);
        # from the clock, so it keeps growing across a server restart.
        self.event_seq = time.time_ns() // 1000

    @property
    def serverapp(self) -> Any:
        return self.app.serverapp

    def _entry(self, event: str, flight: Flight | str | None, kind: str | None,
               fields: dict[str, Any]) -> dict[str, Any]:
        flight_id = flight
        if isinstance(flight, Flight):
            flight_id, kind = flight.id, flight.kind
        entry = {"seq": self.journal.next_seq(), "at": utcnow_iso(), "flight": flight_id,
                 "kind": kind, "event": event, **fields}
        apply(self.state, entry)
        return entry

    async def record(self, event: str, *, flight: Flight | None | bool = True,
                     persist: bool = True, **fields: Any) -> dict[str, Any]:
        """Journal the event (durable before returning), fold it into the state, emit it.

        ``flight``: True for the flight under way, False/None for none. Without ``persist`` the
        event changes the state in memory only: for the moments nothing may be written to disk.
        """
        f = self.flight if flight is True else (flight or None)
        entry = self._entry(event, f, None, fields)
        if persist:
            snapshot = copy.deepcopy(self.state)
            loop = asyncio.get_running_loop()
            # One worker thread: journal lines and state.json are written in call order.
            journal_done = loop.run_in_executor(self._io, self.journal.append, entry)
            state_done = loop.run_in_executor(self._io, self.journal.save_state, snapshot)
            await journal_done
            await state_done
        self.emit(event)
        return entry

    def record_sync(self, event: str, flight: str | None, kind: str | None,
                    **fields: Any) -> dict[str, Any]:
        """Journal the event and fold it into the state, blocking: for start-up, before the
        event loop serves anything (nothing is emitted)."""
        entry = self._entry(event, flight, kind, fields)
        self.journal.append(entry)
        return entry

    def close(self) -> None:
        """Wait for the journal writes still queued (at server stop)."""
        self._io.shutdown(wait=True)

    def record_event(self, event: str, **fields: Any) -> asyncio.Task:
        """Journal an event outside a flight (policy: auto_pause_announced/cancelled)."""
        return asyncio.ensure_future(self.record(event, flight=False, **fields))

    def emit(self, event: str) -> None:
        """Tell the frontend (jupyter_server's event bus) where the workspace stands."""
        self.event_seq += 1
        emit_lifecycle(self.serverapp, {
            "seq": self.event_seq,
            "state": self.state["state"], "outcome": self.state.get("outcome"),
            "step": self.step, "reason": self.state.get("reason"),
            "flight_id": self.flight.id if self.flight else None, "event": event,
        })

    def set_step(self, name: str, message: str, done: int = 0, total: int = 0,
                 state: str | None = None) -> None:
        """The step in progress (and its bytes); progress events are throttled, a new
        in-memory sub-state (``state``) is announced at once."""
        self.step = {"name": name, "done": done, "total": total, "message": message}
        if state and state != self.state["state"]:
            self.state["state"] = state  # in-memory sub-step; the journal has the real events
            self.emit("progress")
            self._last_progress_emit = time.monotonic()
        else:
            self.progress()

    def kernels_progress(self, name: str, verb: str) -> Callable[[Any], Callable[..., None]]:
        """Progress callbacks, one per kernel record, summed into step ``name``: each reports
        its own bytes and the step names the kernel that reported last."""
        done: dict[str, int] = {}
        totals: dict[str, int] = {}

        def for_kernel(rec: Any) -> Callable[..., None]:
            def progress(d: int, t: int, *_: Any) -> None:
                done[rec.kernel_id], totals[rec.kernel_id] = int(d), int(t)
                self.set_step(name, f"{verb} {rec.label}", sum(done.values()),
                              sum(totals.values()))
            return progress

        return for_kernel

    def progress(self, force: bool = False) -> None:
        """Announce the step's progress, at most every ``progress_interval`` unless forced."""
        now = time.monotonic()
        if force or now - self._last_progress_emit >= self.app.progress_interval:
            self._last_progress_emit = now
            self.emit("progress")

    def backend_report(self, event: str, **fields: Any) -> asyncio.Task:
        """A backend's own event (``PauseContext.report``), journaled in the flight."""
        return asyncio.ensure_future(self.record(event, **fields))

    def backend_progress(self, message: str) -> None:
        """A backend's progress message (``PauseContext.progress``) for the current step."""
        name = self.step["name"] if self.step else self.state["state"]
        self.set_step(name, message)

    async def record_failure(self, flight: Flight, step: str, exc: BaseException, *,
                             state_after: str, report: dict[str, Any] | None = None,
                             persist: bool = True) -> None:
        """Journal a flight's failure, its reason and what the person can do."""
        reason = getattr(exc, "reason", None) or (
            "timeout" if isinstance(exc, asyncio.TimeoutError) else "other")
        message = str(exc) or exc.__class__.__name__
        hint = getattr(exc, "hint", None)
        resume_from = getattr(exc, "resume_from", None)
        if flight.kind == "pause" and state_after == "failed" and reason != "kernel_died":
            hint = f"{PAUSE_FAILED_SAFE} {hint or 'Pause again to retry.'}"
        if not isinstance(exc, (StepError, BackendError)):
            self.log.error("jupyter_pause: %s failed during %s", flight.kind, step)
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
        await self.record("failed", flight=flight, persist=persist, **fields)
