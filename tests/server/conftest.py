"""A real jupyter_server with jupyter_pause enabled, state and checkpoints in per-test tmp dirs."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time

import pytest

from tests.harness import InProcessServer, merge_config, pause_server_config, person_client
from tests.kerneldriver import run_cell


@pytest.fixture
def pause_dirs(tmp_path):
    dirs = {name: tmp_path / name for name in ("state", "store")}
    for d in dirs.values():
        d.mkdir()
    dirs["key"] = tmp_path / "checkpoint.key"
    return dirs


@pytest.fixture
def pause_config():
    """Per-test config: PauseApp and LocalBackend traits, and any other section (tests update
    this dict, or parametrize it)."""
    return {"PauseApp": {}, "LocalBackend": {}}


@pytest.fixture
def jp_server_config(pause_dirs, pause_config):
    return merge_config(
        pause_server_config(pause_dirs["state"], pause_dirs["store"], pause_dirs["key"]),
        {"ServerApp": {"allow_unauthenticated_access": False},
         "PauseApp": {"busy_timeout": 2.0, "accelerator": {"type": "test-gpu", "count": 1},
                      "activity_interval": 0, **pause_config.get("PauseApp", {})}},
        {k: v for k, v in pause_config.items() if k != "PauseApp"})


class Workspace(InProcessServer):
    """Drives the server under test: sessions, code in kernels, the pause API."""

    async def status(self):
        return await self.api("GET", "status")

    async def open_notebook(self, path="nb.ipynb"):
        model = await self.new_session(path)
        await self.wait_ready(model["kernel"]["id"])
        return model

    def client(self, kernel_id):
        kc = person_client(self.serverapp, kernel_id)
        kc.start_channels(hb=False)
        return kc

    async def wait_ready(self, kernel_id):
        kc = self.client(kernel_id)
        try:
            await kc.wait_for_ready(timeout=60)
        finally:
            kc.stop_channels()

    async def run(self, kernel_id, code, *, silent=False):
        """Run a cell; return its stdout (raises on an error in the cell)."""
        seen = self.watch_activity(kernel_id)
        kc = self.client(kernel_id)
        try:
            out = await run_cell(kc, code, silent=silent)
        finally:
            kc.stop_channels()
        out.check(code, allow_traceback=True)
        # what the server reads of the kernel (execution_state) is after the cell from here on
        await self.server_read(kernel_id, out.reply, seen)
        return out.stdout

    async def start_cell(self, kernel_id, code, timeout=60):
        """Start a long-running cell; return its task once the kernel runs it, not merely has
        it queued or in flight. The cell first creates a marker file: the server's
        ``execution_state`` cannot tell, since it may still read the "busy" of the previous
        cell (the activity watch can handle that status after the cell's reply arrived)."""
        marker = os.path.join(tempfile.mkdtemp(prefix="jp-cell-"), "started")
        task = asyncio.ensure_future(
            self.run(kernel_id, f"open({marker!r}, 'w').close()\n{code}"))
        deadline = time.monotonic() + timeout
        while not os.path.exists(marker):
            if task.done():
                task.result()  # the cell failed before it started: say why
            if time.monotonic() > deadline:
                task.cancel()
                raise AssertionError(f"the cell did not start within {timeout} s")
            await asyncio.sleep(0.05)
        shutil.rmtree(os.path.dirname(marker), ignore_errors=True)
        return task

    async def flight(self, kind, body=None):
        """POST pause|resume and wait for the flight to end; returns the final status."""
        r = await self.api("POST", kind, body)
        await self.lifecycle.wait()
        return r["flight"], await self.status()


@pytest.fixture
def ws(jp_serverapp, jp_fetch, jp_asyncio_loop):
    # What a real server does once its event loop runs (ServerApp._post_start); pytest-jupyter
    # never runs the loop's start, so without this no extension's start would run.
    jp_asyncio_loop.run_until_complete(jp_serverapp.extension_manager.start_all_extensions())
    return Workspace(jp_serverapp, jp_fetch)
