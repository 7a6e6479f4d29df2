"""A real JupyterHub for tests: the dummy authenticator, SimpleLocalProcessSpawner (one
``jupyterhub-singleuser`` process per user, as the current user), configurable-http-proxy, and
a service token to drive the hub's REST API and reach ``/user/<name>/`` through the proxy.

Each user's home (``<tmp>/home/<name>``) holds that user's Jupyter directories and the
jupyter_pause state directory, store and key, so two spawns share them as two pods share a
home volume. The proxy is configurable-http-proxy from npm; ``CHP_BIN`` names it
(``tests/run.sh`` installs it and exports it), else it is looked up on PATH.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from tornado.ioloop import IOLoop

from tests.harness import free_ports, stop_process, wait_for
from tests.kerneldriver import run_websocket

TOKEN = "hub-test-service-token-" + secrets.token_hex(8)


def chp_bin() -> str | None:
    """The configurable-http-proxy executable, or None where it is not installed."""
    env = os.environ.get("CHP_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    # where tests/run.sh installs it, so a plain `pytest` after one run.sh finds it too
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    cached = os.path.join(cache, "jupyter-pause-chp", "node_modules", ".bin",
                          "configurable-http-proxy")
    if os.access(cached, os.X_OK):
        return cached
    return shutil.which("configurable-http-proxy")


class Hub:
    """A JupyterHub process with its proxy; users' homes under ``tmp/home``."""

    def __init__(self, tmp: Path, chp: str, pause: dict[str, Any] | None = None,
                 culler: list[str] | None = None, activity_interval: int | None = None):
        self.tmp = tmp
        self.dir = tmp / "hub"
        self.dir.mkdir(parents=True)
        self.home_root = tmp / "home"
        self.home_root.mkdir()
        self.port, self.hub_port, self.api_port = free_ports(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.pause = pause or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "hub.log"
        self._write_config(chp, culler, activity_interval)

    # ----------------------------------------------------------------------------- set up

    def _write_config(self, chp: str, culler: list[str] | None,
                      activity_interval: int | None) -> None:
        singleuser = str(Path(sys.executable).with_name("jupyterhub-singleuser"))
        home = str(self.home_root) + "/{username}"
        services: list[dict[str, Any]] = [{"name": "tester", "api_token": TOKEN}]
        roles: list[dict[str, Any]] = [{
            "name": "tester", "services": ["tester"],
            # access:servers reaches /user/<name>/ with this token; admin:server_state shows
            # the spawner's state (the server's PID).
            "scopes": ["admin:users", "admin:servers", "admin:server_state", "access:servers",
                       "list:users"]}]
        if culler is not None:
            services.append({"name": "idle-culler",
                             "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                                         *culler]})
            roles.append({"name": "idle-culler", "services": ["idle-culler"],
                          "scopes": ["list:users", "read:users:activity", "read:servers",
                                     "delete:servers"]})
        args = ["--allow-root"] if os.geteuid() == 0 else []
        # How often each server tells the hub its last activity (what the culler judges by);
        # jupyterhub-singleuser's default is every 300 s.
        activity = ({"JUPYTERHUB_ACTIVITY_INTERVAL": str(activity_interval)}
                    if activity_interval else {})
        config = f"""
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {self.hub_port}
c.JupyterHub.db_url = "sqlite:///{self.dir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{self.dir}/cookie_secret"
c.JupyterHub.pid_file = "{self.dir}/jupyterhub.pid"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.pid_file = "{self.dir}/proxy.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {home!r}
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = {args!r}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
# A spawner passes only a few variables on; these put every Jupyter directory in the home.
c.Spawner.environment = {{
    "JUPYTER_CONFIG_DIR": lambda s: s.home_dir + "/.jupyter",
    "JUPYTER_DATA_DIR": lambda s: s.home_dir + "/.local/share/jupyter",
    "JUPYTER_RUNTIME_DIR": lambda s: s.home_dir + "/.local/share/jupyter/runtime",
    "JUPYTER_PLATFORM_DIRS": "1",
    **{activity!r},
}}
c.JupyterHub.services = {services!r}
c.JupyterHub.load_roles = {roles!r}
"""
        (self.dir / "jupyterhub_config.py").write_text(config)

    def prepare_home(self, user: str) -> Path:
        """The user's home with a jupyter_server config that puts jupyter_pause's state, store
        and key there (as a home volume would hold them)."""
        home = self.home_root / user
        conf = home / ".jupyter"
        conf.mkdir(parents=True, exist_ok=True)
        pause_dir = home / ".jupyter-pause"
        (conf / "jupyter_server_config.json").write_text(json.dumps({
            "ServerApp": {"jpserver_extensions": {"jupyter_pause": True}},
            "PauseApp": {"state_dir": str(pause_dir / "state"),
                         "store_url": str(pause_dir / "checkpoints"),
                         "key_path": str(pause_dir / "checkpoint.key"), **self.pause},
        }))
        return home

    def start(self) -> None:
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.dir / "jupyterhub_config.py")],
            cwd=self.dir, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the hub exited:\n{self.log_tail()}")
            try:
                self.request("GET", "/hub/api/")
            except (OSError, urllib.error.HTTPError):
                return False
            return True

        wait_for("the hub's API through the proxy", up, 90, 0.2)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the hub, its proxy and every server and kernel it started."""
        if self.proc is None:
            return
        stop_process(self.proc, 30)
        self.log.close()

    # ---------------------------------------------------------------------------- requests

    def request(self, method: str, path: str, body: Any = None,
                timeout: float = 60) -> tuple[int, Any]:
        """``(status, JSON body)`` of a request to the proxy with the service token."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {TOKEN}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            try:
                return r.status, json.loads(raw or b"null")
            except ValueError:
                return r.status, raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    def user_model(self, user: str) -> dict[str, Any]:
        return self.get(f"/hub/api/users/{user}")

    def server(self, user: str) -> dict[str, Any] | None:
        return (self.user_model(user).get("servers") or {}).get("")

    def start_server(self, user: str, timeout: float = 120) -> int:
        """Start ``user``'s server through the hub's REST API; its PID once it is ready."""
        try:
            self.request("POST", f"/hub/api/users/{user}")
        except urllib.error.HTTPError as e:
            if e.code != 409:  # already exists
                raise
        self.request("POST", f"/hub/api/users/{user}/server")

        def ready() -> dict[str, Any] | None:
            s = self.server(user)
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the hub exited:\n{self.log_tail()}")
            return s if s and s.get("ready") else None

        model = wait_for(f"{user}'s server to be ready", ready, timeout, 0.2)
        # Ready in the hub, and routed by the proxy to a server with jupyter_pause loaded.
        wait_for(f"{user}'s jupyter_pause through the proxy",
                 lambda: self._answers(f"/user/{user}/jupyter-pause/api/status"), 60, 0.2)
        return int(model["state"]["pid"])

    def _answers(self, path: str) -> bool:
        try:
            return self.request("GET", path)[0] == 200
        except (OSError, urllib.error.HTTPError):
            return False

    def stop_server(self, user: str, timeout: float = 90) -> None:
        """What jupyterhub-idle-culler does: ``DELETE /hub/api/users/<name>/server``, then
        wait until the hub no longer lists the server."""
        self.request("DELETE", f"/hub/api/users/{user}/server", timeout=timeout)
        wait_for(f"{user}'s server to stop", lambda: self.server(user) is None, timeout, 0.2)

    # ------------------------------------------------------------------ the user's server

    def open_notebook(self, user: str, path: str) -> str:
        """``POST /user/<name>/api/sessions`` as JupyterLab does; the kernel's id."""
        _, model = self.request("POST", f"/user/{user}/api/sessions",
                                {"path": path, "name": path, "type": "notebook",
                                 "kernel": {"name": "python3"}}, timeout=120)
        return model["kernel"]["id"]

    def run_cell(self, user: str, kernel_id: str, code: str, timeout: float = 60) -> str:
        """Run a cell over the kernel's websocket through the proxy; its stdout (an error in
        the cell fails the test)."""
        ws_url = (f"ws://127.0.0.1:{self.port}/user/{user}/api/kernels/{kernel_id}/channels"
                  f"?session_id={uuid.uuid4().hex}")
        out = IOLoop().run_sync(lambda: run_websocket(ws_url, code, token=TOKEN, timeout=timeout),
                                timeout=timeout + 10)
        return out.check(code, allow_traceback=True).stdout

