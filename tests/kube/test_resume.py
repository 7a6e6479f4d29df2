"""Out-of-pod resume, capacity waits, cold starts and concurrent resumes (tier 1)."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_pause.cluster.base import BackendError
from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.cluster.kube import LEASE_ANNOTATION, PS_NAME_ANNOTATION, Kube
from jupyter_pause.cluster.kubeflow import KubeflowBackend
from jupyter_pause.cluster.resume import resume_workspace

from .conftest import NS, notebook_pod, pause_ctx, resume_ctx


def make_workspace(sim, name: str = "ws1", annotations: dict | None = None) -> str:
    sim.custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", NS, "workspaces", {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Workspace",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"paused": False, "kind": "jupyterlab"}})
    pod = f"ws-{name}-0"
    sim.wait(lambda: any(p["metadata"]["name"] == pod and p["status"].get("phase") == "Running"
                         for p in sim.pods()), what=f"{pod} running")
    return pod


def ws_state(sim, name: str = "ws1") -> dict:
    return sim.custom.get_namespaced_custom_object("kubeflow.org", "v1beta1", NS, "workspaces",
                                                   name)


async def pause_workspace(client, sim, recorder, pod: str, gpu: str = "nvidia-l4") -> dict:
    b = GKEBackend(api_client=client, pod_name=pod, namespace=NS, gpu_model=gpu,
                   trigger_timeout=10, snapshot_timeout=10, restored_condition_wait=0)
    ctx = pause_ctx(recorder)
    snap = await b.snapshot(ctx)
    rel = await b.release(ctx)
    assert rel.to_dict() == {"released": True, "stopped_via": "workspace", "owner": "ws1"}
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 10, "pod stopped")
    assert ws_state(sim)["spec"]["paused"] is True
    return snap


async def test_waits_for_capacity_then_restores_live(admin, notebook_client, sim, recorder):
    pod = make_workspace(sim)
    snap = await pause_workspace(notebook_client, sim, recorder, pod)
    sim.nodes = {}  # the GPU node went away while paused (scale-down)
    updates: list[dict] = []
    task = asyncio.create_task(resume_workspace(Kube(admin), NS, "ws1", on_update=updates.append,
                                                poll=0.05, restored_condition_wait=0.5))
    await asyncio.to_thread(sim.wait, lambda: any(u["state"] == "waiting_for_capacity"
                                                  for u in updates), 10, "unschedulable")
    await asyncio.sleep(0.5)
    sim.add_node("gpu-l4-new", "nvidia-l4", 1)  # the autoscaler brought one
    out = await task
    assert out["state"] == "restored_live" and snap.snapshot in out["reason"]
    states = [u["state"] for u in updates]
    wait = next(u for u in updates if u["state"] == "waiting_for_capacity")
    assert "Insufficient nvidia.com/gpu" in wait["reason"] or "0/0 nodes" in wait["reason"]
    assert states.index("waiting_for_capacity") < states.index("restored_live")
    assert "scheduled" in states or "pending" in states or "running" in states
    assert LEASE_ANNOTATION not in (ws_state(sim)["metadata"].get("annotations") or {})
    # in the pod: the backend confirms a live restore
    b = GKEBackend(api_client=notebook_client, pod_name=pod, namespace=NS, gpu_model="nvidia-l4",
                   restored_condition_wait=0)
    verdict = await b.restored_live(resume_ctx(recorder))
    assert verdict.live is True, verdict


async def test_other_gpu_model_cold_starts_with_reason(admin, notebook_client, sim, recorder):
    pod = make_workspace(sim)
    await pause_workspace(notebook_client, sim, recorder, pod)
    sim.nodes = {"gpu-t4-a": ("nvidia-tesla-t4", 1)}  # only T4 capacity is left
    out = await resume_workspace(Kube(admin), NS, "ws1", poll=0.05, restored_condition_wait=0.3)
    assert out["state"] == "cold_started" and out["node"] == "gpu-t4-a"
    assert sim.restores == []
    b = GKEBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                   gpu_model="nvidia-tesla-t4", restored_condition_wait=0)
    rctx = resume_ctx(recorder)
    verdict = await b.restored_live(rctx)
    assert verdict.live is False, verdict
    assert verdict.reason.startswith(
        "pod was cold-started: snapshot for another GPU model (snapshot taken on nvidia-l4, this "
        "pod has nvidia-tesla-t4); GKE: ")  # + GKE's own Warning event
    assert "falling back to a cold start" in verdict.reason
    assert verdict.reason in recorder.messages


async def test_two_resumes_at_once_restore_once(admin, notebook_client, sim, recorder):
    pod = make_workspace(sim)
    await pause_workspace(notebook_client, sim, recorder, pod)
    created_before = sum("sts created" in x for x in sim.log)
    a, b = await asyncio.gather(
        resume_workspace(Kube(admin), NS, "ws1", poll=0.05, holder="alice",
                         restored_condition_wait=0.3),
        resume_workspace(Kube(admin), NS, "ws1", poll=0.05, holder="bob",
                         restored_condition_wait=0.3))
    assert a["state"] == b["state"] == "restored_live"
    assert sorted([a["joined"], b["joined"]]) == [False, True]
    assert len(sim.restores) == 1
    assert sum("sts created" in x for x in sim.log) - created_before == 1


async def test_bare_pod_recreated_with_ps_name(apiserver, admin, notebook_client, sim, recorder):
    sim.create_pod(notebook_pod("nb"))
    sim.wait(lambda: any(p["status"].get("phase") == "Running" for p in sim.pods()), what="run")
    b = GKEBackend(api_client=notebook_client, pod_name="nb", namespace=NS, trigger_timeout=10,
                   snapshot_timeout=10)
    snap = await b.snapshot(pause_ctx(recorder))
    await asyncio.to_thread(sim.wait, lambda: any(p["status"].get("phase") == "Succeeded"
                                                  for p in sim.pods()), 10, "Completed")
    out = await resume_workspace(Kube(admin), NS, "nb", poll=0.05, restored_condition_wait=0.3)
    assert out["state"] == "restored_live" and out["kind"] == "pod"
    pod = next(p for p in sim.pods() if p["metadata"]["name"] == "nb")
    assert pod["metadata"]["annotations"]["podsnapshot.gke.io/ps-name"] == snap.snapshot


async def test_kubeflow_backend_pauses_workspace(notebook_client, sim, recorder):
    pod = make_workspace(sim)
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        restored_condition_wait=0)
    assert (await b.describe())["can_pause"] is True
    ctx = pause_ctx(recorder)
    assert (await b.snapshot(ctx)).skipped is True
    assert (await b.release(ctx)).stopped_via == "workspace"
    await asyncio.to_thread(sim.wait, lambda: ws_state(sim).get("status", {}).get("state")
                            == "Paused", 10, "Paused")
    # plain Kubeflow: the pod comes back cold, and the backend says so
    await asyncio.to_thread(sim.custom.patch_namespaced_custom_object, "kubeflow.org", "v1beta1",
                            NS, "workspaces", "ws1", {"spec": {"paused": False}})
    await asyncio.to_thread(sim.wait, lambda: any(p["status"].get("phase") == "Running"
                                                  for p in sim.pods()), 10, "running")
    verdict = await b.restored_live(resume_ctx(recorder))
    assert verdict.live is False, verdict
    assert "without a pod snapshot" in verdict.reason


async def test_kubeflow_backend_with_gke_workspaces_addon(notebook_client, sim, recorder):
    pod = make_workspace(sim, annotations={"podsnapshot.gke.kubeflow.org/enabled": "true"})
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        gpu_model="nvidia-l4", restored_condition_wait=0, checkpoint_timeout=15)
    ctx = pause_ctx(recorder)
    assert (await b.snapshot(ctx)).gke_workspaces is True
    rel = await b.release(ctx)
    assert rel.checkpoint_state == "Ready" and rel.snapshot
    assert "GKE Workspaces: checkpoint-state Checkpointing" in recorder.messages
    await asyncio.to_thread(sim.wait, lambda: ws_state(sim).get("status", {}).get("state")
                            == "Paused", 10, "Paused")
    # resume: the add-on's pod webhook pins the checkpoint with ps-name; the restore is live
    await asyncio.to_thread(sim.custom.patch_namespaced_custom_object, "kubeflow.org", "v1beta1",
                            NS, "workspaces", "ws1", {"spec": {"paused": False}})
    await asyncio.to_thread(sim.wait, lambda: any(p["status"].get("phase") == "Running"
                                                  for p in sim.pods()), 10, "running")
    verdict = await b.restored_live(resume_ctx(recorder))
    assert verdict.live is True, verdict
    assert rel.snapshot in verdict.reason


async def test_gke_workspaces_failed_checkpoint_is_not_stuck(notebook_client, sim, recorder):
    pod = make_workspace(sim, annotations={"podsnapshot.gke.kubeflow.org/enabled": "true"})
    sim.trigger_outcome = "failed"
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        checkpoint_timeout=1.5)
    with pytest.raises(BackendError) as ei:
        await b.release(pause_ctx(recorder))
    assert ei.value.reason == "snapshot_timeout"
    assert "checkpoint-state Checkpointing" in str(ei.value)


async def test_kubeflow_release_wakes_up_in_restored_pod(notebook_client, sim, recorder):
    """The process froze in release() during the add-on's checkpoint and wakes up in the pod
    restored from it: it must not report a pause (nor pause the resumed workspace again)."""
    pod = make_workspace(sim, annotations={"podsnapshot.gke.kubeflow.org/enabled": "true"})
    b = KubeflowBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                        gpu_model="nvidia-l4", restored_condition_wait=0, checkpoint_timeout=15)
    ctx = pause_ctx(recorder)
    await b.snapshot(ctx)  # records who we are (pod uid)
    rel = await b.release(ctx)
    assert rel.released is True and rel.checkpoint_state == "Ready"
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 10, "paused")
    await asyncio.to_thread(sim.custom.patch_namespaced_custom_object, "kubeflow.org", "v1beta1",
                            NS, "workspaces", "ws1", {"spec": {"paused": False}})
    await asyncio.to_thread(sim.wait, lambda: any(p["status"].get("phase") == "Running"
                                                  for p in sim.pods()), 10, "running")
    # the add-on cleaned up after the resume: single-use snapshot, state cleared
    await asyncio.to_thread(sim.wait, lambda: "podsnapshot.gke.kubeflow.org/checkpoint-state"
                            not in (ws_state(sim)["metadata"].get("annotations") or {}), 10,
                            "state cleared")
    await asyncio.to_thread(sim.wait, lambda: not sim.cr("podsnapshots"), 10, "snapshot gone")
    assert sim.restores
    # now the frozen wait of the old process resumes: same name, another pod
    b.checkpoint_timeout = 1.0
    out = await b.workspaces.follow_checkpoint(ctx, "ws1", NS, timeout=b.checkpoint_timeout)
    assert out.released is False and out.woke_up is True
    assert ws_state(sim)["spec"]["paused"] is False


@pytest.mark.parametrize("outcome", ["cold", "fail"])
async def test_a_pod_pinned_to_a_missing_snapshot(admin, notebook_client, sim, recorder,
                                                  outcome):
    """A pod created with podsnapshot.gke.io/ps-name naming a snapshot that is gone (deleted by
    retention between the resume's look and the pod's creation). What GKE does then is not
    documented, so both readings are played: it starts cold, and the resume and the server in
    the pod say so (the checkpoint is the way back); or the pod fails, and the resume ends
    "failed" with the pod's own message instead of waiting for a restore."""
    sim.pinned_missing_outcome = outcome
    sim.create_pod(notebook_pod("nb", annotations={PS_NAME_ANNOTATION: "gone-snap"}))
    out = await resume_workspace(Kube(admin), NS, "nb", poll=0.05, timeout=20,
                                 restored_condition_wait=0.3)
    assert sim.pinned_missing == ["nb"] and sim.restores == []
    if outcome == "cold":
        assert out["state"] == "cold_started", out
        b = GKEBackend(api_client=notebook_client, pod_name="nb", namespace=NS,
                       gpu_model="nvidia-l4", restored_condition_wait=0)
        assert (await b.restored_live(resume_ctx(recorder))).live is False
    else:
        assert out["state"] == "failed" and "gone-snap not found" in out["reason"], out
