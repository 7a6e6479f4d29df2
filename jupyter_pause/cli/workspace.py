"""``jupyter pause status | list | pause | resume``: the workspace, through the running server.

``resume --namespace NS WORKSPACE`` resumes a workspace from outside its pod instead
(:func:`jupyter_pause.cli.kube.cmd_resume`).
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from typing import Any

from ..server.pausereport import trigger_text
from ..units import format_bytes
from . import kube
from .argtypes import number
from .client import ApiError, Client, client_from_args, server_options
from .exits import EXIT_FAIL, EXIT_OK

TERMINAL = ("paused", "ready", "failed", "running")


# ---------------------------------------------------------------------- output


def state_line(st: dict[str, Any]) -> str:
    """The state in one line, with the running step's progress."""
    state = st.get("state")
    after_stop = (st.get("last_report") or {}).get("after_stop")
    if state == "ready" and st.get("outcome") == "restored" and after_stop:
        text = f"ready: {after_stop_text(after_stop)}"
    elif state == "ready":
        text = {"live": "ready: the live kernels came back",
                "restored": "ready: restored from checkpoint",
                "fresh": "ready: fresh kernels (nothing restored)"}.get(str(st.get("outcome")),
                                                                      "ready")
    else:
        text = str(state).replace("_", " ")
    step = st.get("step")
    if step and step.get("total"):
        text += (f" ({step.get('message') or step.get('name')}: "
                 f"{format_bytes(step.get('done'))} of {format_bytes(step.get('total'))})")
    elif step and step.get("message"):
        text += f" ({step['message']})"
    return text


def after_stop_text(after_stop: dict[str, Any]) -> str:
    how = trigger_text(after_stop.get("trigger"), bool(after_stop.get("hub")))
    return f"restored after the server was stopped ({how})"


def print_stop(stopped: dict[str, Any]) -> None:
    """The last server stop: what its shutdown checkpoint saved, what not and why."""
    killed = ", killed during its shutdown checkpoint" if stopped.get("interrupted") else ""
    print(f"Last stop: {stopped.get('at')} ({stopped.get('trigger')}{killed})")
    pending = set(stopped.get("pending") or [])
    for k in stopped.get("kernels") or []:
        name = k.get("path") or "(no notebook)"
        if k.get("status") == "saved":
            when = "restored when opened" if name in pending else "saved"
            print(f"  {name}: saved {k.get('checkpoint_id')} ({when})")
        else:
            print(f"  {name}: not saved ({k.get('reason')})")


def print_status(st: dict[str, Any]) -> None:
    print(f"State:    {state_line(st)}")
    if st.get("reason"):
        print(f"Reason:   {st['reason']}")
    if st.get("hint"):
        print(f"Hint:     {st['hint']}")
    flight = st.get("flight")
    if flight:
        print(f"Flight:   {flight['kind']} {flight['id']} ({flight['trigger']}, "
              f"since {flight['started']})")
    backend = st.get("backend") or {}
    line = f"Backend:  {backend.get('name')}"
    if not backend.get("can_pause", True):
        line += f" (cannot pause: {backend.get('why_not')})"
    print(line)
    kernels = st.get("kernels") or []
    print(f"Kernels:  {len(kernels)}")
    for k in kernels:
        print(f"  {k.get('path') or '(no notebook)'}  {k.get('name')}  {k.get('execution_state')}")
    cp = st.get("last_checkpoint")
    if cp:
        print(f"Last checkpoint: {cp.get('id')}  {cp.get('created')}  "
              f"{format_bytes(cp.get('bytes_total'))}"
              f"  ({cp.get('kernels')} kernel(s))")
    if st.get("stopped"):
        print_stop(st["stopped"])
    report = st.get("last_report")
    if report:
        d = report.get("durations") or {}
        took = f" in {d['total_s']:.1f} s" if isinstance(d.get("total_s"), (int, float)) else ""
        if report.get("after_stop"):
            took += f" ({after_stop_text(report['after_stop'])})"
        print(f"Last resume: {report.get('outcome')}{took}")
        for k in report.get("kernels") or []:
            counts: dict[str, int] = {}
            for v in k.get("variables") or []:
                counts[v.get("status")] = counts.get(v.get("status"), 0) + 1
            summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no variables"
            print(f"  {k.get('path') or '(no notebook)'}: {k.get('outcome')} ({summary})")


# ---------------------------------------------------------------------- commands


def cmd_status(args: argparse.Namespace) -> int:
    st = client_from_args(args).request("GET", "status")
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        print_status(st)
    return EXIT_FAIL if st.get("state") == "failed" else EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    path = "checkpoints" + (f"?stream={urllib.parse.quote(args.stream)}" if args.stream else "")
    items = client_from_args(args).request("GET", path).get("checkpoints", [])
    if args.json:
        print(json.dumps(items, indent=2))
        return EXIT_OK
    if not items:
        print("No checkpoints.")
        return EXIT_OK
    print(f"{'ID':<36} {'CREATED':<26} {'SIZE':>10} {'VARS':>5}  NOTEBOOK")
    for c in items:
        print(f"{c.get('id')!s:<36} {c.get('created')!s:<26} "
              f"{format_bytes(c.get('bytes_total')):>10} {c.get('variables', 0):>5}  "
              f"{c.get('stream')}")
    return EXIT_OK


def _follow(client: Client, flight_id: str, timeout: float, quiet: bool) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        st = client.request("GET", "status")
        line = state_line(st)
        if not quiet and line != last:
            print(f"  {line}", flush=True)
            last = line
        flight = st.get("flight")
        if (not flight or flight.get("id") != flight_id) and st.get("state") in TERMINAL:
            return st
        if time.monotonic() > deadline:
            raise ApiError(0, f"still {st.get('state')} after {timeout:g} s")
        time.sleep(0.5)


def _flight(kind: str, args: argparse.Namespace) -> int:
    client = client_from_args(args)
    body: dict[str, Any] = {"trigger": "api"}
    if kind == "pause" and getattr(args, "interrupt", False):
        body["interrupt"] = True
    flight = client.request("POST", kind, body)["flight"]
    print(f"{kind.capitalize()} {flight['id']} started.")
    if not args.wait:
        return EXIT_OK
    st = _follow(client, flight["id"], args.timeout, args.json)
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        print_status(st)
    want = "paused" if kind == "pause" else "ready"
    return EXIT_OK if st.get("state") == want else EXIT_FAIL


def cmd_resume(args: argparse.Namespace) -> int:
    if args.namespace or args.workspace:
        return kube.cmd_resume(args)
    return _flight("resume", args)


def cmd_pause(args: argparse.Namespace) -> int:
    return _flight("pause", args)


# ---------------------------------------------------------------------- parser


def register(sub: Any) -> None:
    """Add status, list, resume and pause to the ``jupyter pause`` subparsers."""
    common = server_options(argparse.SUPPRESS)
    p = sub.add_parser("status", parents=[common], help="show the workspace state")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("list", parents=[common], help="list checkpoints")
    p.add_argument("--stream", help="only this notebook's checkpoints")
    p.set_defaults(func=cmd_list)

    for name, func, text in (("resume", cmd_resume, "resume the paused workspace"),
                             ("pause", cmd_pause, "pause the workspace")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("--wait", action="store_true", help="follow the state until it settles")
        p.add_argument("--timeout", type=number(positive=True), default=3600.0,
                       help="seconds --wait waits")
        if name == "pause":
            p.add_argument("--interrupt", action="store_true",
                           help="interrupt busy kernels instead of refusing")
        else:
            kube.add_resume_arguments(p)
        p.set_defaults(func=func)
