"""``jupyter pause status|list|resume|pause|gc`` against a running Jupyter server.

The server is found the way ``jupyter server list`` finds it (its runtime files); ``--url`` and
``--token`` (or JUPYTER_PAUSE_SERVER_URL / JUPYTER_PAUSE_SERVER_TOKEN) override that.

Other modules add subcommands: each module named in ``PLUGIN_MODULES`` may define
``register(subparsers)``; a command sets ``func=callable(args) -> int`` with ``set_defaults``.
To extend a command defined here, use ``subparsers.choices["resume"]`` and wrap its ``func``.

Exit codes: 0 ok, 1 the operation failed, 2 usage error, 3 no server reachable.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .units import format_bytes, parse_duration

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NO_SERVER = 0, 1, 2, 3
PLUGIN_MODULES = ["jupyter_pause.cli_kube", "jupyter_pause.cli_policy"]
TERMINAL = ("paused", "ready", "failed", "running")


class NoServer(Exception):
    """No Jupyter server could be found or reached."""


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Client:
    """A small client of jupyter-pause's REST API (stdlib only)."""

    def __init__(self, url: str, token: str = "", timeout: float = 30.0):
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout

    def request(self, method: str, endpoint: str, body: dict | None = None) -> Any:
        url = urllib.parse.urljoin(self.url, "jupyter-pause/api/" + endpoint)
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        data = None
        if body is not None or method in ("POST", "PUT"):
            data = json.dumps(body or {}).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw).get("message") or e.reason
            except ValueError:
                message = e.reason
            if e.code == 404 and not raw.startswith(b"{"):
                message = "this server has no jupyter-pause extension enabled"
            raise ApiError(e.code, str(message)) from None
        except (urllib.error.URLError, OSError) as e:
            raise NoServer(f"cannot reach the Jupyter server at {self.url}: {e}") from None
        return json.loads(raw) if raw else None


def list_running_servers(runtime_dir: str | None = None) -> list[dict[str, Any]]:
    """What ``jupyter server list`` reads (jupyter_server.serverapp.list_running_servers):
    the ``jpserver-*.json`` runtime files of live processes. Read directly because importing
    jupyter_server.serverapp costs seconds for a command that should answer at once."""
    import glob

    from jupyter_core.paths import jupyter_runtime_dir

    out = []
    for path in sorted(glob.glob(os.path.join(runtime_dir or jupyter_runtime_dir(),
                                              "jpserver-*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
            os.kill(int(info["pid"]), 0)
        except PermissionError:  # alive, another user's
            pass
        except (OSError, ValueError, KeyError, TypeError):
            continue  # stale file or being written
        out.append(info)
    return out


def find_server(url: str | None = None, token: str | None = None) -> Client:
    """The server to talk to: --url/--token, the environment, or the running server list."""
    url = url or os.environ.get("JUPYTER_PAUSE_SERVER_URL")
    token = token if token is not None else os.environ.get("JUPYTER_PAUSE_SERVER_TOKEN")
    if url:
        return Client(url, token or "")
    servers = list(list_running_servers())
    if not servers:
        raise NoServer("no running Jupyter server found (start one, or pass --url and --token)")
    cwd = os.path.realpath(os.getcwd())

    def depth(s: dict[str, Any]) -> int:
        root = os.path.realpath(s.get("root_dir") or s.get("notebook_dir") or "/")
        inside = (cwd + os.sep).startswith(root.rstrip(os.sep) + os.sep)
        return len(root) if inside else -1

    best = max(servers, key=depth)
    return Client(best["url"], token if token is not None else best.get("token", ""))


def client_from_args(args: argparse.Namespace) -> Client:
    return find_server(getattr(args, "url", None), getattr(args, "token", None))


# ---------------------------------------------------------------------- output


def _state_line(st: dict[str, Any]) -> str:
    state = st.get("state")
    after_stop = (st.get("last_report") or {}).get("after_stop")
    if state == "ready" and st.get("outcome") == "restored" and after_stop:
        text = f"ready: {_after_stop_text(after_stop)}"
    elif state == "ready":
        text = {"live": "ready: the live kernels came back",
                "restored": "ready: restored from checkpoint",
                "fresh": "ready: fresh kernels (nothing restored)"}.get(st.get("outcome"), "ready")
    else:
        text = str(state).replace("_", " ")
    step = st.get("step")
    if step and step.get("total"):
        text += (f" ({step.get('message') or step.get('name')}: "
                 f"{format_bytes(step.get('done'))} of {format_bytes(step.get('total'))})")
    elif step and step.get("message"):
        text += f" ({step['message']})"
    return text


def _after_stop_text(after_stop: dict[str, Any]) -> str:
    from .policy.report import trigger_text

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
    print(f"State:    {_state_line(st)}")
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
            took += f" ({_after_stop_text(report['after_stop'])})"
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
        line = _state_line(st)
        if not quiet and line != last:
            print(f"  {line}", flush=True)
            last = line
        flight = st.get("flight")
        if (not flight or flight.get("id") != flight_id) and st.get("state") in TERMINAL:
            return st
        if time.monotonic() > deadline:
            raise ApiError(0, f"still {st.get('state')} after {timeout:g} s")
        time.sleep(0.5)


def _flight_cmd(kind: str, args: argparse.Namespace) -> int:
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
    return _flight_cmd("resume", args)


def cmd_pause(args: argparse.Namespace) -> int:
    return _flight_cmd("pause", args)


def parse_age(text: str | None) -> float | None:
    """``--older-than``: '90s', '30m', '12h', '7d' or plain seconds -> seconds."""
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cmd_gc(args: argparse.Namespace) -> int:
    """Retention through the server (jupyter_pause.cli_policy replaces this with a richer one)."""
    body = {"keep": args.keep, "older_than": args.older_than, "dry_run": args.dry_run}
    res = client_from_args(args).request("POST", "gc", body)
    if args.json:
        print(json.dumps(res, indent=2))
        return EXIT_OK
    checkpoints = res.get("checkpoints") or {}
    deleted = checkpoints.get("deleted", [])
    blobs = res.get("blobs") or {}
    verb = "Would delete" if args.dry_run else "Deleted"
    print(f"{verb} {len(deleted)} checkpoint(s) and {blobs.get('deleted', 0)} blob(s), "
          f"{format_bytes(blobs.get('bytes_freed', 0))}.")
    for c in deleted:
        print(f"  {c.get('id')}  {c.get('stream')}  {c.get('created')}")
    for u in res.get("unverified") or []:
        print(f"  unverified, left alone: {u.get('path')}: {u.get('reason')}")
    print(f"Remaining: {checkpoints.get('remaining', 0)} checkpoint(s).")
    return EXIT_OK


# ---------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    def options(default: Any) -> argparse.ArgumentParser:
        # Given before or after the command; SUPPRESS keeps a subcommand's default from
        # overwriting a value given before it.
        p = argparse.ArgumentParser(add_help=False)
        p.add_argument("--url", default=default, help="server URL (default: the running "
                       "server, as `jupyter server list` shows it)")
        p.add_argument("--token", default=default, help="server token (default: from the list)")
        p.add_argument("--json", action="store_true", default=default or False,
                       help="print JSON")
        return p

    common = options(argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="jupyter pause", description="Pause and resume Jupyter workspaces.",
        parents=[options(None)])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("status", parents=[common], help="show the workspace state")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("list", parents=[common], help="list checkpoints")
    p.add_argument("--stream", help="only this notebook's checkpoints")
    p.set_defaults(func=cmd_list)

    for name, func, text in (("resume", cmd_resume, "resume the paused workspace"),
                             ("pause", cmd_pause, "pause the workspace")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("--wait", action="store_true", help="follow the state until it settles")
        p.add_argument("--timeout", type=float, default=3600.0, help="seconds --wait waits")
        if name == "pause":
            p.add_argument("--interrupt", action="store_true",
                           help="interrupt busy kernels instead of refusing")
        p.set_defaults(func=func)

    p = sub.add_parser("gc", parents=[common], help="delete old checkpoints and unused data")
    p.add_argument("--keep", type=int, default=None, help="checkpoints kept per notebook "
                   "(default: the server's keep_checkpoints)")
    p.add_argument("--older-than", type=parse_age, default=None, metavar="AGE",
                   help="only delete checkpoints older than AGE (90s, 30m, 12h, 7d)")
    p.add_argument("--dry-run", action="store_true", help="show what would be deleted")
    p.set_defaults(func=cmd_gc)

    for name in PLUGIN_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue
            raise
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    try:
        return int(args.func(args) or 0)
    except NoServer as e:
        print(f"jupyter pause: {e}", file=sys.stderr)
        return EXIT_NO_SERVER
    except ApiError as e:
        print(f"jupyter pause: {e}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
