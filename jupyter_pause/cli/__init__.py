"""``jupyter pause``: the command line of jupyter-pause.

Each module owns its subcommands and adds them to the parser with ``register(subparsers)``:

  workspace  status, list, pause, resume: the workspace, through the running server
  policy     gc, report, validate: the platform team's commands
  kube       doctor, snapshots, and resume --namespace NS WORKSPACE from outside the pod
  client     the REST client, and how the running server is found
  config     the server's configuration, loaded as jupyter_server loads it
  exits      the exit codes: 0 ok, 1 the operation failed, 2 usage error, 3 no server reachable
"""

from __future__ import annotations

import argparse
import sys

from . import kube, policy, workspace
from .client import ApiError, NoServer, UsageError, server_options
from .exits import EXIT_FAIL, EXIT_NO_SERVER, EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyter pause", description="Pause and resume Jupyter workspaces.",
        parents=[server_options(None)])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in (workspace, policy, kube):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code."""
    # Journal text and server messages may hold any character: an unencodable one is shown
    # escaped rather than ending the command with a UnicodeEncodeError.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
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
    except UsageError as e:
        print(f"jupyter pause: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as e:
        print(f"jupyter pause: {e}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return EXIT_FAIL
