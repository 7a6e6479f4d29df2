"""HTTP routes of the platform tools, and the server hooks that start the idle monitor.

This module is a plugin of the server (entry-point group ``jupyter_pause.server_modules``, read
into ``PauseApp.extension_modules``): the server never imports the policy package. It calls
``autosave_settings(app)`` and ``get_handlers(app)`` while it starts, ``await start(app)`` once
the Lifecycle runs and ``await stop(app)`` at shutdown.

Routes (under ``<base_url>``; authenticated, XSRF-checked by APIHandler):
  GET  jupyter-pause/api/policy          auto-pause state (profile, idle verdict, time left)
  POST jupyter-pause/api/policy/cancel   cancel an announced auto-pause (the person is here)
  GET  jupyter-pause/api/report          cost/capacity report (+ what-if with ?whatif=1)
  POST jupyter-pause/api/gc              retention: snapshots, old checkpoints, unused blobs

Reading these is not user activity (``_track_activity = False``), so a UI polling them does not
keep a workspace "active" for Kubeflow's or JupyterHub's cullers; cancelling is.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized

from ..journal import journal_path, parse_time, read_journal
from ..server import validate as v
from ..server.handlers import API, ApiError, BaseHandler
from ..units import parse_duration
from .costreport import build_report
from .gc import GCError, run_gc_for_app
from .monitor import IdleMonitor
from .profiles import IdlePolicy
from .whatif import DEFAULT_THRESHOLDS, measured_costs, simulate, trace_from_journal

MONITOR_KEY = "jupyter_pause_idle_monitor"


class _Base(BaseHandler):
    """A policy route: the server's handler, with the idle monitor at hand."""

    @property
    def monitor(self) -> IdleMonitor | None:
        return self.settings.get(MONITOR_KEY)


class PolicyHandler(_Base):
    """GET policy: the auto-pause state (profile, idle verdict, time left)."""

    _track_activity = False

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        mon = self.monitor
        if mon is None:
            self.reply({"enabled": False, "state": "disabled", "profile": None,
                        "cancellable": False})
            return
        self.reply(mon.status())


class PolicyCancelHandler(_Base):
    """POST policy/cancel: cancel an announced auto-pause (the person is here)."""

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        self.body(v.EMPTY)
        mon = self.monitor
        if mon is None or mon.cancel() is None:
            raise ApiError(409, "no auto-pause is announced; nothing to cancel")
        self.reply(mon.status())


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
        v.query_str(name, args.get(name), {"type": "string", "maxLength": 64})
    v.query_str("thresholds", args.get("thresholds"), {"type": "string", "maxLength": 1000})
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
    """GET report: the cost/capacity report (and the what-if with ``?whatif=1``)."""

    _track_activity = False

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        # ?token= is jupyter_server's own authentication (IdentityProvider.get_token reads it
        # from the query, as for every Jupyter URL): it authenticated this request already.
        args = {k: self.get_argument(k) for k in self.request.arguments if k != "token"}
        state_dir = self.extensionapp.state_dir
        try:
            check_report_args(args)
            data = await asyncio.get_running_loop().run_in_executor(
                None, report_payload, state_dir, args, time.time())
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        self.reply(data)


class GcHandler(BaseHandler):
    """POST gc: retention. The backend's snapshots, checkpoints beyond ``keep`` per notebook
    (older than ``older_than`` s), then unreferenced blobs; the current pause's are kept."""

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.body(v.GC)
        if self.lifecycle.flight is not None:
            raise ApiError(409, f"a {self.lifecycle.flight.kind} is in progress; try again "
                           "after it")
        # Snapshots, checkpoints, blobs, in an order that orphans nothing, protecting the current
        # pause's checkpoints (state.json + lifecycle.state).
        try:
            # keep None: the configured keep_checkpoints
            res = await run_gc_for_app(self.extensionapp, keep=body["keep"],
                                       older_than=body["older_than"],
                                       dry_run=bool(body["dry_run"]))
        except (GCError, ValueError) as e:  # a request that makes no sense
            raise ApiError(400, f"gc refused: {e}") from None
        except Exception as e:  # one line back to the caller
            raise ApiError(500, f"gc failed: {e}") from e
        self.reply(res)


def get_handlers(app: Any) -> list[tuple[str, type]]:
    """The policy routes, and gc (retention lives here, beside the other platform tools)."""
    return [
        (rf"{API}/policy", PolicyHandler),
        (rf"{API}/policy/cancel", PolicyCancelHandler),
        (rf"{API}/report", ReportHandler),
        (rf"{API}/gc", GcHandler),
    ]


def autosave_settings(app: Any) -> dict[str, Any]:
    """The workload profile's autosave defaults (the server's ``autosave`` keys go over them);
    raises on a policy configuration that cannot be resolved."""
    policy = IdlePolicy(parent=app)
    profile, _, _ = policy.resolve(
        accelerator_count=int((app.accelerator or {}).get("count") or 0))
    return policy.autosave_for(profile.name)


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
