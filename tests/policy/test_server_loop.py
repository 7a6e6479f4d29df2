"""The monitor's own loop in a running server, real clock: a cpu-small workspace is stopped
(``mode="stop"``: no checkpoint) and comes back with a fresh kernel."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def policy_config():
    return {"enabled": True, "profile": "cpu-small", "interval": 0.2,
            "profiles": {"cpu-small": {"idle_after": 1.0, "grace_period": 0.0}}}


async def test_loop_auto_pauses_an_idle_workspace(srv):
    kid = await srv.open_notebook()
    await srv.run(kid, "kept = 41 + 1")
    for _ in range(300):  # the loop (every 0.2 s) sees 1 s of idleness and pauses
        if srv.lifecycle.state["state"] == "paused":
            break
        await asyncio.sleep(0.1)
    assert srv.lifecycle.state["state"] == "paused"
    p = await srv.api("GET", "policy")
    assert p["profile"]["action"] == "stop" and p["state"] == "inactive"
    # cpu-small's action is "stop": no checkpoint, no snapshot, only the kernels go down
    events = [e["event"] for e in srv.journal()]
    assert "accelerator_released" in events
    assert "checkpoint_written" not in events and "snapshot_ready" not in events
    (req,) = [e for e in srv.journal() if e["event"] == "pause_requested"]
    assert req["trigger"] == "idle" and req["mode"] == "stop"
    assert not srv.serverapp.kernel_manager.list_kernel_ids()  # the kernels are gone
    # and the resume starts a fresh kernel (nothing to restore), never "restored"
    await srv.api("POST", "resume")
    await srv.lifecycle.wait()
    st = await srv.api("GET", "status")
    assert st["state"] == "ready" and st["outcome"] == "fresh", st
    assert [k["outcome"] for k in st["last_report"]["kernels"]] == ["fresh"]
