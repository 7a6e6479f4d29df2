"""A pod that the GKE Workspaces add-on snapshots must not get a second policy and trigger.

gke-labs/workspaces (providers/gke/internal/snapshot): the reconciler keeps `ws-<name>-policy`
for every enabled Workspace (reconcile.go `policyNameFor`, ensured before any pause), the pod
webhook adds the readiness gate `podsnapshot.gke.kubeflow.org/active` (snapshot.go), and a pause
is the Workspace's `spec.paused=true`, which its webhook turns into a checkpoint. Two policies
selecting one pod leave GKE to pick one; two triggers snapshot the pod twice.
"""

from __future__ import annotations

import asyncio
import copy
import time

from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.cluster.kube import Kube

from .conftest import GKW_GATE, NS, pause_ctx, workspace
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
    assert snap.skipped is True and snap.gke_workspaces is True
    rel = await b.release(ctx)
    assert rel.stopped_via == "workspace" and rel.snapshot, rel
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
    assert out.snapshot and out.policy == "jp-ws1"


async def test_upstream_names_gate_and_admission_time_pin_through_pause_and_resume(
        apiserver, admin, notebook_client, sim, recorder):
    """As upstream names and mutates them: the Workspace's StatefulSet is made with generateName
    "ws-<name>-" (kubeflow/notebooks notebooks-v2 workspace_controller.go generateStatefulSet), so
    its pod is ws-<name>-<random>-0 with one container "main" (workspacePodTemplateContainerName);
    the add-on's trigger targets that pod; the pod is Ready only once the add-on sets its
    readiness condition (snapshot.go ReadinessGateConditionType; kubelet
    pkg/kubelet/status/generate.go); and the resumed pod carries ps-name from its very creation
    (webhook.go mutatePod on CREATE), never patched on afterwards. The old simulator named the pod
    ws-<name>-0, which a product that guessed the name would have passed with."""
    import re

    from jupyter_pause.cluster.kube import PS_NAME_ANNOTATION
    from jupyter_pause.cluster.kubeflow import KubeflowBackend
    from jupyter_pause.cluster.resume import resume_workspace

    from .test_kubeflow_gke_workspaces import KF, KFV, example_kind

    created: list[dict] = []

    def on_create(kind, obj: dict) -> None:  # on the server's loop, as admission would see it
        if kind.kind == "Pod":
            created.append(copy.deepcopy(obj))

    apiserver.call(apiserver.server.on_create.append, on_create)
    sim.generate_names = True
    sim.custom.create_cluster_custom_object(KF, KFV, "workspacekinds", example_kind())
    sim.custom.create_namespaced_custom_object(KF, KFV, NS, "workspaces",
                                               workspace("ws1", kind="jupyterlab-pause"))

    def running() -> dict | None:
        name = sim.workspace_pod_name("ws1")
        return next((p for p in sim.pods() if p["metadata"]["name"] == name and
                     p["status"].get("phase") == "Running"), None)

    pod = await asyncio.to_thread(sim.wait, running, 10, "the Workspace's pod running")
    name = pod["metadata"]["name"]
    assert re.fullmatch(r"ws-ws1-[a-z0-9]{5}-0", name), name
    assert [c["name"] for c in pod["spec"]["containers"]] == ["main"]

    def ready(p: dict, ctype: str) -> str | None:
        return next((c["status"] for c in p["status"].get("conditions") or []
                     if c["type"] == ctype), None)

    pod = await asyncio.to_thread(sim.wait, lambda: next(
        (p for p in sim.pods() if p["metadata"]["name"] == name and
         ready(p, GKW_GATE) == "True" and ready(p, "Ready") == "True"), None), 10, "active")
    b = KubeflowBackend(api_client=notebook_client, pod_name=name, namespace=NS,
                        gpu_model="nvidia-l4", restored_condition_wait=0, checkpoint_timeout=15)
    ctx = pause_ctx(recorder)
    assert (await b.snapshot(ctx)).gke_workspaces is True
    rel = await b.release(ctx)
    assert rel.checkpoint_state == "Ready" and rel.snapshot, rel
    (trigger,) = objects(apiserver, "podsnapshotmanualtriggers")
    assert trigger["spec"]["targetPod"] == name
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 10, "pod stopped")
    out = await resume_workspace(Kube(admin), NS, "ws1", poll=0.05, timeout=30,
                                 restored_condition_wait=1)
    assert out["state"] == "restored_live" and out["pod"] == name, out
    first, again = [p for p in created if p["metadata"]["name"] == name]
    assert PS_NAME_ANNOTATION not in (first["metadata"].get("annotations") or {})
    assert again["metadata"]["annotations"][PS_NAME_ANNOTATION] == rel.snapshot
    assert {"conditionType": GKW_GATE} in again["spec"]["readinessGates"]
    assert sim.restores == [(name, rel.snapshot)]


async def test_the_addons_workspace_webhook_answers_the_pause_at_admission(
        apiserver, notebook_client, sim, recorder):
    """webhook.go mutateWorkspace runs on UPDATE, at admission: the pause patch is stored as
    spec.paused=false with checkpoint-state Checkpointing, so no reader (the dashboard, Kubeflow's
    controller, the backend) ever sees paused=true before the snapshot is Ready; the pod leaves
    its Service (readiness condition False) and the trigger follows the 3 s settle. The old
    simulator stored paused=true and answered a tick later."""
    from jupyter_pause.cluster.kubeflow import KubeflowBackend

    from .test_kubeflow_gke_workspaces import example_kind, start_workspace

    stored: list[tuple[bool, str | None]] = []

    def observe(kind, ns, old, new, sub):  # after the add-on's webhook (installed first)
        if kind.plural == "workspaces" and sub is None:
            ann = new["metadata"].get("annotations") or {}
            stored.append((bool(new["spec"].get("paused")),
                           ann.get("podsnapshot.gke.kubeflow.org/checkpoint-state")))
        return new

    pod = await asyncio.to_thread(start_workspace, sim, example_kind())
    apiserver.call(apiserver.server.on_update.append, observe)
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        gpu_model="nvidia-l4", restored_condition_wait=0, checkpoint_timeout=15)
    ctx = pause_ctx(recorder)
    assert (await b.snapshot(ctx)).gke_workspaces is True
    started = time.monotonic()
    rel = await b.release(ctx)
    assert rel.checkpoint_state == "Ready" and rel.snapshot, rel
    assert time.monotonic() - started >= sim.gkw_settle_s  # the settle before the trigger
    assert (False, "Checkpointing") in stored, stored
    first_paused = next(i for i, (paused, _) in enumerate(stored) if paused)
    assert stored[first_paused][1] == "Ready", stored  # paused only with the snapshot Ready
