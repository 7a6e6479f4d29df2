"""End to end: a real Jupyter server with `c.PauseApp.backend = "gke"` against the API test server.

Pause checkpoints the kernel, snapshots the pod through the simulated GKE and stops it; the resume
from outside brings the pod back on another GPU model, GKE cold-starts it silently, and the server
finds out (PodRestored missing + no liveness token) and restores from the checkpoint, saying why.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from jupyter_pause.cluster.kube import Kube
from jupyter_pause.cluster.resume import resume_workspace
from tests.harness import person_client
from tests.kerneldriver import run_cell

from .conftest import NS, gke_server_config, notebook_pod
from .test_gke_backend import objects, start_pod

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def jp_server_config(tmp_path, apiserver):
    return gke_server_config(tmp_path, apiserver.url)


async def _run(serverapp, kernel_id: str, code: str) -> str:
    kc = person_client(serverapp, kernel_id)  # the manager's session id would be shared
    kc.start_channels(hb=False)
    try:
        out = await run_cell(kc, code)
    finally:
        kc.stop_channels()
    return out.check(code, allow_traceback=True).stdout


async def test_gke_pause_then_cold_start_restores_from_checkpoint(
        jp_serverapp, jp_fetch, api, apiserver, admin, sim):
    lifecycle = jp_serverapp.web_app.settings["jupyter_pause_lifecycle"]

    await asyncio.to_thread(start_pod, sim, notebook_pod("nb"))
    st = await api("GET", "status")
    assert st["backend"]["name"] == "gke" and st["backend"]["can_pause"] is True, st
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "nb.ipynb", "name": "nb.ipynb", "type": "notebook",
         "kernel": {"name": "python3"}}))
    kid = json.loads(r.body)["kernel"]["id"]
    await _run(jp_serverapp, kid, "x = 41 + 1\nitems = ['a', 'b']")

    await api("POST", "pause", {"trigger": "manual"})
    await lifecycle.wait()
    st = await api("GET", "status")
    assert st["state"] == "paused", st
    (snap,) = objects(apiserver, "podsnapshots")
    assert snap["status"]["conditions"][0]["status"] == "True"  # Ready before the pod stopped
    await asyncio.to_thread(sim.wait, lambda: any(
        p["status"].get("phase") == "Succeeded" for p in sim.pods()), 10, "pod Completed")

    # The old pod's processes are gone; the resume finds only T4 capacity: a silent cold start.
    await jp_serverapp.kernel_manager.shutdown_all()
    sim.nodes = {"gpu-t4-a": ("nvidia-tesla-t4", 1)}
    out = await resume_workspace(Kube(admin), NS, "nb", poll=0.05, restored_condition_wait=0.3)
    assert out["state"] == "cold_started", out
    lifecycle.backend.gpu_model = "nvidia-tesla-t4"  # what nvidia-smi says in the new pod

    await api("POST", "resume", {"trigger": "manual"})
    await lifecycle.wait()
    st = await api("GET", "status")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    (k,) = st["last_report"]["kernels"]
    assert k["outcome"] == "restored"
    # the person reads why the live process did not come back, not only that it did not
    assert "pod was cold-started: snapshot for another GPU model" in k["reason"], k["reason"]
    assert {v["name"]: v["status"] for v in k["variables"]}["x"] == "restored"
    assert json.loads(await _run(jp_serverapp, k["kernel_id"],
                                 "import json; print(json.dumps([x, items]))")) == [42, ["a", "b"]]
    journal = [json.loads(line) for line in
               lifecycle.journal.journal_path.read_text().splitlines()]
    verified = [e for e in journal if e["event"] == "verified"][-1]
    assert verified["platform_live"] is False
    assert verified["restore_reason"].startswith(
        "pod was cold-started: snapshot for another GPU model"), verified
    assert verified["restore_reason"] in k["reason"]
    # postCheckpoint: stop (a bare pod): GKE stops the pod right after its snapshot, so the old
    # pod wrote nothing after the trigger; its last word is checkpoint_written ("snapshotting").
    events = [e["event"] for e in journal]
    assert "snapshot_ready" not in events
    assert events[events.index("resume_requested") - 1] == "checkpoint_written"
    # single-use: once the resume is verified the used snapshot and its trigger go (policy stays)
    await lifecycle.backend.snapshot_cleanup
    assert objects(apiserver, "podsnapshots") == []
    assert objects(apiserver, "podsnapshotmanualtriggers") == []
    assert len(objects(apiserver, "podsnapshotpolicies")) == 1
