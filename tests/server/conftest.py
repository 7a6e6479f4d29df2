"""A real jupyter_server with jupyter_pause enabled, state and checkpoints in per-test tmp dirs."""

from __future__ import annotations

import pytest


@pytest.fixture
def pause_dirs(tmp_path):
    dirs = {name: tmp_path / name for name in ("state", "store")}
    for d in dirs.values():
        d.mkdir()
    dirs["key"] = tmp_path / "checkpoint.key"
    return dirs


@pytest.fixture
def pause_config():
    """Per-test overrides of PauseApp/LocalBackend traits (tests update this dict)."""
    return {"PauseApp": {}, "LocalBackend": {}}


@pytest.fixture
def jp_server_config(pause_dirs, pause_config):
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_pause": True},
            "allow_unauthenticated_access": False,
        },
        "PauseApp": {
            "state_dir": str(pause_dirs["state"]),
            "store_url": str(pause_dirs["store"]),
            "key_path": str(pause_dirs["key"]),
            "busy_timeout": 2.0,
            "accelerator": {"type": "test-gpu", "count": 1},
            "activity_interval": 0,
            **pause_config["PauseApp"],
        },
        "LocalBackend": dict(pause_config["LocalBackend"]),
    }


class Workspace:
    """Drives the server under test: sessions, code in kernels, the pause API."""

    def __init__(self, serverapp, fetch):
        self.serverapp = serverapp
        self.fetch = fetch
        self.lifecycle = serverapp.web_app.settings["jupyter_pause_lifecycle"]

    async def api(self, method, route, body=None):
        import json

        r = await self.fetch("jupyter-pause", "api", *route.split("/"), method=method,
                             body=None if method in ("GET", "DELETE") else json.dumps(body or {}))
        return json.loads(r.body) if r.body else None

    async def status(self):
        return await self.api("GET", "status")

    async def open_notebook(self, path="nb.ipynb"):
        import json

        r = await self.fetch("api", "sessions", method="POST", body=json.dumps(
            {"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}))
        model = json.loads(r.body)
        await self.wait_ready(model["kernel"]["id"])
        return model

    def client(self, kernel_id):
        from jupyter_pause.server.kernels import own_client

        kc = own_client(self.serverapp, kernel_id)
        kc.start_channels()
        return kc

    async def wait_ready(self, kernel_id):
        kc = self.client(kernel_id)
        try:
            await kc.wait_for_ready(timeout=60)
        finally:
            kc.stop_channels()

    async def run(self, kernel_id, code, *, silent=False):
        """Run a cell; return its stdout (raises on an error in the cell)."""
        out = []

        def hook(msg):
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])

        kc = self.client(kernel_id)
        try:
            # execute_interactive ends on IOPub's idle: first make sure IOPub is subscribed
            await kc.wait_for_ready(timeout=60)
            reply = await kc.execute_interactive(code, silent=silent, timeout=120,
                                                 output_hook=hook)
        finally:
            kc.stop_channels()
        content = reply["content"]
        assert content["status"] == "ok", f"{content.get('ename')}: {content.get('evalue')}"
        return "".join(out)

    async def flight(self, kind, body=None):
        """POST pause|resume and wait for the flight to end; returns the final status."""
        r = await self.api("POST", kind, body)
        await self.lifecycle.wait()
        return r["flight"], await self.status()

    def journal(self):
        import json

        path = self.lifecycle.journal.journal_path
        return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def ws(jp_serverapp, jp_fetch):
    return Workspace(jp_serverapp, jp_fetch)
