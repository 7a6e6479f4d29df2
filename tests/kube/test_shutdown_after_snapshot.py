"""No shutdown checkpoint right after a pod snapshot (tier 1).

A pod that was just snapshotted is stopped after it: GKE's `postCheckpoint: stop`, and the GKE
Workspaces add-on, which completes a pause with `spec.paused=true` once the PodSnapshot is Ready
(gke-labs/workspaces providers/gke/internal/snapshot/reconcile.go reconcileCheckpointing), so the
StatefulSet scales the pod away and the server gets SIGTERM. The server's shutdown checkpoint
(jupyter_pause/server/shutdown.py) would then write the journal and checkpoints to the home volume
after the snapshot: GKE's Pod snapshot troubleshooting page ("Post-checkpoint mutation risks with
PVCs") says such writes make the restore fail (`vfs.CompleteRestore() failed`, gke-labs/pod-migration
issue 15). The add-on's progress is the Workspace annotation
`podsnapshot.gke.kubeflow.org/checkpoint-state` (snapshot.go AnnotationCheckpointState:
Checkpointing, then Ready until the restored pod is Ready).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.server.shutdown import checkpoint_on_shutdown

from .conftest import KF, KFV, NS, gke_server_config, notebook_pod, pause_ctx
from .test_e2e_server import _run
from .test_gke_backend import start_pod
from .test_gke_pvc import with_pvc
from .test_kubeflow_gke_workspaces import STATE, example_kind, start_workspace

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def jp_server_config(tmp_path, apiserver):
    return gke_server_config(tmp_path, apiserver.url, pod_name="ws-ws1-0")


async def test_no_shutdown_write_after_the_addons_snapshot(jp_serverapp, jp_fetch, sim,
                                                           monkeypatch):
    """Kubeflow's culler (activity rules) pauses an idle Workspace by patching spec.paused=true;
    the add-on turns that into a pod snapshot and then stops the pod. The SIGTERM that follows
    must not write the shutdown checkpoint."""
    lifecycle = jp_serverapp.web_app.settings["jupyter_pause_lifecycle"]
    warnings: list[str] = []
    monkeypatch.setattr(lifecycle.log, "warning", lambda msg, *a: warnings.append(msg % a))
    await asyncio.to_thread(start_workspace, sim, example_kind())  # the kind opts in
    # the server's start in that pod (here the pod came after the test server started)
    assert (await lifecycle.backend.describe())["can_pause"] is True
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "nb.ipynb", "name": "nb.ipynb", "type": "notebook",
         "kernel": {"name": "python3"}}))
    await _run(jp_serverapp, json.loads(r.body)["kernel"]["id"], "x = 42")

    await asyncio.to_thread(sim.custom.patch_namespaced_custom_object, KF, KFV, NS, "workspaces",
                            "ws1", {"spec": {"paused": True}})  # the culler

    def addon_done() -> bool:
        ws = sim.custom.get_namespaced_custom_object(KF, KFV, NS, "workspaces", "ws1")
        return (ws["metadata"].get("annotations") or {}).get(STATE) == "Ready" and \
            ws["spec"]["paused"] and not sim.pods()

    # The simulated StatefulSet deletes the pod at once; on a cluster it is still terminating
    # when the SIGTERM comes. Either way the server knows its Workspace from its start.
    await asyncio.to_thread(sim.wait, addon_done, 15, "the add-on's snapshot, then the stop")
    journal = lifecycle.journal.journal_path
    before = journal.read_text() if journal.exists() else ""
    # what the server's stop_extension runs on SIGTERM
    assert await checkpoint_on_shutdown(lifecycle, "signal", 10.0) is None
    assert (journal.read_text() if journal.exists() else "") == before  # nothing written
    assert any("no shutdown checkpoint" in w and "checkpoint-state Ready" in w
               for w in warnings), warnings


async def test_own_pause_with_stop_holds_writes_until_its_trigger_fails(notebook_client, sim,
                                                                        recorder):
    """Our own pause of a pod with a PVC (postCheckpoint: stop): once the trigger exists GKE may
    snapshot and stop the pod at any moment. A trigger that failed (Triggered=False, the
    agent-sandbox client's rule) took no snapshot: writes are fine again."""
    start_pod(sim, with_pvc(notebook_pod("nb")))
    b = GKEBackend(api_client=notebook_client, pod_name="nb", namespace=NS,
                   gpu_model="nvidia-l4", trigger_timeout=10, snapshot_timeout=10,
                   restored_condition_wait=0)
    assert await b.writes_held() is None
    out = await b.snapshot(pause_ctx(recorder))
    assert out.hold_writes is True
    held = await b.writes_held()
    assert held and "postCheckpoint: stop" in held and out.trigger in held
    # The same process after a failed capture: the trigger says no snapshot was taken.
    tname = out.trigger
    await asyncio.to_thread(sim.patch_cr_status, "podsnapshotmanualtriggers", tname, {
        "conditions": [{"type": "Triggered", "status": "False", "reason": "Failed",
                        "message": "checkpoint failed", "lastTransitionTime":
                        "2026-01-01T00:00:00Z"}]})
    assert await b.writes_held() is None
