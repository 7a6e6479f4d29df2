"""A real jupyter_server with jupyter_pause (and its idle monitor) in per-test tmp dirs."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.harness import InProcessServer, merge_config, pause_server_config, person_client
from tests.kerneldriver import run_cell


@pytest.fixture
def policy_config():
    """Per-test IdlePolicy traits (tests update this dict before the server starts)."""
    return {"enabled": True, "profile": "gpu-experiment", "interval": 3600.0,
            "profiles": {"gpu-experiment": {"idle_after": 60.0, "grace_period": 30.0}}}


@pytest.fixture
def jp_server_config(tmp_path, policy_config):
    for d in ("state", "store"):
        (tmp_path / d).mkdir(exist_ok=True)
    return merge_config(
        pause_server_config(tmp_path / "state", tmp_path / "store", tmp_path / "checkpoint.key",
                            busy_timeout=2.0, accelerator={"type": "test-gpu", "count": 1},
                            activity_interval=0),
        {"ServerApp": {"allow_unauthenticated_access": False},
         "IdlePolicy": dict(policy_config)})


class FakeClock:
    """A clock the test moves by hand, for the idle monitor."""

    def __init__(self, start: float):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Server(InProcessServer):
    """The server under test: sessions, cells, the pause and policy APIs, the monitor."""

    @property
    def monitor(self):
        return self.settings["jupyter_pause_idle_monitor"]

    async def open_notebook(self, path="nb.ipynb"):
        kid = (await self.new_session(path))["kernel"]["id"]
        await self.run(kid, "1")
        return kid

    async def run(self, kernel_id, code, *, wait=True):
        # a session of its own: a wait=False client stays open while the next one runs
        seen = self.watch_activity(kernel_id)
        kc = person_client(self.serverapp, kernel_id)
        kc.start_channels(hb=False)
        try:
            await kc.wait_for_ready(timeout=60)
            if not wait:
                kc.execute(code)
                return None
            out = await run_cell(kc, code, ready=None)
        finally:
            if wait:
                kc.stop_channels()
        out.check(code, allow_traceback=True)
        await self.server_read(kernel_id, out.reply, seen)
        return out.reply

    async def barrier(self, kernel_id):
        """Until jupyter_server has read every IOPub message the kernel sent so far: a person's
        kernel_info request (not activity to jupyter_server), whose trailing idle it reads after
        everything before it (one socket, in order)."""
        seen = self.watch_activity(kernel_id)
        kc = person_client(self.serverapp, kernel_id)
        kc.start_channels(hb=False)
        try:
            reply = await kc.kernel_info(reply=True, timeout=30)
        finally:
            kc.stop_channels()
        await self.server_read(kernel_id, reply, seen)

    def fake_clock(self, offset: float = 0.0) -> FakeClock:
        clock = FakeClock(time.time() + offset)
        self.monitor.clock = clock
        return clock


@pytest.fixture
def srv(jp_serverapp, jp_fetch, jp_asyncio_loop):
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
