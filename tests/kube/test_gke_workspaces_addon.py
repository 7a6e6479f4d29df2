"""A pod that the GKE Workspaces add-on snapshots must not get a second policy and trigger.

gke-labs/workspaces (providers/gke/internal/snapshot): the reconciler keeps `ws-<name>-policy`
for every enabled Workspace (reconcile.go `policyNameFor`, ensured before any pause), the pod
webhook adds the readiness gate `podsnapshot.gke.kubeflow.org/active` (snapshot.go), and a pause
is the Workspace's `spec.paused=true`, which its webhook turns into a checkpoint. Two policies
selecting one pod leave GKE to pick one; two triggers snapshot the pod twice.
"""

from __future__ import annotations

from jupyter_pause.cluster.gke import GKEBackend

from .conftest import NS, pause_ctx
from .test_gke_backend import objects
from .test_resume import make_workspace, ws_state


async def test_gke_backend_joins_the_addons_pause(apiserver, notebook_client, sim, recorder):
    pod = make_workspace(sim, annotations={"podsnapshot.gke.kubeflow.org/enabled": "true"})
    b = GKEBackend(api_client=notebook_client, pod_name=pod, namespace=NS, gpu_model="nvidia-l4",
                   trigger_timeout=10, snapshot_timeout=10, restored_condition_wait=0)
    await b.describe()  # the server's start sets up no policy of its own for this pod
    assert b.policy_setup == {"policy": "ws-ws1-policy", "managed_by": "gke-workspaces"}
    ctx = pause_ctx(recorder)
    snap = await b.snapshot(ctx)
    assert snap["skipped"] is True and snap["gke_workspaces"] is True
    rel = await b.release(ctx)
    assert rel["stopped_via"] == "workspace" and rel["snapshot"], rel
    assert [p["metadata"]["name"] for p in objects(apiserver, "podsnapshotpolicies")] == \
        ["ws-ws1-policy"]
    assert [t["metadata"]["name"] for t in objects(apiserver, "podsnapshotmanualtriggers")] == \
        ["ws-ws1-trigger"]
    ann = ws_state(sim)["metadata"]["annotations"]
    assert ann["podsnapshot.gke.kubeflow.org/checkpoint-state"] == "Ready"
    assert sim.snapshots_created == 1


async def test_plain_kubeflow_workspace_still_gets_its_own_policy(apiserver, notebook_client,
                                                                  sim, recorder):
    pod = make_workspace(sim)  # no add-on: no gate, no ws-<name>-policy
    b = GKEBackend(api_client=notebook_client, pod_name=pod, namespace=NS, gpu_model="nvidia-l4",
                   trigger_timeout=10, snapshot_timeout=10, restored_condition_wait=0)
    out = await b.snapshot(pause_ctx(recorder))
    assert out["snapshot"] and out["policy"] == "jp-ws1"
