"""A real `jupyter server` process with jupyter_pause enabled, for tests that need a process
(signals, SIGKILL, the shutdown API, the CLI): start, stop, kill and start it again on the same
directories."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

# `python -m jupyter_server` with SIGINT handled as Python does by default. A test run started in
# the background by a non-interactive shell (`cmd &`, as CI scripts do) inherits SIGINT ignored,
# and Python and jupyter_server rightly keep it ignored; the SIGINT tests model a person at a
# terminal or a spawner's stop.
SERVER_WITH_SIGINT = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'jupyter_server'; runpy.run_module('jupyter_server', run_name='__main__')"
)

TOKEN = "cli-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `jupyter server` process with jupyter_pause, its directories under ``tmp`` (kept
    across restarts, as a persistent volume keeps them)."""

    def __init__(self, tmp: Path, pause: dict[str, Any] | None = None, *,
                 shared: Path | None = None):
        """``shared``: where the state directory, store and key live when several servers
        share them (default: ``tmp``)."""
        self.tmp = tmp
        tmp.mkdir(exist_ok=True)
        shared = shared or tmp
        self.env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"),
                    "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
                    "JUPYTER_DATA_DIR": str(tmp / "data"), "JUPYTER_PLATFORM_DIRS": "1"}
        (tmp / "config").mkdir()
        (tmp / "root").mkdir()
        (tmp / "config" / "jupyter_server_config.json").write_text(json.dumps({
            "ServerApp": {"jpserver_extensions": {"jupyter_pause": True},
                          "allow_root": True, "open_browser": False, "port_retries": 0,
                          "root_dir": str(tmp / "root")},
            "IdentityProvider": {"token": TOKEN},
            "PauseApp": {"state_dir": str(shared / "state"), "store_url": str(shared / "store"),
                         "key_path": str(shared / "key"), "activity_interval": 0,
                         **(pause or {})},
        }))
        self.proc = None

    def start(self):
        """Start the server as a terminal or a spawner does, with SIGINT at its default."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = self.tmp / f"server-{self.port}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_WITH_SIGINT, f"--port={self.port}", "--ip=127.0.0.1"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.call("GET", "api/status")
                return self
            except OSError:
                assert self.proc.poll() is None, self.log_path.read_text()
                time.sleep(0.2)
        raise TimeoutError(f"server did not start: {self.log_path.read_text()}")

    def request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {TOKEN}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")

    def get(self, path):
        return self.request("GET", path)

    def call(self, method, path, body=None):
        """(status code, JSON body) of a request; HTTP errors are answers too."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {TOKEN}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def state(self, *states, timeout=90):
        """The status once the workspace is in one of ``states`` with no flight running."""
        deadline = time.monotonic() + timeout
        while True:
            _, st = self.call("GET", "jupyter-pause/api/status")
            if st["state"] in states and st["flight"] is None:
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"state {st['state']} after {timeout} s: {st}")
            time.sleep(0.2)

    def kill(self):
        """SIGKILL the server and its kernels, as when a pod dies."""
        procs = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.log.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            try:
                self.request("POST", "api/shutdown")
                self.proc.wait(20)
            except Exception:  # noqa: BLE001 - fall back to a kill
                self.kill()
        self.log.close()

    def cli(self, *args, env=None):
        r = subprocess.run([sys.executable, "-m", "jupyter_pause.cli", *args],
                           env=env or self.env, capture_output=True, text=True, timeout=120,
                           check=False)
        return r.returncode, r.stdout + r.stderr

    def run_cell(self, kernel_id, code):
        self.output(kernel_id, code)

    # ------------------------------------------------------------------ used by the stop tests

    def open_notebook(self, path: str) -> dict[str, Any]:
        """POST /api/sessions, as JupyterLab does when it opens a notebook: the session model."""
        return self.request("POST", "api/sessions", {"path": path, "name": path,
                                                      "type": "notebook",
                                                      "kernel": {"name": "python3"}})

    def output(self, kernel_id: str, code: str) -> str:
        """Run a cell; its stdout (fails the test on an error in the cell)."""
        from jupyter_client.blocking import BlockingKernelClient

        info = json.loads((self.tmp / "runtime" / f"kernel-{kernel_id}.json").read_text())
        kc = BlockingKernelClient()
        kc.load_connection_info(info)
        kc.start_channels()
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])

        try:
            # Until the IOPub subscription is up the kernel's output and idle would be lost
            # (a slow joiner): wait_for_ready returns once IOPub delivered a message.
            kc.wait_for_ready(timeout=60)
            reply = kc.execute_interactive(code, timeout=120, output_hook=hook)
            assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            kc.stop_channels()
        return "".join(out)

    def send(self, code: str, kernel_id: str) -> None:
        """Start a cell and do not wait for it (a kernel left busy)."""
        from jupyter_client.blocking import BlockingKernelClient

        info = json.loads((self.tmp / "runtime" / f"kernel-{kernel_id}.json").read_text())
        kc = BlockingKernelClient()
        kc.load_connection_info(info)
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            msg_id = kc.execute(code)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # closing at once could drop the request
                msg = kc.get_iopub_msg(timeout=60)
                if (msg["parent_header"].get("msg_id") == msg_id
                        and msg["msg_type"] == "execute_input"):
                    return
            raise TimeoutError("the cell did not start")
        finally:
            kc.stop_channels()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code once the server ended, or None if it still runs after ``timeout``."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.log.close()
        return code

    def log_tail(self, size: int = 6000) -> str:
        """The end of the server's log, for a failure message."""
        self.log.flush()
        return self.log_path.read_bytes()[-size:].decode(errors="replace")

    def journal(self) -> list[dict[str, Any]]:
        path = self.tmp / "state" / "journal.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written
                pass
        return out

    def wait_for(self, what: str, check: Any, timeout: float = 60) -> Any:
        """Poll ``check()`` until it returns something true; fail with ``what`` after timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")
