"""The REST client of the CLI: how the running server is found and asked (no jupyter_server
import: a command should answer at once).

The server is found the way ``jupyter server list`` finds it (its runtime files), by the rule
the kernel's magics use too (:mod:`..kernel.server_api`); ``--url`` and ``--token`` (or
JUPYTER_PAUSE_SERVER_URL / JUPYTER_PAUSE_SERVER_TOKEN) override that.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..configcheck import url_problem
from ..kernel.server_api import NoServerRunning, ServerError, discover_server


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


def find_server(url: str | None = None, token: str | None = None) -> Client:
    """The server to talk to: --url/--token, the environment, or the running server that
    :func:`..kernel.server_api.discover_server` chooses (the same rule as ``%pause``'s)."""
    url = url or os.environ.get("JUPYTER_PAUSE_SERVER_URL")
    token = token if token is not None else os.environ.get("JUPYTER_PAUSE_SERVER_TOKEN")
    if url:
        return Client(url, token or "")
    try:
        found = discover_server()
    except NoServerRunning as e:
        raise NoServer(f"{e} (start one, or pass --url and --token)") from None
    except ServerError as e:
        raise NoServer(f"{e}: pass --url and --token") from None
    return Client(found["url"], token if token is not None else found.get("token", ""))


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
