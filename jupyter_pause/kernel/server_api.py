"""Find the Jupyter server that runs this kernel and call jupyter-pause's REST API on it.

The server is found the way ``jupyter server list`` finds servers: the ``jpserver-*.json`` files in
Jupyter's runtime directory (read directly, so the kernel never imports jupyter_server, and the
CLI answers at once). :func:`discover_server` is the one rule, for the kernel and the CLI alike:
the server whose ``pid`` is this process's parent (or an ancestor) wins, then the only one, then
the one whose root folder holds the current folder most closely.
"""

from __future__ import annotations

import glob
import http.client
import json
import logging
import os
import re
import socket
import ssl
import urllib.parse
from typing import Any

import psutil

log = logging.getLogger(__name__)

API_PREFIX = "jupyter-pause/api/"


class ServerError(Exception):
    """One line for the person: no server, refused request, unreachable server. ``status`` is
    the HTTP status of a refused request (None when no answer came), ``payload`` its JSON."""

    def __init__(self, message: str, status: int | None = None,
                 payload: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.payload = payload or {}


class NoServerRunning(ServerError):
    """No runtime file of a live Jupyter server was found."""


def _ancestors() -> list[int]:
    pids = [os.getppid()]
    try:
        pids += [p.pid for p in psutil.Process(os.getppid()).parents()]
    except psutil.Error:  # no permission: the parent is enough
        log.debug("cannot list ancestor processes", exc_info=True)
    return pids


def running_servers(runtime_dir: str | None = None) -> list[dict[str, Any]]:
    """The ``jpserver-*.json`` runtime files of live server processes (what
    jupyter_server.serverapp.list_running_servers reads), in file-name order."""
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
        # pid_exists counts another user's live process too (EPERM)
        if isinstance(pid, int) and pid > 0 and psutil.pid_exists(pid):
            out.append(info)
    return out


def _root(server: dict[str, Any]) -> str | None:
    root = server.get("root_dir") or server.get("notebook_dir")  # notebook_dir: Notebook 6
    return os.path.realpath(root) if isinstance(root, str) and root else None


def discover_server(runtime_dir: str | None = None) -> dict[str, Any]:
    """The running server this process belongs to, as its runtime file describes it (``url``,
    ``token``, ``pid``, ...); raises ServerError (one line) when none is running or several are
    and none of them is an ancestor of this process or serves the current folder."""
    servers = running_servers(runtime_dir)
    if not servers:
        raise NoServerRunning("no running Jupyter server found")
    by_pid = {s.get("pid"): s for s in servers}
    for pid in _ancestors():
        if pid in by_pid:
            return by_pid[pid]
    if len(servers) == 1:
        return servers[0]
    cwd = os.path.realpath(os.getcwd())
    best, best_len = None, -1
    for s in servers:
        root = _root(s)
        if root and (cwd + os.sep).startswith(root.rstrip(os.sep) + os.sep) \
                and len(root) > best_len:
            best, best_len = s, len(root)
    if best is not None:
        return best
    raise ServerError(
        f"{len(servers)} Jupyter servers are running and none is this process's parent or "
        "serves the current folder; cannot tell which one to ask"
    )


def find_server(runtime_dir: str | None = None) -> dict[str, Any]:
    """The server running this kernel; raises ServerError (one line) when there is none."""
    url = os.environ.get("JUPYTER_PAUSE_SERVER_URL")
    if url:
        return {"url": url, "token": os.environ.get("JUPYTER_PAUSE_SERVER_TOKEN", ""), "pid": None}
    try:
        return discover_server(runtime_dir)
    except NoServerRunning as e:
        raise NoServerRunning(f"{e} for this kernel (is it running under JupyterLab / "
                              "jupyter server?)") from None


# The kernel a request comes from (its own id), on requests a cell sends. A header, not a body
# field: a server from before it ignores it, where its body schema would refuse the request.
FROM_KERNEL_HEADER = "X-Jupyter-Pause-Kernel"


def own_kernel_id() -> str | None:
    """This kernel's id in the server that started it: jupyter_client names the connection
    file ``kernel-<id>.json``. None when it was started some other way."""
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:  # noqa: BLE001 - not an ipykernel kernel, or no kernel app
        return None
    m = re.fullmatch(r"kernel-([A-Za-z0-9-]{1,100})\.json", name)
    return m.group(1) if m else None


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
    body: dict[str, Any] | None = None,
    timeout: float = 15.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """``method <base>/jupyter-pause/api/<endpoint>`` with the server's token; (status, json).
    ``headers``: more request headers (:data:`FROM_KERNEL_HEADER`)."""
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
    headers = {**(headers or {}), "Accept": "application/json"}
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
        raise ServerError(" ".join(f"the server refused: {msg} (HTTP {status})".split()), status,
                          payload)
    return status, payload
