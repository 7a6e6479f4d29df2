"""``jupyter pause report | gc | validate``: the platform team's commands.

They read the server's configuration (state directory, store, key, retention) through
:func:`jupyter_pause.cli.config.pause_app`; ``gc`` goes through the running server when there is
one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from ..cluster.base import resolve_backend_class
from ..journal import journal_path, parse_time, read_journal
from ..policy import gc as gc_mod
from ..policy import upgradecheck
from ..policy.costreport import build_report
from ..policy.render import render_report, render_whatif
from ..policy.whatif import (
    DEFAULT_THRESHOLDS,
    measured_costs,
    read_trace,
    simulate,
    trace_from_journal,
)
from ..units import parse_duration
from .argtypes import count, number
from .client import ApiError, NoServer, find_server, server_options
from .config import pause_app
from .exits import EXIT_FAIL, EXIT_OK

EPILOG_VALIDATE = """exit codes: 0 live (same process, memory intact), 10 restored (from the
checkpoint; see 'lost'), 20 fresh (nothing restored), 1 error (nothing prepared, the marker file
on the persistent volume is gone, or a wrong value came back)."""


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_FAIL


def _one_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else e.__class__.__name__


def parse_age(text: str | None) -> float | None:
    """``--older-than``: '90s', '30m', '12h', '7d' or plain seconds -> seconds."""
    if text is None:
        return None
    try:
        value = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value > 1e10:  # the server's bound too: past ~300 years an age is a typo
        raise argparse.ArgumentTypeError(f"{text!r} is longer than any checkpoint can be old")
    return value


# ------------------------------------------------------------------ report


def cmd_report(args: argparse.Namespace) -> int:
    try:
        journal = read_journal(args.journal
                               or journal_path(args.state_dir or pause_app().state_dir))
        since = parse_time(args.since) if args.since else None
        until = parse_time(args.until) if args.until else None
        report = None
        if journal.events or not args.trace:
            report = build_report(journal, period=args.period, since=since,
                                  until=until if until is not None else time.time(),
                                  accelerators=args.accelerators)
        whatif = None
        if args.whatif or args.trace or args.thresholds:
            thresholds = ([parse_duration(t) for t in args.thresholds.split(",") if t.strip()]
                          if args.thresholds else list(DEFAULT_THRESHOLDS))
            costs = measured_costs(journal)
            capture = args.capture_s if args.capture_s is not None else costs["capture_s"]
            restore = args.restore_s if args.restore_s is not None else costs["restore_s"]
            source = ("flags" if args.capture_s is not None and args.restore_s is not None else
                      f"measured from {costs['pauses_measured']} pauses and "
                      f"{costs['resumes_measured']} resumes" if capture or restore else
                      "not measured: 0 assumed, pass --capture-s/--restore-s")
            trace = (read_trace(args.trace) if args.trace else
                     trace_from_journal(journal, start=since, end=until))
            whatif = simulate(trace, thresholds, capture_s=capture or 0.0,
                              restore_s=restore or 0.0, accelerators=args.accelerators,
                              price_per_hour=args.price)
            whatif["costs_source"] = source
    except (OSError, ValueError) as e:
        return _fail(str(e))
    if args.plot:
        # matplotlib is optional (the "plot" extra): only --plot imports it
        from ..policy.plot import PlotUnavailable, write_plot

        try:
            write_plot(args.plot, report, whatif)
        except PlotUnavailable as e:
            return _fail(str(e))
        except (OSError, ValueError) as e:
            return _fail(f"cannot write {args.plot}: {e}")
    if args.json:
        print(json.dumps({"report": report, "whatif": whatif}, indent=1, default=str))
    else:
        parts = []
        if report is not None:
            parts.append(render_report(report))
        if whatif is not None:
            parts.append(render_whatif(whatif))
        if args.plot:
            parts.append(f"chart written to {args.plot}")
        print("\n\n".join(parts))
    return EXIT_OK


# ------------------------------------------------------------------ gc


def _server_gc(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any] | None:
    """POST gc to the running server (found like `jupyter server list`); None if none runs."""
    try:
        return find_server(getattr(args, "url", None), getattr(args, "token", None)).request(
            "POST", "gc", body)
    except NoServer:
        if getattr(args, "url", None):
            raise
        return None
    except ApiError as e:
        if e.status == 404:  # a server without jupyter-pause: clean the store directly
            return None
        raise RuntimeError(str(e)) from None


def _from_server_format(res: dict[str, Any]) -> dict[str, Any]:
    """The server's own gc answer (deleted/kept lists) in the offline gc's shape."""
    if "checkpoints" in res:
        return res
    kept = res.get("kept") or []
    blobs = res.get("blobs") or {}
    return {
        "dry_run": res.get("dry_run", False), "backend": res.get("backend"),
        "protected": res.get("protected") or [],
        "checkpoints": {"deleted": res.get("deleted") or [], "remaining": len(kept)},
        "blobs": {"deleted": blobs.get("deleted", 0), "bytes_freed": blobs.get("bytes", 0),
                  "temps_removed": 0},
        "remaining": {"checkpoints": len(kept), "streams": len({k.get("stream") for k in kept}),
                      "blobs": "?", "bytes": res.get("bytes_remaining", "?")},
    }


def _offline_gc(args: argparse.Namespace) -> dict[str, Any]:
    """Straight to the store, with the server's configuration for what the flags leave out."""
    app = pause_app()
    if args.keep is None and "keep_checkpoints" in app.config_problems:
        raise gc_mod.GCError(f"PauseApp.keep_checkpoints is invalid "
                             f"({app.config_problems['keep_checkpoints']}); fix it or pass --keep")
    backend = resolve_backend_class(args.backend)(config=app.config) if args.backend else None
    return asyncio.run(gc_mod.run_gc(
        store_url=args.store or app.store_url or None,
        state_dir=args.state_dir or app.state_dir,
        keep=args.keep if args.keep is not None else app.keep_checkpoints,
        older_than=args.older_than, dry_run=args.dry_run, backend=backend,
        key_path=args.key or app.key_path or None))


def cmd_gc(args: argparse.Namespace) -> int:
    result = None
    try:
        if not args.offline:
            result = _server_gc(args, {"keep": args.keep, "older_than": args.older_than,
                                       "dry_run": args.dry_run})
            if result is not None:
                result = {**_from_server_format(result), "via": "server"}
        if result is None:
            result = {**_offline_gc(args), "via": "offline"}
    except Exception as e:  # noqa: BLE001 - NoServer, GCError, backend config: one line
        return _fail(_one_line(e))
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(gc_mod.render(result))
    b = result.get("backend")
    return EXIT_FAIL if isinstance(b, dict) and b.get("error") else EXIT_OK


# ------------------------------------------------------------------ validate


def cmd_validate(args: argparse.Namespace) -> int:
    if args.action == "prepare":
        return _validate_prepare(args)
    try:
        out = asyncio.run(upgradecheck.check(
            state_dir=args.state_dir or pause_app().state_dir,
            store_url=args.store if args.store else None,
            key_path=args.key if args.key else None,
            kernel_name=args.kernel if args.kernel != "python3" else None,
            keep_kernel=args.keep_kernel, timeout=args.timeout))
    except Exception as e:  # noqa: BLE001 - one line, never a traceback
        msg = _one_line(e)
        if args.json:
            print(json.dumps({"outcome": "error", "exit_code": EXIT_FAIL, "error": msg}))
        else:
            print(f"error      -         {msg}\noutcome    error     exit {EXIT_FAIL}")
        return EXIT_FAIL
    print(json.dumps(out.to_dict()) if args.json else out.render())
    return out.exit_code


def _validate_prepare(args: argparse.Namespace) -> int:
    try:
        app = pause_app()
        st = asyncio.run(upgradecheck.prepare(
            state_dir=args.state_dir or app.state_dir, store_url=args.store or app.store_url or None,
            key_path=args.key or app.key_path or None, kernel_name=args.kernel, stop=args.stop,
            timeout=args.timeout))
    except Exception as e:  # noqa: BLE001 - one line, never a traceback
        msg = _one_line(e)
        if args.json:
            print(json.dumps({"prepared": False, "error": msg}))
        return _fail(f"validate prepare: {msg}")
    if args.json:
        print(json.dumps({"prepared": True, **{k: st[k] for k in (
            "pid", "checkpoint_id", "stopped", "stream")}}))
    else:
        print(f"prepared  kernel pid {st['pid']} "
              f"({'stopped' if st['stopped'] else 'left running'}), checkpoint "
              f"{st['checkpoint_id']}; now upgrade, then run `jupyter pause validate check`")
    return EXIT_OK


# ------------------------------------------------------------------ parser


def register(sub: Any) -> None:
    """Add gc, report and validate to the ``jupyter pause`` subparsers."""
    p = sub.add_parser(
        "gc", parents=[server_options(argparse.SUPPRESS)],
        help="delete old checkpoints and unused data",
        description="Retention clean-up, in an order that orphans nothing: the backend's "
                    "snapshots and triggers, then checkpoints beyond the policy, then blobs no "
                    "checkpoint references. Goes through the running server when there is one; "
                    "otherwise (or with --offline) straight to the store.")
    p.add_argument("--keep", type=count, default=None, help="checkpoints kept per notebook, 0 for "
                   "no count limit (default: the server's PauseApp.keep_checkpoints)")
    p.add_argument("--older-than", type=parse_age, default=None, metavar="AGE",
                   help="only delete checkpoints older than AGE (90s, 30m, 12h, 7d)")
    p.add_argument("--dry-run", action="store_true", help="show what would be deleted")
    p.add_argument("--offline", action="store_true", help="do not use a running server")
    p.add_argument("--store", help="checkpoint store (offline; default PauseApp.store_url)")
    p.add_argument("--state-dir", help="state dir (offline; default PauseApp.state_dir)")
    p.add_argument("--backend", help="also clean this backend's snapshots offline (gke, ...)")
    p.add_argument("--key", help="checkpoint key file (offline; default PauseApp.key_path): "
                   "only checkpoints it authenticates are counted or deleted")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser(
        "report", parents=[server_options(argparse.SUPPRESS)], help="accelerator-hours held/released, pauses, resumes, sizes, times; what-if",
        description="Cost and capacity report from the journal (journal.jsonl in the state dir).")
    p.add_argument("--journal", help="journal.jsonl to read (default: the server's state dir)")
    p.add_argument("--state-dir", help="the server's state dir (PauseApp.state_dir)")
    p.add_argument("--period", choices=("day", "week", "all"), default="day")
    p.add_argument("--since", help="start of the window (ISO-8601 or epoch s)")
    p.add_argument("--until", help="end of the window (default: now)")
    p.add_argument("--accelerators", type=number(), default=1.0,
                   help="accelerator count when the journal does not say (default 1)")
    p.add_argument("--whatif", action="store_true", help="add the idle-threshold what-if")
    p.add_argument("--thresholds", help="idle thresholds for the what-if (default 15m,1h,4h)")
    p.add_argument("--trace", help="activity trace (CSV start,end[,kind] or JSONL; its own "
                                   "window) instead of the journal's activity")
    p.add_argument("--capture-s", type=number(), help="seconds to pause (default: measured)")
    p.add_argument("--restore-s", type=number(), help="seconds to resume (default: measured)")
    p.add_argument("--price", type=number(), help="price of one accelerator-hour (adds 'saved')")
    p.add_argument("--plot", metavar="FILE.png", help="also write a PNG chart (matplotlib)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "validate", parents=[server_options(argparse.SUPPRESS)], help="upgrade check: prepare before, check after (live/restored/fresh)",
        description=upgradecheck.__doc__, epilog=EPILOG_VALIDATE,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("prepare", "check"))
    p.add_argument("--state-dir", help="persistent state dir (default PauseApp.state_dir)")
    p.add_argument("--store", help="checkpoint store (default PauseApp.store_url)")
    p.add_argument("--key", help="checkpoint key file (default PauseApp.key_path)")
    p.add_argument("--kernel", default="python3", help="kernel spec name (default python3)")
    p.add_argument("--stop", action="store_true",
                   help="prepare: shut the test kernel down after the checkpoint (the local "
                        "backend's pause); default: leave it running")
    p.add_argument("--keep-kernel", action="store_true",
                   help="check: leave the prepared kernel running afterwards")
    p.add_argument("--timeout", type=number(positive=True), default=120.0,
                   help="seconds per kernel step")
    p.set_defaults(func=cmd_validate)
