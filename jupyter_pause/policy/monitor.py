"""Auto-pause inside the server: watch the kernels, announce, and pause through the Lifecycle.

``IdleMonitor`` is the glue between the pure rules (:mod:`.idle`) and the running server. It
reads kernel state from jupyter_server's kernel manager (no polling of the kernels themselves),
asks the kernels about ``%pause --never`` only when about to act, and goes through the same
``Lifecycle.request_pause(trigger="idle")`` as the Pause button, so an auto-pause is journaled,
reported and resumable like any other. The clock is injectable for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from traitlets.config import LoggingConfigurable

from ..journal import iso
from ..server import bridge, checkpointable
from .idle import AutoPauser, Decision, KernelView, Observation
from .profiles import IdlePolicy


def _ts(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    return None


class IdleMonitor(LoggingConfigurable):
    """One per server. ``start()`` after the Lifecycle started; ``await stop()`` at shutdown."""

    def __init__(self, *, app: Any, lifecycle: Any, clock: Callable[[], float] = time.time,
                 policy: IdlePolicy | None = None, env: dict | None = None, **kwargs: Any):
        super().__init__(parent=app, **kwargs)
        self.app = app
        self.lifecycle = lifecycle
        self.clock = clock
        self.policy = policy or IdlePolicy(parent=app)
        if self.policy.config_problems:  # never auto-pause on values nobody chose
            raise ValueError("invalid configuration: " + "; ".join(self.policy.problem_lines()))
        accel = getattr(app, "accelerator", None) or {}
        self.profile, self.why, self.workload = self.policy.resolve(
            env, accelerator_count=int(accel.get("count") or 0))
        self.pauser = AutoPauser(self.profile, clock())
        self.last_decision: Decision | None = None
        self.last_observation: Observation | None = None
        # kid -> (last_activity, never, checkpointable, why): what the last probe found
        self._never: dict[str, tuple[float | None, bool, bool, str]] = {}
        self._runnable = True
        self._task: asyncio.Task | None = None
        self._tick_lock = asyncio.Lock()

    # ------------------------------------------------------------------ observation

    @property
    def serverapp(self) -> Any:
        return self.app.serverapp

    async def look(self) -> Observation:
        km = self.serverapp.kernel_manager
        paths: dict[str, str] = {}
        try:
            for s in await self.serverapp.session_manager.list_sessions():
                kid = (s.get("kernel") or {}).get("id")
                if kid:
                    paths.setdefault(kid, s.get("path"))
        except Exception as e:  # noqa: BLE001 - a session row may vanish mid-listing
            self.log.debug("jupyter_pause policy: sessions unavailable: %s", e)
        conns = getattr(km, "_kernel_connections", {})
        kernels, total = [], 0
        for kid in list(km.list_kernel_ids()):
            try:
                k = km.get_kernel(kid)
            except KeyError:
                continue
            last = _ts(getattr(k, "last_activity", None))
            never = self._never.get(kid)
            known = never if never is not None and never[0] == last else None
            kernels.append(KernelView(
                id=kid, execution_state=getattr(k, "execution_state", "idle"), last_activity=last,
                path=paths.get(kid), never_pause=known[1] if known else None,
                checkpointable=known[2] if known else None, why=known[3] if known else "",
                kernel=getattr(k, "kernel_name", None)))
            total += int(conns.get(kid, 0))
        settings = getattr(self.serverapp, "web_app", None)
        term = _ts(settings.settings.get("terminal_last_activity")) if settings else None
        return Observation(kernels=kernels, connections=total, terminal_last_activity=term)

    async def _probe_never(self, obs: Observation) -> None:
        """Ask each kernel whether ``%pause --never`` is on, and whether a pause can checkpoint
        it (only before announcing or firing)."""
        async def one(k: KernelView) -> None:
            if k.never_pause is not None:
                return
            side = await checkpointable.side_of(self.serverapp, k.id,
                                                self.policy.probe_timeout)
            k.checkpointable, k.why = side.checkpointable, side.why
            if not side.checkpointable:  # nothing more to ask (and never in its language)
                k.never_pause = False
                self._never[k.id] = (k.last_activity, False, False, side.why)
                return
            try:
                # bridge.call keeps the probe out of the activity record (not_activity)
                res = await bridge.call(self.serverapp, k.id, "liveness",
                                        timeout=self.policy.probe_timeout)
                k.never_pause = bool(res.get("ok") and res.get("never_pause"))
            except Exception as e:  # noqa: BLE001 - no answer cannot opt out
                self.log.debug("jupyter_pause policy: probe of %s failed: %s", k.id, e)
                k.never_pause = False
            self._never[k.id] = (k.last_activity, k.never_pause, True, "")

        await asyncio.gather(*(one(k) for k in obs.kernels))

    # ------------------------------------------------------------------ decisions

    def _lifecycle_runnable(self) -> bool:
        lc = self.lifecycle
        return getattr(lc, "flight", None) is None and not lc.can_resume()

    async def tick(self) -> Decision:
        """One check; the periodic loop calls it, tests call it with a fake clock."""
        async with self._tick_lock:
            now = self.clock()
            runnable = self._lifecycle_runnable()
            if runnable and not self._runnable:
                self.pauser.reset(now)  # a flight just ended: the idle clock starts again
            self._runnable = runnable
            obs = await self.look()
            if runnable and self.pauser.needs_probe(obs, now):
                await self._probe_never(obs)
            self.last_observation = obs
            d = self.pauser.step(obs, now, can_pause=runnable)
            self.last_decision = d
            if d.kind == "announce":
                self.log.info("jupyter_pause: auto-pause announced: %s", d.reason)
                self._record("auto_pause_announced", profile=self.profile.name,
                             action=self.profile.action, reason=d.reason,
                             deadline=iso(d.deadline or now), connections=obs.connections)
            elif d.kind == "cancel":
                self.log.info("jupyter_pause: auto-pause cancelled: %s", d.reason)
                self._record("auto_pause_cancelled", by="activity", reason=d.reason)
            elif d.kind == "fire":
                await self._fire(d)
            return d

    async def _fire(self, d: Decision) -> None:
        self.log.info("jupyter_pause: auto-pause: %s", d.reason)
        request = self.lifecycle.request_pause
        kwargs: dict[str, Any] = {"trigger": "idle"}
        if self.profile.action == "stop":
            if "mode" in inspect.signature(request).parameters:
                kwargs["mode"] = "stop"
            else:  # a full pause is the safe fallback: it only costs a checkpoint
                self.log.info("jupyter_pause: the lifecycle has no 'stop' mode; pausing instead")
        elif self.profile.uncheckpointable == "pause_anyway":
            # The profile's answer to "pause anyway?": such kernels lose their state, named
            # in the journal and the report. With "skip", the pause refuses any it finds.
            kwargs["lose_state"] = True
        try:
            await request(**kwargs)
        except Exception as e:  # noqa: BLE001 - Refusal etc.: watch again
            self.log.warning("jupyter_pause: auto-pause not started: %s", e)
            self.pauser.reset(self.clock())
        self._runnable = False

    def cancel(self, reason: str = "cancelled by the user") -> Decision | None:
        d = self.pauser.cancel(self.clock(), reason)
        if d is not None:
            self.last_decision = d
            self._record("auto_pause_cancelled", by="user", reason=reason)
        return d

    def _record(self, event: str, **fields: Any) -> None:
        record = getattr(self.lifecycle, "record_event", None)
        if record is None:
            return
        try:
            record(event, **fields)
        except Exception as e:  # noqa: BLE001 - the journal is the server's
            self.log.warning("jupyter_pause: cannot journal %s: %s", event, e)

    # ------------------------------------------------------------------ status for GET policy

    def status(self) -> dict[str, Any]:
        now = self.clock()
        p = self.pauser
        obs = self.last_observation
        verdict = p.last_verdict.to_dict() if p.last_verdict else None
        if verdict:
            for key in ("since", "eligible_at"):
                if verdict[key] is not None:
                    verdict[key] = iso(verdict[key])
        d = self.last_decision
        return {
            "enabled": bool(self.policy.enabled),
            "profile": self.profile.to_dict(),
            "why": self.why,
            "workload": self.workload.to_dict(),
            # watching | announced | firing; "inactive" while paused or a flight runs
            "state": ("disabled" if not self.policy.enabled else
                      p.state if self._lifecycle_runnable() else "inactive"),
            "deadline": iso(p.deadline) if p.deadline else None,
            "seconds_left": max(0.0, p.deadline - now) if p.deadline else None,
            "cancellable": p.state == "announced",
            "idle": verdict,
            "connections": obs.connections if obs else None,
            # the kernels a pause could not checkpoint, as the last probe found them
            "uncheckpointable": [{"kernel_id": k.id, "path": k.path, "kernel": k.kernel,
                                  "why": k.why} for k in (obs.uncheckpointable if obs else [])],
            "last_decision": {"kind": d.kind, "reason": d.reason} if d else None,
            "interval": self.policy.interval,
        }

    # ------------------------------------------------------------------ loop

    def start(self) -> None:
        if not self.policy.enabled or self._task is not None:
            return
        self.log.info("jupyter_pause: auto-pause on, profile %s (%s): %s after %d s idle",
                      self.profile.name, self.why, self.profile.action, self.profile.idle_after)
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("jupyter_pause: idle check failed")
            wait = self.policy.interval
            if self.pauser.deadline is not None:  # hit the grace deadline on time
                wait = max(0.5, min(wait, self.pauser.deadline - self.clock()))
            await asyncio.sleep(wait)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
