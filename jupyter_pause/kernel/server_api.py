"""Find the Jupyter server that runs this kernel and call jupyter-pause's REST API on it.

The server is found the way ``jupyter server list`` finds servers: the ``jpserver-*.json`` files in
Jupyter's runtime directory (read directly, so the kernel never imports jupyter_server). The one
whose ``pid`` is this kernel's parent (or an ancestor) wins.
"""

from __future__ import annotations

import glob
import http.client
import json
import logging
import os
import socket
import ssl
import urllib.parse
from typing import Any

import psutil

log = logging.getLogger(__name__)

API_PREFIX = "jupyter-pause/api/"


class ServerError(Exception):
    """One line for the person: no server, refused request, unreachable server. ``status`` is
    the HTTP status of a refused request (None when no answer came)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _ancestors() -> list[int]:
    pids = [os.getppid()]
    try:
        pids += [p.pid for p in psutil.Process(os.getppid()).parents()]
    except psutil.Error:  # no permission: the parent is enough
        log.debug("cannot list ancestor processes", exc_info=True)
    return pids


def running_servers(runtime_dir: str | None = None) -> list[dict[str, Any]]:
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = jupyter_runtime_dir()
    out = []
    for path in sorted(glob.glob(os.path.join(runtime_dir, "jpserver-*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue  # being written, or unreadable
        pid = info.get("pid") if isinstance(info, dict) else None
        if isinstance(pid, int) and pid > 0 and psutil.pid_exists(pid):
            out.append(info)
    return out


def find_server(runtime_dir: str | None = None) -> dict[str, Any]:
    """The server running this kernel; raises ServerError (one line) when there is none."""
    url = os.environ.get("JUPYTER_PAUSE_SERVER_URL")
    if url:
        return {"url": url, "token": os.environ.get("JUPYTER_PAUSE_SERVER_TOKEN", ""), "pid": None}
    servers = running_servers(runtime_dir)
    if not servers:
        raise ServerError(
            "no running Jupyter server found for this kernel "
            "(is it running under JupyterLab / jupyter server?)"
        )
    by_pid = {s.get("pid"): s for s in servers}
    for pid in _ancestors():
        if pid in by_pid:
            return by_pid[pid]
    if len(servers) == 1:
        return servers[0]
    cwd = os.path.realpath(os.getcwd())
    under = [
        s
        for s in servers
        if s.get("root_dir")
        and (cwd + os.sep).startswith(os.path.realpath(s["root_dir"]).rstrip(os.sep) + os.sep)
    ]
    if under:
        return max(under, key=lambda s: len(s["root_dir"]))
    raise ServerError(
        f"{len(servers)} Jupyter servers are running and none is this kernel's "
        "parent; cannot tell which one to ask"
    )


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def request(
    server: dict[str, Any],
    method: str,
    endpoint: str,
    body: dict | None = None,
    timeout: float = 15.0,
) -> tuple[int, dict[str, Any]]:
    """``method <base>/jupyter-pause/api/<endpoint>`` with the server's token; (status, json)."""
    if server.get("sock"):
        conn: http.client.HTTPConnection = _UnixConnection(server["sock"], timeout)
        base_path = server.get("base_url") or "/"
        where = f"unix socket {server['sock']}"
    else:
        url = urllib.parse.urlsplit(server["url"])
        port = url.port or (443 if url.scheme == "https" else 80)
        if url.scheme == "https":
            # We trust the address because we read it from the server's own runtime file.
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(url.hostname, port, timeout=timeout, context=ctx)
        else:
            conn = http.client.HTTPConnection(url.hostname, port, timeout=timeout)
        base_path = url.path or "/"
        where = server["url"]
    path = base_path.rstrip("/") + "/" + API_PREFIX + endpoint
    headers = {"Accept": "application/json"}
    if server.get("token"):
        headers["Authorization"] = f"token {server['token']}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        status = resp.status
    except (OSError, http.client.HTTPException) as e:
        raise ServerError(f"cannot reach the Jupyter server at {where}: {e}") from None
    finally:
        conn.close()
    try:
        payload = json.loads(raw.decode() or "{}") if raw else {}
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {"value": payload}
    if status == 404:
        raise ServerError(
            "the Jupyter server has no jupyter-pause API (is the jupyter_pause "
            "server extension enabled?)"
        )
    if status in (401, 403):
        raise ServerError(
            f"the Jupyter server refused this kernel's request (HTTP {status}: not authorized)"
        )
    if status >= 400:
        msg = payload.get("message") or payload.get("reason") or raw.decode(errors="replace")
        raise ServerError(" ".join(f"the server refused: {msg} (HTTP {status})".split()), status)
    return status, payload
