"""Kubeflow backend x GKE Workspaces' snapshot add-on: who the add-on manages (tier 1).

The add-on (gke-labs/workspaces providers/gke/internal/snapshot) decides per Workspace in
snapshotEnabled (cache.go): an explicit "false" on the Workspace wins, then a podConfig requesting
TPUs (never snapshotted), then the Workspace's opt-in, then the WorkspaceKind's. The project's own
example (examples/kubernetes/workspacekind.yaml) opts in on the kind, so a Workspace made from it
carries no annotation of its own. KubeflowSim (conftest) plays the add-on with that rule.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import yaml

from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.cluster.kubeflow import KubeflowBackend
from jupyter_pause.cluster.results import ReleaseResult

from .conftest import GKW_ENABLED, NS, KubeflowSim, pause_ctx, workspace

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
KF, KFV = "kubeflow.org", "v1beta1"
STATE = "podsnapshot.gke.kubeflow.org/checkpoint-state"
LAST = "podsnapshot.gke.kubeflow.org/last-checkpoint-name"


def example_kind(**annotations: str | None) -> dict:
    (kind,) = [d for d in yaml.safe_load_all((EXAMPLES / "workspacekind.yaml").read_text()) if d]
    ann = kind["metadata"].setdefault("annotations", {})
    for k, v in annotations.items():
        if v is None:
            ann.pop(k, None)
        else:
            ann[k] = v
    return kind


def start_workspace(sim: KubeflowSim, kind: dict, annotations: dict | None = None,
                    pod_config: str = "gpu-l4") -> str:
    sim.custom.create_cluster_custom_object(KF, KFV, "workspacekinds", kind)
    ws = workspace("ws1", kind=kind["metadata"]["name"], annotations=annotations)
    ws["spec"]["podTemplate"]["options"]["podConfig"] = pod_config
    sim.custom.create_namespaced_custom_object(KF, KFV, NS, "workspaces", ws)
    sim.wait(lambda: any(p["metadata"]["name"] == "ws-ws1-0" and
                         p["status"].get("phase") == "Running" for p in sim.pods()),
             what="ws-ws1-0 running")
    return "ws-ws1-0"


async def test_opt_in_on_the_kind_is_followed_to_the_snapshot(notebook_client, kfsim, recorder):
    """The example's opt-in sits on the kind: the pause must follow the add-on's checkpoint, not
    report "paused" while the add-on freezes the pod 3 s later."""
    pod = await asyncio.to_thread(start_workspace, kfsim, example_kind())
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        gpu_model="nvidia-l4", restored_condition_wait=0, checkpoint_timeout=15)
    ctx = pause_ctx(recorder)
    assert (await b.snapshot(ctx)).gke_workspaces is True
    rel = await b.release(ctx)
    assert rel.checkpoint_state == "Ready" and rel.snapshot, rel
    assert "GKE Workspaces: checkpoint-state Checkpointing" in recorder.messages


async def test_workspace_opt_out_beats_the_kind(notebook_client, kfsim, recorder):
    pod = await asyncio.to_thread(start_workspace, kfsim, example_kind(),
                                  {GKW_ENABLED: "false"})
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        restored_condition_wait=0)
    ctx = pause_ctx(recorder)
    assert (await b.snapshot(ctx)).gke_workspaces is False
    assert await b.release(ctx) == ReleaseResult(released=True, stopped_via="workspace",
                                                 owner="ws1")
    await asyncio.to_thread(kfsim.wait, lambda: not kfsim.pods(), 10, "pod stopped")
    assert not kfsim.cr("podsnapshotmanualtriggers")  # the add-on stayed out too


async def test_tpu_pod_config_is_never_snapshotted(notebook_client, kfsim, recorder):
    kind = example_kind()
    tpu = copy.deepcopy(kind["spec"]["podTemplate"]["options"]["podConfig"]["values"][0])
    tpu["id"], tpu["spec"] = "tpu-v5e", {"resources": {"limits": {"google.com/tpu": "4"}}}
    kind["spec"]["podTemplate"]["options"]["podConfig"]["values"].append(tpu)
    pod = await asyncio.to_thread(start_workspace, kfsim, kind, {GKW_ENABLED: "true"}, "tpu-v5e")
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        restored_condition_wait=0)
    assert (await b.snapshot(pause_ctx(recorder))).gke_workspaces is False


@pytest.mark.parametrize("kind_opt_in", ["true", None])
async def test_unreadable_kind_falls_back_to_the_pods_readiness_gate(
        apiserver, notebook_client, kfsim, recorder, kind_opt_in):
    """Without RBAC on the cluster-scoped WorkspaceKind, the add-on's readiness gate on the own
    pod (added by its pod webhook only to pods it manages) decides."""
    pod = await asyncio.to_thread(start_workspace, kfsim,
                                  example_kind(**{GKW_ENABLED: kind_opt_in}))
    gates = (kfsim.core.read_namespaced_pod(pod, NS).spec.readiness_gates or [])
    assert bool(gates) is (kind_opt_in == "true")
    apiserver.call(apiserver.server.deny, "get", "workspacekinds")
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        restored_condition_wait=0)
    assert (await b.snapshot(pause_ctx(recorder))).gke_workspaces is (kind_opt_in == "true")


async def test_the_addons_answer_to_the_pause_is_followed(apiserver, admin, notebook_client, sim,
                                                          recorder):
    """Nothing the pod may read says the add-on manages this Workspace (no kind, no gate), but its
    Workspace webhook answers the pause patch itself (webhook.go mutateWorkspace: spec.paused
    held at false, checkpoint-state Checkpointing): the backend follows the checkpoint."""
    from kubernetes import client

    srv = apiserver.server
    update = srv.update

    def workspace_webhook(kind, ns, name, new, sub, check_rv):  # runs on the server's loop
        old = srv.get(kind, ns, name)
        ann = (new.get("metadata") or {}).get("annotations") or {}
        if (kind.plural == "workspaces" and sub is None and not old["spec"].get("paused")
                and new["spec"].get("paused") and ann.get(STATE) != "Ready"):
            new = copy.deepcopy(new)
            new["spec"]["paused"] = False
            new["metadata"]["annotations"] = {**ann, STATE: "Checkpointing"}
        return update(kind, ns, name, new, sub, check_rv)

    srv.update = workspace_webhook
    custom = client.CustomObjectsApi(admin)
    await asyncio.to_thread(custom.create_namespaced_custom_object, KF, KFV, NS, "workspaces",
                            workspace("ws1", kind="no-such-kind"))
    await asyncio.to_thread(sim.wait, lambda: any(
        p["metadata"]["name"] == "ws-ws1-0" and p["status"].get("phase") == "Running"
        for p in sim.pods()), 10, "ws-ws1-0 running")
    b = KubeflowBackend(api_client=notebook_client, pod_name="ws-ws1-0", namespace=NS,
                        restored_condition_wait=0, checkpoint_timeout=15)
    ctx = pause_ctx(recorder)
    assert (await b.snapshot(ctx)).gke_workspaces is False
    task = asyncio.create_task(b.release(ctx))

    def ws_ann() -> dict:
        return custom.get_namespaced_custom_object(KF, KFV, NS, "workspaces", "ws1")[
            "metadata"].get("annotations") or {}

    await asyncio.to_thread(sim.wait, lambda: ws_ann().get(STATE) == "Checkpointing", 10,
                            "Checkpointing")
    assert not task.done()  # following the add-on, not reporting "paused"
    # the add-on's reconciler once the snapshot is Ready (reconcile.go reconcileCheckpointing)
    await asyncio.to_thread(custom.patch_namespaced_custom_object, KF, KFV, NS, "workspaces",
                            "ws1", {"spec": {"paused": True}, "metadata": {"annotations": {
                                STATE: "Ready", LAST: "snap-1"}}})
    rel = await asyncio.wait_for(task, 15)
    assert rel.checkpoint_state == "Ready" and rel.snapshot == "snap-1", rel


async def test_gke_backend_follows_the_addons_rule_not_its_leftover_marks(notebook_client, kfsim):
    """The GKE backend joins the add-on's flow exactly when the add-on would answer the pause:
    snapshotEnabled (cache.go), with the kind's opt-in. The add-on's marks outlive an opt-out: the
    readiness gate stays on a pod made before it (webhook.go mutatePod runs on CREATE only), and
    ws-<name>-policy stays until the Workspace is deleted (reconcile.go retirePolicy). Trusting
    them, the backend would set spec.paused and wait for a checkpoint nobody takes."""
    pod = await asyncio.to_thread(start_workspace, kfsim, example_kind())  # the kind opts in
    b = GKEBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                   gpu_model="nvidia-l4", restored_condition_wait=0)
    assert await b.ensure_policy() == {"policy": "ws-ws1-policy", "managed_by": "gke-workspaces"}
    await asyncio.to_thread(kfsim.custom.patch_namespaced_custom_object, KF, KFV, NS,
                            "workspaces", "ws1",
                            {"metadata": {"annotations": {GKW_ENABLED: "false"}}})
    live = await asyncio.to_thread(kfsim.core.read_namespaced_pod, pod, NS)
    assert [g.condition_type for g in live.spec.readiness_gates] == [
        "podsnapshot.gke.kubeflow.org/active"]  # the gate is still there
    assert await b.ensure_policy() == {"policy": "jp-ws1", "managed_by": None}


async def test_kubeflow_verdict_quotes_gkes_cold_start_warning(notebook_client, kfsim, recorder):
    """After the add-on's resume, GKE may skip the restore of the pinned snapshot (ps-name, set by
    webhook.go mutatePod) and say so only in a Warning event (reason GKEPodSnapshotting, "falling
    back to a cold start of pod", gke-labs/pod-migration issue 13): the Kubeflow backend's verdict
    reads it as the GKE backend's does."""
    pod = await asyncio.to_thread(start_workspace, kfsim, example_kind())
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        gpu_model="nvidia-l4", restored_condition_wait=0, checkpoint_timeout=15)
    ctx = pause_ctx(recorder)
    await b.snapshot(ctx)
    assert (await b.release(ctx)).checkpoint_state == "Ready"
    await asyncio.to_thread(kfsim.wait, lambda: not kfsim.pods(), 10, "pod stopped")
    kfsim.restore_mode = "skip"
    await asyncio.to_thread(kfsim.custom.patch_namespaced_custom_object, KF, KFV, NS,
                            "workspaces", "ws1", {"spec": {"paused": False}})
    await asyncio.to_thread(kfsim.wait, lambda: any(
        p["status"].get("phase") == "Running" for p in kfsim.pods()), 10, "pod back")
    verdict = await KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                                    gpu_model="nvidia-l4",
                                    restored_condition_wait=0).restore_verdict()
    assert verdict.live is False
    assert "falling back to a cold start" in verdict.reason, verdict
