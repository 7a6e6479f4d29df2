"""The REST client of the CLI: how the running server is found and asked (standard library only).

The server is found the way ``jupyter server list`` finds it (its runtime files); ``--url`` and
``--token`` (or JUPYTER_PAUSE_SERVER_URL / JUPYTER_PAUSE_SERVER_TOKEN) override that.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir

from ..configcheck import url_problem


class NoServer(Exception):
    """No Jupyter server could be found or reached."""


class UsageError(Exception):
    """A value given on the command line (or in the environment) that cannot be used: exit 2."""


class ApiError(Exception):
    """The server answered with an error status; ``str()`` is its message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Client:
    """A small client of jupyter-pause's REST API."""

    def __init__(self, url: str, token: str = "", timeout: float = 30.0):
        why = url_problem(url, what="server URL")
        if why is None and urllib.parse.urlsplit(url).scheme.lower() not in ("http", "https"):
            why = f"{url!r} is not an http:// or https:// server URL"
        if why:
            raise UsageError(why)
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


def server_options(default: Any) -> argparse.ArgumentParser:
    """``--url``, ``--token``, ``--json`` as a parent parser.

    The top-level parser uses ``default=None``; each subcommand uses ``argparse.SUPPRESS`` so
    that the options may come before or after the command without the subcommand's default
    overwriting a value given before it.
    """
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--url", default=default, help="server URL (default: the running "
                   "server, as `jupyter server list` shows it)")
    p.add_argument("--token", default=default, help="server token (default: from the list)")
    p.add_argument("--json", action="store_true", default=default or False,
                   help="print JSON")
    return p
