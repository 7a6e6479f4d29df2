"""HTTP routes of the platform tools, and the server hooks that start the idle monitor.

The server (``PauseApp.extension_modules``) calls ``get_handlers(app)`` when it builds its routes,
``await start(app)`` once the Lifecycle runs and ``await stop(app)`` at shutdown.

Routes (under ``<base_url>``; authenticated, XSRF-checked by APIHandler):
  GET  jupyter-pause/api/policy          auto-pause state (profile, idle verdict, countdown)
  POST jupyter-pause/api/policy/cancel   cancel an announced auto-pause (the person is here)
  GET  jupyter-pause/api/report          cost/capacity report (+ what-if with ?whatif=1)

(``POST jupyter-pause/api/gc`` is the server's route; it should call
``jupyter_pause.policy.gc.run_gc_for_app``.)

Reading these is not user activity (``_track_activity = False``), so a UI polling them does not
keep a workspace "active" for Kubeflow's or JupyterHub's cullers; cancelling is.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin

from ..server import validate as v
from ..units import parse_duration
from .journal import journal_path, parse_time, read_journal
from .monitor import IdleMonitor
from .report import build_report
from .whatif import DEFAULT_THRESHOLDS, measured_costs, simulate, trace_from_journal

MONITOR_KEY = "jupyter_pause_idle_monitor"


class _Base(ExtensionHandlerMixin, APIHandler):
    # jupyter_server's authorizer sees reads (GET) and writes (POST/DELETE) of this resource,
    # so a deployment can grant status to viewers and pause/resume to owners only.
    auth_resource = "jupyter_pause"

    def _json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))

    def _refuse(self, message: str, status: int = 409) -> None:
        self._json({"message": message}, status)

    async def prepare(self) -> None:
        await super().prepare()
        reason = getattr(self.extensionapp, "disabled_reason", None)
        # Another server holds the state directory: its journal is not this server's report.
        if reason and self.current_user and not self._finished:
            self._refuse(f"jupyter_pause is disabled in this server: {reason}", 503)

    @property
    def monitor(self) -> IdleMonitor | None:
        return self.settings.get(MONITOR_KEY)


class PolicyHandler(_Base):
    _track_activity = False

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        mon = self.monitor
        if mon is None:
            self._json({"enabled": False, "state": "disabled", "profile": None,
                        "cancellable": False})
            return
        self._json(mon.status())


class PolicyCancelHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        try:
            v.parse_body(self.request.body, v.EMPTY)
        except v.BadRequest as e:
            self._refuse(str(e), 400)
            return
        mon = self.monitor
        if mon is None or mon.cancel() is None:
            self._refuse("no auto-pause is announced; nothing to cancel")
            return
        self._json(mon.status())


def _query_time(value: str | None) -> float | None:
    return parse_time(value) if value else None


# GET report's query: every value bounded and typed before anything reads the journal.
REPORT_QUERY = frozenset({"period", "since", "until", "accelerators", "whatif", "thresholds",
                          "capture_s", "restore_s"})
_MAX_SECONDS = 1e10  # ~300 years: any real duration or timestamp


def check_report_args(args: dict[str, str]) -> dict[str, str]:
    """Raise ValueError (a 400) for unknown, oversized or non-finite query values."""
    unknown = sorted(set(args) - REPORT_QUERY)
    if unknown:
        raise ValueError(f"unknown query parameter {unknown[0][:40]!r}")
    for name in ("period", "since", "until", "whatif"):
        v.query_str(name, args.get(name), v.Field("str", max_len=64))
    v.query_str("thresholds", args.get("thresholds"), v.Field("str", max_len=1000))
    v.query_number("accelerators", args.get("accelerators"), minimum=0, maximum=1e6)
    for name in ("capture_s", "restore_s"):
        v.query_number(name, args.get(name), minimum=0, maximum=_MAX_SECONDS)
    for name in ("since", "until"):
        value = args.get(name)
        if value and not (math.isfinite(t := parse_time(value)) and abs(t) <= _MAX_SECONDS):
            raise ValueError(f"{name} must be a finite time")
    return args


def report_payload(state_dir: str, args: dict[str, str], now: float) -> dict[str, Any]:
    """Blocking (reads the journal): run it in a thread."""
    journal = read_journal(journal_path(state_dir))
    since, until = _query_time(args.get("since")), _query_time(args.get("until"))
    accelerators = float(args.get("accelerators") or 1)
    out: dict[str, Any] = {"report": build_report(
        journal, period=args.get("period") or "day", since=since,
        until=until if until is not None else now, accelerators=accelerators)}
    if args.get("whatif") not in (None, "", "0", "false"):
        raw = args.get("thresholds")
        thresholds = ([parse_duration(t) for t in raw.split(",")[:50] if t.strip()] if raw
                      else list(DEFAULT_THRESHOLDS))
        if not all(math.isfinite(t) and 0 <= t <= _MAX_SECONDS for t in thresholds):
            raise ValueError("thresholds must be finite durations")
        costs = measured_costs(journal)
        capture = float(args["capture_s"]) if args.get("capture_s") else costs["capture_s"] or 0
        restore = float(args["restore_s"]) if args.get("restore_s") else costs["restore_s"] or 0
        trace = trace_from_journal(journal, start=since, end=until if until is not None else now)
        out["whatif"] = simulate(trace, thresholds, capture_s=capture, restore_s=restore,
                                 accelerators=accelerators)
    return out


class ReportHandler(_Base):
    _track_activity = False

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        args = {k: self.get_argument(k) for k in self.request.arguments}
        state_dir = self.extensionapp.state_dir
        try:
            check_report_args(args)
            data = await asyncio.get_running_loop().run_in_executor(
                None, report_payload, state_dir, args, time.time())
        except ValueError as e:
            self._refuse(str(e), 400)
            return
        self._json(data)


def get_handlers(app: Any) -> list[tuple[str, type]]:
    return [
        (r"/jupyter-pause/api/policy", PolicyHandler),
        (r"/jupyter-pause/api/policy/cancel", PolicyCancelHandler),
        (r"/jupyter-pause/api/report", ReportHandler),
    ]


async def start(app: Any) -> None:
    """Create the idle monitor (always: GET policy explains the profile) and start it if on."""
    try:
        mon = IdleMonitor(app=app, lifecycle=app.lifecycle)
    except ValueError as e:  # a configuration mistake must not take the server down
        app.log.error("jupyter_pause: auto-pause disabled: %s", e)
        return
    app.serverapp.web_app.settings[MONITOR_KEY] = mon
    mon.start()


async def stop(app: Any) -> None:
    mon = app.serverapp.web_app.settings.pop(MONITOR_KEY, None)
    if mon is not None:
        await mon.stop()
