"""The workspace's pause/resume lifecycle: one flight at a time, every transition journaled.

The façade the REST handlers, the idle policy and the server's stop go through. The state and
its transitions are :mod:`.state` (recorded by :mod:`.recorder`), the flights :mod:`.pause`,
:mod:`.resume` and :mod:`.shutdown`, start-up recovery :mod:`.recovery`, and what status and the
report serve :mod:`.pausereport`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..checkpoint import gc as store_gc
from ..checkpoint import open_store
from ..journal import utcnow_iso
from ..variables import as_row
from ..vocabulary import PAUSE_MODES
from . import bridge, checkpointable, metrics, recovery
from .activity import kernel_activity, wait_first_execute
from .kernelguard import own_starts
from .kernelside import ask_kernel_side, kernel_side_of
from .pause import run_pause
from .pausereport import resume_from_status, stopped_status
from .recorder import Flight, Recorder
from .resume import run_resume

if TYPE_CHECKING:
    from .app import PauseApp

# Unreferenced blobs younger than this survive the start-up clean-up (a writer of another
# process may still publish them); temp files of dead writers go whatever their age.
STORE_GC_GRACE_S = 3600.0
# How long POST pause waits for each idle kernel to say whether it can be checkpointed (all
# asked together). A kernel that has not answered by then is checked again by the flight.
PAUSE_PRECHECK_WAIT = 10.0


class Refusal(Exception):
    """A request that cannot be accepted now: HTTP ``status`` with a one-line message."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


class LosesState(Refusal):
    """A pause refused because it would lose the state of kernels that cannot be checkpointed
    and that the request did not name in ``lose_state``; nothing was changed."""

    def __init__(self, kernels: list[checkpointable.Uncheckpointable]):
        super().__init__(checkpointable.refusal_message(kernels), 409)
        self.kernels = kernels


class Lifecycle(Recorder):
    """Owns flights, the journal and the state; handlers and backends go through it."""

    def __init__(self, app: PauseApp):
        super().__init__(app)
        self._watchers: list[asyncio.Task] = []
        self._platform_watch: asyncio.Future | None = None  # the backend's own pauses
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
        self._asking: set[str] = set()  # kernels asked what their side of the bridge is
        self._side_tasks: set[asyncio.Task] = set()

    @property
    def backend(self) -> Any:
        return self.app.backend_instance

    # ---------------------------------------------------------------- start-up and stop

    def load(self) -> None:
        """Rebuild the state from the journal and settle interrupted flights (blocking)."""
        recovery.load(self)

    async def start(self) -> None:
        """After the event loop runs: resume verification for a workspace that came back."""
        self._refresh_backend_desc()
        self._cleanup = asyncio.ensure_future(self._clean_store_temps())
        watch = getattr(self.backend, "watch_platform_pause", None)
        if watch is not None:  # the platform may pause by itself (cluster/workspaces.py)
            self._platform_watch = asyncio.ensure_future(watch(self._platform_pause))
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

    async def _platform_pause(self, trigger: str) -> None:
        """The platform began a pause of its own: take the pause path (checkpoint first)."""
        try:
            await self.request_pause(trigger)
        except Refusal as e:
            self.log.info("jupyter_pause: %s began a pause; not joined: %s", trigger, e)

    async def stop(self) -> None:
        if self._platform_watch is not None:
            self._platform_watch.cancel()
        for task in [*self._watchers, *self._side_tasks]:
            task.cancel()
        if self._cleanup is not None:
            self._cleanup.cancel()
        if self.flight and self.flight.task:
            self.flight.task.cancel()
        self.close()

    # ---------------------------------------------------------------- status

    async def status(self) -> dict[str, Any]:
        """``GET status``: where the workspace stands, the flight, the kernels, the reports."""
        self._refresh_backend_desc()
        st = self.state
        kernels = []
        try:
            for rec in await bridge.running_kernels(self.serverapp):
                state = bridge.execution_state(self.serverapp, rec.kernel_id)
                km = self.serverapp.kernel_manager
                side = kernel_side_of(km.get_kernel(rec.kernel_id)) \
                    if rec.kernel_id in km else None  # gone since it was listed
                if side and side.installed is None and side.language == "python" \
                        and state == "idle":
                    self._ask_kernel_side(rec.kernel_id)
                kernels.append({"id": rec.kernel_id, "name": rec.kernel_name, "path": rec.path,
                                "execution_state": state,
                                "kernel_side": side.to_dict() if side else None})
        except Exception as e:  # noqa: BLE001
            self.log.debug("jupyter_pause: listing kernels failed: %s", e)
        return {
            # the newest event this answer includes: older events must not overwrite it
            "seq": self.event_seq,
            "state": st["state"], "outcome": st.get("outcome"), "step": self.step,
            "reason": st.get("reason"), "hint": st.get("hint"),
            "flight": self.flight.to_dict() if self.flight else None,
            "timeline": st.get("timeline", []), "backend": dict(self._backend_desc),
            "kernels": kernels, "last_checkpoint": st.get("last_checkpoint"),
            "last_report": st.get("last_report"),
            # What POST resume would bring back now (the UI's one action after a failure).
            "resume_available": self.can_resume() and self.flight is None,
            "resume_from": resume_from_status(st.get("pause")),
            "stopped": stopped_status(st.get("stopped")),
            # Lines of journal.jsonl skipped at start (each named in the server's log).
            "journal": {"skipped_lines": self.journal.skipped_lines},
        }

    def _ask_kernel_side(self, kernel_id: str) -> None:
        """Learn in the background what an idle kernel has on its side of the bridge, so that
        status names a missing kernel side before a pause fails on it. Never during a flight
        or the server's stop (their own calls learn it), at most one question per kernel at a
        time."""
        if self.flight is not None or self.stopping or kernel_id in self._asking:
            return
        self._asking.add(kernel_id)

        async def ask() -> None:
            try:
                await ask_kernel_side(self.serverapp, kernel_id, timeout=10)
            except Exception as e:  # noqa: BLE001 - asked again at the next status
                self.log.debug("jupyter_pause: asking kernel %s failed: %s", kernel_id[:8], e)
            finally:
                self._asking.discard(kernel_id)

        task = asyncio.ensure_future(ask())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def _refresh_backend_desc(self) -> None:
        # Never pause with a half-applied config (another store) or a value found invalid at
        # start: the resume would be the first to refuse it, with the kernels already gone.
        refusal = self.app.refusal("pause")
        if refusal:
            self._backend_desc = {"name": self.app.backend_name, "configured": False,
                                  "can_pause": False, "why_not": f"{refusal}; "
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

    async def checked_pause(self, trigger: str = "manual", interrupt: bool = False,
                            mode: str = "pause",
                            lose_state: checkpointable.LoseState = (),
                            busy: Iterable[str] = ()) -> Flight:
        """:meth:`request_pause` after asking the kernels whether they can be checkpointed:
        :class:`LosesState` (nothing changed) when one cannot and ``lose_state`` does not
        allow it. The flight checks again once the kernels are idle (a busy kernel is not
        asked here: it may be running the ``%pause`` that sent this request; ``busy`` names
        the one that says so, whatever jupyter_server has heard of its state yet). A kernel
        that does not answer in :data:`PAUSE_PRECHECK_WAIT` is left to the flight's check."""
        if mode == "pause" and self.flight is None:
            try:
                records = await bridge.running_kernels(self.serverapp)
            except Exception as e:  # noqa: BLE001 - the flight lists them again, and says why
                self.log.debug("jupyter_pause: listing kernels before a pause failed: %s", e)
                records = []
            found = await checkpointable.find(
                self.serverapp, records, min(self.app.liveness_timeout, PAUSE_PRECHECK_WAIT),
                skip_busy=True, busy=frozenset(busy))
            refused = [u for u in found if not checkpointable.allowed(u, lose_state)]
            if refused and self.flight is None:
                raise LosesState(refused)
        return await self.request_pause(trigger, interrupt, mode, lose_state=lose_state)

    async def request_pause(self, trigger: str = "manual", interrupt: bool = False,
                            mode: str = "pause",
                            lose_state: checkpointable.LoseState = ()) -> Flight:
        """Start (or join) a pause. ``mode="stop"`` shuts the kernels down without a checkpoint
        or snapshot (the idle policy's stop profiles): files stay, memory does not, and the
        resume starts fresh kernels. ``lose_state``: the kernels that cannot be checkpointed
        and may be shut down without one (ids, or True for all); any other such kernel fails
        the pause before anything is changed (:mod:`.checkpointable`)."""
        # No await before self.flight is set: concurrent requests must see each other.
        if mode not in PAUSE_MODES:
            raise Refusal(f"unknown pause mode {mode!r} (expected pause or stop)", 400)
        self._refuse_while_stopping("pause")
        if self.flight is not None:
            if self.flight.kind == "pause":
                return self.flight
            raise Refusal("a resume is in progress; pause again when it has finished")
        if self.can_resume() and not (self.state.get("pause") or {}).get("offered"):
            if self.state["state"] != "failed":
                raise Refusal("the workspace is already paused; resume it first")
            # A resume that failed left kernels in use: pausing them is a way out of failed.
            # The notebooks it did not bring back keep their paused checkpoint (run_pause).
            if not list(self.serverapp.kernel_manager.list_kernel_ids()):
                raise Refusal("the last resume failed and no kernel runs: resume again (see "
                              "the reason and hint of the failure)")
        desc = self._backend_desc
        if not desc.get("can_pause", True):
            raise Refusal(f"pausing is not possible here: {desc.get('why_not') or 'backend'}")
        flight = self.new_flight("pause", trigger)
        flight.task = asyncio.ensure_future(run_pause(
            self, flight, interrupt or self.app.interrupt_busy, mode, lose_state=lose_state))
        return flight

    async def request_resume(self, trigger: str = "manual") -> Flight:
        """Start (or join) a resume of the paused workspace."""
        self._refuse_while_stopping("resume")
        if self.flight is not None:
            if self.flight.kind == "resume":
                return self.flight
            raise Refusal("a pause is in progress; resume when it has finished")
        if not self.can_resume():
            raise Refusal("the workspace is not paused; there is nothing to resume")
        refusal = self.app.refusal("resume")  # e.g. its checkpoints are in another store
        if refusal:
            raise Refusal(f"resuming is not possible: {refusal}; fix it and restart the server")
        flight = self.new_flight("resume", trigger)
        with own_starts():  # the resume's kernel starts are the only ones allowed now
            flight.task = asyncio.ensure_future(run_resume(self, flight))
        return flight

    def _refuse_while_stopping(self, what: str) -> None:
        if self.stopping or (self.flight is not None and self.flight.kind == "stop"):
            raise Refusal(f"the server is stopping (its kernels are being checkpointed); {what} "
                          "after it has started again", 503)
        if self.restoring_after_stop:
            raise Refusal(f"{', '.join(sorted(self.restoring_after_stop))} is being restored "
                          f"after the server was stopped; {what} when it has finished")

    def new_flight(self, kind: str, trigger: str) -> Flight:
        """The flight under way from now on (a pause, resume or server stop)."""
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

    async def record_recompute(self, path: str, kernel_id: str,
                               variables: list[dict[str, Any]]) -> None:
        """Journal a POST recompute's outcome; ``apply`` marks it in ``last_report`` (persisted
        with state.json) and the event makes the UI re-read the report."""
        await self.record("recomputed", flight=False, path=path, kernel_id=kernel_id,
                          variables=[as_row(v) for v in variables])

    # ---------------------------------------------------------------- after a resume

    def watch_first_cell(self, flight: Flight, kernel_id: str, path: str | None) -> None:
        """Journal ``first_cell_ran`` when the person first runs a cell in a resumed kernel."""
        async def watch() -> None:
            try:
                if await wait_first_execute(self.serverapp, kernel_id,
                                            self.app.first_cell_watch):
                    for task in self._watchers:
                        if task is not asyncio.current_task():
                            task.cancel()
                    await self.record("first_cell_ran", flight=flight, path=path,
                                      kernel_id=kernel_id)
            except asyncio.CancelledError:
                pass
            except Exception as e:  # noqa: BLE001
                self.log.debug("jupyter_pause: first-cell watch ended: %s", e)

        self._watchers.append(asyncio.ensure_future(watch()))

    # ---------------------------------------------------------------- activity (policy input)

    async def sample_activity(self) -> None:
        """Journal kernel activity at most once per call (the app calls it once a minute)."""
        now = kernel_activity(self.serverapp)
        if now["busy_kernels"] == 0 and now["last"] == self._activity_seen:
            return
        self._activity_seen = now["last"]
        await self.record("activity", flight=False, busy_kernels=now["busy_kernels"],
                          connections=now["connections"], kernels=now["kernels"])
