"""A real jupyter_server with jupyter_pause (and its idle monitor) in per-test tmp dirs."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def policy_config():
    """Per-test IdlePolicy traits (tests update this dict before the server starts)."""
    return {"enabled": True, "profile": "gpu-experiment", "interval": 3600.0,
            "profiles": {"gpu-experiment": {"idle_after": 60.0, "grace_period": 30.0}}}


@pytest.fixture
def jp_server_config(tmp_path, policy_config):
    for d in ("state", "store"):
        (tmp_path / d).mkdir(exist_ok=True)
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_pause": True},
                      "allow_unauthenticated_access": False},
        "PauseApp": {"state_dir": str(tmp_path / "state"), "store_url": str(tmp_path / "store"),
                     "key_path": str(tmp_path / "checkpoint.key"), "busy_timeout": 2.0,
                     "accelerator": {"type": "test-gpu", "count": 1}, "activity_interval": 0},
        "IdlePolicy": dict(policy_config),
    }


class FakeClock:
    def __init__(self, start: float):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Server:
    """The server under test: sessions, cells, the pause and policy APIs, the monitor."""

    def __init__(self, serverapp, fetch):
        self.serverapp = serverapp
        self.fetch = fetch
        self.settings = serverapp.web_app.settings
        self.lifecycle = self.settings["jupyter_pause_lifecycle"]

    @property
    def monitor(self):
        return self.settings["jupyter_pause_idle_monitor"]

    async def api(self, method, route, body=None, params=None):
        r = await self.fetch("jupyter-pause", "api", *route.split("/"), method=method,
                             params=params,
                             body=None if method in ("GET", "DELETE") else json.dumps(body or {}))
        return json.loads(r.body) if r.body else None

    async def open_notebook(self, path="nb.ipynb"):
        r = await self.fetch("api", "sessions", method="POST", body=json.dumps(
            {"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}))
        model = json.loads(r.body)
        kid = model["kernel"]["id"]
        await self.run(kid, "1")
        return kid

    async def run(self, kernel_id, code, *, wait=True):
        from jupyter_pause.kernel.client import own_client

        # a session of its own: a wait=False client stays open while the next one runs
        kc = own_client(self.serverapp.kernel_manager.get_kernel(kernel_id))
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            if not wait:
                kc.execute(code)
                return None
            reply = await kc.execute_interactive(code, timeout=120, output_hook=lambda m: None)
        finally:
            if wait:
                kc.stop_channels()
        assert reply["content"]["status"] == "ok", reply["content"]
        await self.settled(kernel_id)
        return reply

    async def settled(self, kernel_id, timeout=10.0):
        """Until the server has seen the kernel's trailing ``status: idle``."""
        import asyncio

        kernel = self.serverapp.kernel_manager.get_kernel(kernel_id)
        for _ in range(int(timeout / 0.05)):
            if kernel.execution_state == "idle":
                return
            await asyncio.sleep(0.05)

    def journal(self):
        path = self.lifecycle.journal.journal_path
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def fake_clock(self, offset: float = 0.0) -> FakeClock:
        import time

        clock = FakeClock(time.time() + offset)
        self.monitor.clock = clock
        return clock


@pytest.fixture
def srv(jp_serverapp, jp_fetch, jp_asyncio_loop):
    import asyncio

    async def started():
        # A real server starts extensions once its loop runs (ServerApp._post_start);
        # pytest-jupyter never runs that loop, so start ours here as the server would.
        await jp_serverapp.extension_manager.start_extension("jupyter_pause")
        for _ in range(100):
            if "jupyter_pause_idle_monitor" in jp_serverapp.web_app.settings:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the idle monitor did not start")

    jp_asyncio_loop.run_until_complete(started())
    return Server(jp_serverapp, jp_fetch)
