"""Real Jupyter servers with jupyter_pause for the tests and benches.

- :func:`free_port`, :func:`free_ports`, :func:`wait_for`, :func:`stop_process`,
  :func:`kill_process`: what any test that runs a server in a subprocess needs (a hub, an
  object store, a Jupyter server).
- :func:`pause_server_config`: the config that loads jupyter_pause with its state directory,
  store and key at given paths, for a subprocess or pytest-jupyter's ``jp_server_config``.
- :class:`JupyterProcess`: a real ``jupyter server`` (or ``jupyter lab``) subprocess on a free
  port, its Jupyter directories under one home: started and waited for with a deadline, driven
  over REST with its token and over ZMQ with its kernels' connection files, stopped or killed.
- :class:`InProcessServer`: pytest-jupyter's in-process server (``jp_serverapp``/``jp_fetch``)
  driven the same way, for the tests that need no process of their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import psutil

from tests.kerneldriver import KernelDriver

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

T = TypeVar("T")

# `python -m jupyter_server` with SIGINT handled as Python does by default. A test run started in
# the background by a non-interactive shell (`cmd &`, as CI scripts do) inherits SIGINT ignored,
# and Python and jupyter_server rightly keep it ignored; the SIGINT tests model a person at a
# terminal or a spawner's stop.
SERVER_WITH_SIGINT = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'jupyter_server'; runpy.run_module('jupyter_server', run_name='__main__')"
)


class _PortTaken(RuntimeError):
    """The server could not bind the port chosen for it: another process took it first."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` different free ports: each socket stays bound until all are chosen, else the
    system may hand out the same port twice."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(what: str, check: Callable[[], T | None], timeout: float,
             interval: float = 0.1) -> T:
    """Poll ``check()`` until it returns something true; fail naming ``what`` after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def person_client(serverapp: Any, kernel_id: str) -> Any:
    """A client of a server's kernel as JupyterLab's is: a session of its own, whose id is not
    one of ours (jupyter_server leaves our own clients' requests out of the person's activity:
    ``jupyter_seams.keep_own_out``). Not the manager's session: see ``kernelclient``."""
    km = serverapp.kernel_manager.get_kernel(kernel_id)
    session = km.session.clone()
    session.session = secrets.token_hex(16)
    return km.client(session=session)


async def until(predicate: Callable[[], Any], timeout: float = 60.0,
                what: str = "condition") -> Any:
    """Poll ``predicate`` (sync or async) until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.05)


# Kernel code: a variable whose pickling announces itself (a marker file) and then takes
# `seconds`, so a test acts while a checkpoint is known to be under way.
SLOW_PICKLE = """
import pathlib, time
class Slow:
    def __init__(self, marker, seconds):
        self.marker, self.seconds = marker, seconds
    def __getstate__(self):
        pathlib.Path(self.marker).write_text("pickling")
        time.sleep(self.seconds)
        return {}
"""


def _end(proc: subprocess.Popen, grace: float | None) -> None:
    # Its children first listed: once it is gone they are reparented and out of reach.
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    if proc.poll() is None:
        if grace is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for p in children:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def stop_process(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM, SIGKILL after ``grace`` seconds; then kill whatever it started that is left
    (kernels, a proxy, single-user servers)."""
    _end(proc, grace)


def kill_process(proc: subprocess.Popen) -> None:
    """SIGKILL the process and everything it started, as when a pod dies."""
    _end(proc, None)


def pause_server_config(state_dir: Path | str, store_url: Path | str, key_path: Path | str,
                        **pause: Any) -> dict[str, dict[str, Any]]:
    """Server config that loads jupyter_pause with its state, store and key at these paths
    (``pause``: more PauseApp traits). Autosave is off unless asked for (``autosave=True``):
    the tests of other features count the checkpoints in the store."""
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_pause": True}},
        "PauseApp": {"state_dir": str(state_dir), "store_url": str(store_url),
                     "key_path": str(key_path), "autosave": False, **pause},
    }


def merge_config(*configs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Configs section by section, later traits over earlier ones."""
    out: dict[str, dict[str, Any]] = {}
    for config in configs:
        for section, traits in config.items():
            out.setdefault(section, {}).update(traits)
    return out


class JupyterProcess:
    """A real Jupyter server subprocess with its config, config/data/runtime directories under
    ``home`` (kept across restarts, as a persistent volume keeps them) and a token."""

    #: what ``python -m`` runs, or None for ``jupyter server`` with SIGINT at its default
    module: str | None = None
    name = "jupyter server"

    def __init__(self, home: Path, config: Mapping[str, Mapping[str, Any]] | None = None, *,
                 token: str | None = None, root: Path | None = None,
                 env: Mapping[str, str] | None = None,
                 args: Sequence[str] = (), start_timeout: float = 60.0):
        """``config``: written to ``home/config/jupyter_server_config.json`` over the defaults
        (no browser, this root, this token); ``args``: more command-line options. The token is
        this server's own unless given: a request left over from another test run that meets
        this server on a reused port is refused, never obeyed."""
        self.home = home
        self.root = root or home / "root"
        self.token = token or secrets.token_hex(16)
        self.args = list(args)
        self.start_timeout = start_timeout
        for d in (home, home / "config", self.root):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"),
                    "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
                    "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_PLATFORM_DIRS": "1",
                    **(env or {})}
        defaults = {
            "ServerApp": {"allow_root": True, "open_browser": False, "port_retries": 0,
                          "root_dir": str(self.root)},
            "IdentityProvider": {"token": self.token},
        }
        (home / "config" / "jupyter_server_config.json").write_text(
            json.dumps(merge_config(defaults, config or {})))
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    # ------------------------------------------------------------------------ the process

    def command(self) -> list[str]:
        """The server's command line (``self.port`` is chosen by then)."""
        launch = (["-m", self.module] if self.module else ["-c", SERVER_WITH_SIGINT])
        return [sys.executable, *launch, f"--ServerApp.port={self.port}",
                "--ServerApp.ip=127.0.0.1", *self.args]

    def start(self) -> Self:
        """Start the server on a free port; return once its REST API answers (its log in the
        error where it exits first or does not answer in time). A port that another process
        bound between ``free_port`` choosing it and the server binding it (two test runs on
        one machine) is not the server's failure: a new port, up to three times."""
        for _ in range(2):
            try:
                return self._start()
            except _PortTaken:
                pass
        return self._start()

    def _start(self) -> Self:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = self.home / f"server-{self.port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed when the server ends
        self.proc = subprocess.Popen(self.command(), cwd=self.root, env=self.env,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                if self._log is not None:
                    self._log.close()
                if f"port {self.port} is not available" in tail:
                    raise _PortTaken(tail)
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before "
                                   f"answering:\n{tail}")
            try:
                self.request("GET", "api/status", timeout=2)
                return self
            except (OSError, ValueError):  # not listening yet, or answering half started
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{self.name} did not answer in {self.start_timeout:g} s:\n"
                           f"{self.log_tail()}")

    def stop(self, grace: float = 20.0) -> None:
        """Shut the server down through its API (kernels too); signals if it does not end."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.request("POST", "api/shutdown", timeout=5)
            except (OSError, ValueError):  # already going down, or hung: signals below
                pass
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                stop_process(self.proc, 10)
        self._close_log()

    def kill(self) -> None:
        """SIGKILL the server and its kernels, as when a pod dies."""
        kill_process(self.proc)
        self._close_log()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the server alone (not its kernels)."""
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code once the server ended, or None if it still runs after ``timeout``."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._close_log()
        return code

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()

    def log_text(self) -> str:
        if self._log is not None and not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_tail(self, size: int = 6000) -> str:
        """The end of the server's log, for a failure message."""
        return self.log_text()[-size:]

    # ------------------------------------------------------------------------ REST

    def call(self, method: str, path: str, body: Any = None,
             timeout: float = 30) -> tuple[int, Any]:
        """(status code, JSON body) of a request with the token; HTTP errors are answers too."""
        try:
            return self._send(method, path, body, timeout)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 30) -> Any:
        """The JSON answer (None for an empty one) of a request with the token; an HTTP error
        raises :class:`urllib.error.HTTPError`."""
        return self._send(method, path, body, timeout)[1]

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def _send(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path.lstrip("/"), data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")

    def open_notebook(self, path: str) -> dict[str, Any]:
        """POST /api/sessions, as JupyterLab does when it opens a notebook: the session model."""
        return self.request("POST", "api/sessions", {"path": path, "name": path,
                                                      "type": "notebook",
                                                      "kernel": {"name": "python3"}})

    # ------------------------------------------------------------------------ kernels

    def kernel_client(self, kernel_id: str) -> Any:
        """A started blocking client of the kernel, from its connection file."""
        from jupyter_client.blocking import BlockingKernelClient

        info = json.loads((self.home / "runtime" / f"kernel-{kernel_id}.json").read_text())
        kc = BlockingKernelClient()
        kc.load_connection_info(info)
        # No heartbeat: a kernel still starting on a busy machine misses its 1 s deadline and
        # reads as dead ("Kernel died before replying to kernel_info"); the callers' timeouts
        # bound the wait instead.
        kc.start_channels(hb=False)
        return kc

    def driver(self, kernel_id: str) -> KernelDriver:
        """A :class:`KernelDriver` of the kernel, ready (close it, or use it in ``with``)."""
        k = KernelDriver(self.kernel_client(kernel_id))
        try:
            return k.ready()
        except BaseException:
            k.close()
            raise

    def output(self, kernel_id: str, code: str, timeout: float = 120) -> str:
        """Run a cell; its stdout (fails on an error in the cell)."""
        with self.driver(kernel_id) as k:
            return k.ok(code, timeout=timeout, allow_traceback=True).stdout

    def send(self, code: str, kernel_id: str) -> None:
        """Start a cell and do not wait for it (a kernel left busy)."""
        with self.driver(kernel_id) as k:
            k.start(code)


class InProcessServer:
    """pytest-jupyter's in-process server with jupyter_pause: the pause API through
    ``jp_fetch``, sessions, its kernels, the journal."""

    def __init__(self, serverapp: Any, fetch: Any):
        self.serverapp = serverapp
        self.fetch = fetch
        self.settings = serverapp.web_app.settings
        self.lifecycle = self.settings["jupyter_pause_lifecycle"]

    async def api(self, method: str, route: str, body: Any = None,
                  params: dict[str, Any] | None = None) -> Any:
        """The JSON answer of ``jupyter-pause/api/<route>``."""
        r = await self.fetch("jupyter-pause", "api", *route.split("/"), method=method,
                             params=params,
                             body=None if method in ("GET", "DELETE") else json.dumps(body or {}))
        return json.loads(r.body) if r.body else None

    async def new_session(self, path: str) -> dict[str, Any]:
        """POST /api/sessions, as JupyterLab does when it opens a notebook: the session model."""
        r = await self.fetch("api", "sessions", method="POST", body=json.dumps(
            {"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}))
        return json.loads(r.body)

    def watch_activity(self, kernel_id: str) -> set[str] | None:
        """The ids of the requests whose trailing ``status: idle`` jupyter_server's activity
        watch (``MappingKernelManager.start_watching_activity``) has read, from now on; None
        without one. That watch reads IOPub on a socket of its own, so it can lag a client's
        reply: until it has read a cell's idle, ``execution_state`` may still be the one from
        before the cell. Wraps its callback (pyzmq's ``ZMQStream``), once per stream."""
        km = self.serverapp.kernel_manager
        kernel = km.get_kernel(kernel_id) if kernel_id in km else None
        stream = getattr(kernel, "_activity_stream", None)
        if stream is None:
            return None
        record = stream._recv_callback
        seen: set[str] | None = getattr(record, "idle_read", None)
        if seen is not None:
            return seen
        seen = set()
        # a session of its own: a Session refuses a message it has read before ("Duplicate
        # Signature"), and another wrapper of this stream may read the same message
        session = kernel.session.clone()

        def read(msg_list: list[bytes]) -> None:
            record(msg_list)
            try:
                _, fed = session.feed_identities(msg_list)
                msg = session.deserialize(fed)
            except Exception:  # noqa: BLE001 - not a message the server could read either
                return
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                seen.add(msg["parent_header"].get("msg_id"))

        read.idle_read = seen  # type: ignore[attr-defined]
        read.__wrapped__ = record  # type: ignore[attr-defined]
        stream.on_recv(read)
        return seen

    async def server_read(self, kernel_id: str, reply: dict[str, Any], seen: set[str] | None,
                          timeout: float = 30.0) -> None:
        """Until jupyter_server has read the trailing idle of the request ``reply`` answers
        (``seen``: :meth:`watch_activity` from before the request), or the kernel is gone.
        Without a watch to read (``seen`` None: the kernel was still starting), until it reads
        the kernel as not busy."""
        msg_id = reply["parent_header"].get("msg_id")
        km = self.serverapp.kernel_manager
        deadline = time.monotonic() + timeout

        def read() -> bool:
            if kernel_id not in km:
                return True
            state = km.get_kernel(kernel_id).execution_state
            if state == "dead":
                return True
            return msg_id in seen if seen is not None else state != "busy"

        while not read():
            if time.monotonic() > deadline:
                raise AssertionError(f"jupyter_server did not read the end of {msg_id} in "
                                     f"{timeout:g} s")
            await asyncio.sleep(0.02)

    def journal(self) -> list[dict[str, Any]]:
        path = self.lifecycle.journal.journal_path
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
