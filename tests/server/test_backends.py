"""The lifecycle around backends that refuse, fail, or wait for capacity."""

from __future__ import annotations

import asyncio
import json

import pytest
from tornado.httpclient import HTTPClientError

pytestmark = pytest.mark.timeout(180)


def config(backend):
    return {"PauseApp": {"backend": f"pause_test_backends.{backend}"}, "LocalBackend": {}}


@pytest.mark.parametrize("pause_config", [config("NotConfigured")])
async def test_backend_that_cannot_pause_refuses(ws):
    await ws.status()  # refreshes the backend's description
    await asyncio.sleep(0.1)
    st = await ws.status()
    assert st["backend"]["can_pause"] is False and st["backend"]["why_not"]
    with pytest.raises(HTTPClientError) as e:
        await ws.fetch("jupyter-pause", "api", "pause", method="POST", body="{}")
    assert e.value.code == 409
    assert "no snapshot storage configured" in json.loads(e.value.response.body)["message"]


@pytest.mark.parametrize("pause_config", [config("SnapshotFails")])
async def test_failed_snapshot_keeps_kernels_and_checkpoint(ws, jp_serverapp):
    nb = await ws.open_notebook("s.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "s = 5")
    _, st = await ws.flight("pause")
    assert st["state"] == "failed" and "pod snapshot failed" in st["reason"], st
    assert st["hint"] == ("Your kernels are untouched and the last good checkpoint is intact. "
                          "The checkpoint is the way back.")
    assert st["last_checkpoint"] is not None  # written before the snapshot was tried
    assert kid in jp_serverapp.kernel_manager  # nothing was stopped
    assert (await ws.run(kid, "print(s)")).strip() == "5"
    failed = ws.journal()[-1]
    assert failed["event"] == "failed" and failed["step"] == "snapshotting"
    assert failed["reason"] == "snapshot_failed"
    metrics = (await ws.fetch("metrics")).body.decode()
    assert 'jupyter_pause_failures_total{backend="snapshot-fails",kind="pause",' \
           'reason="snapshot_failed"} 1.0' in metrics
    # A failed pause leaves the workspace usable and pausable again.
    with pytest.raises(HTTPClientError) as e:
        await ws.fetch("jupyter-pause", "api", "resume", method="POST", body="{}")
    assert e.value.code == 409


@pytest.mark.parametrize("pause_config", [config("SlowCapacity")])
async def test_waiting_for_capacity_is_shown(ws):
    nb = await ws.open_notebook("w.ipynb")
    await ws.run(nb["kernel"]["id"], "w = 'x'")
    await ws.flight("pause")
    await ws.api("POST", "resume")
    seen = set()
    while ws.lifecycle.flight is not None:
        st = await ws.status()
        seen.add((st["state"], st["reason"]))
        await asyncio.sleep(0.05)
    assert ("waiting_for_capacity", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu") \
        in seen
    st = await ws.status()
    assert st["state"] == "ready" and st["outcome"] == "restored" and st["reason"] is None
    names = [e["event"] for e in st["timeline"]]
    assert names.index("waiting_for_capacity") < names.index("pod_scheduled") \
        < names.index("verified")
    await ws.lifecycle.sample_activity()
    activity = [e for e in ws.journal() if e["event"] == "activity"]
    assert activity and activity[-1]["flight"] is None and "busy_kernels" in activity[-1]


@pytest.mark.parametrize("pause_config", [config("WokeUp")])
async def test_process_restored_during_pause_resumes_live(ws):
    nb = await ws.open_notebook("g.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "g = 9")
    await ws.api("POST", "pause")
    for _ in range(600):
        await ws.lifecycle.wait()
        if ws.lifecycle.flight is None and ws.lifecycle.state["state"] in ("ready", "failed"):
            break
        await asyncio.sleep(0.05)
    st = await ws.status()
    assert st["state"] == "ready" and st["outcome"] == "live", st
    assert st["last_report"]["trigger"] == "startup"
    assert (await ws.run(kid, "print(g)")).strip() == "9"
    names = [e["event"] for e in ws.journal()]
    assert names[names.index("paused") + 1] == "resume_requested" and "restored" not in names


@pytest.mark.parametrize("pause_config", [config("OldContract")])
async def test_backend_returning_a_dict_fails_the_pause_clearly(ws, jp_serverapp):
    nb = await ws.open_notebook("old.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "o = 1")
    _, st = await ws.flight("pause")
    assert st["state"] == "failed", st
    assert "snapshot() returned dict, not SnapshotResult" in st["reason"], st["reason"]
    failed = [e for e in ws.journal() if e["event"] == "failed"][-1]
    assert failed["step"] == "snapshotting" and failed["reason"] == "backend_error", failed
    assert kid in jp_serverapp.kernel_manager  # nothing was released
