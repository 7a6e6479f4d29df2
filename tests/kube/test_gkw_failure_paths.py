"""GKE Workspaces' snapshot add-on off its happy path (tier 1, the simulator).

Modelled on gke-labs/workspaces providers/gke/internal/snapshot (webhook.go, reconcile.go,
informers.go, cache.go at df69eff6):
- webhook.go mutateWorkspace holds every paused false->true of a managed Workspace and sets the
  pod's readiness condition `podsnapshot.gke.kubeflow.org/active=False` at once (the pod leaves
  its Service); the trigger follows after a ~3 s settle;
- reconcile.go reconcileCheckpointing has no branch for a failed trigger or PodSnapshot: the
  Workspace stays Checkpointing, unpaused, out of the Service;
- reconcile.go reconcileCheckpointing creates the trigger `ws-<name>-trigger`, stamped with the
  Workspace's checkpoint-started-at and owned by it, whenever it is missing while the Workspace
  reads Checkpointing (the trigger's deletion re-enqueues the Workspace at once), and discards
  one stamped otherwise;
- webhook.go mutatePod pins every new pod to the Workspace's last-checkpoint-name (ps-name), which
  reconcileActive clears only once a pod is Ready; it never checks that the snapshot exists,
  and the add-on's policy lets GKE delete one unused for 7 days (retentionConfig).
What GKE does with a ps-name that names no snapshot is documented nowhere: the simulator records
such pods (`pinned_missing`) rather than assume a clean cold start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from jupyter_pause.cluster.base import BackendError
from jupyter_pause.cluster.kube import PS_NAME_ANNOTATION, Kube
from jupyter_pause.cluster.kubeflow import KubeflowBackend
from jupyter_pause.cluster.resume import resume_workspace
from jupyter_pause.cluster.workspaces import STOP_OPT_OUT_ANNOTATION

from .conftest import GKW_ENABLED, NS, pause_ctx, resume_ctx
from .test_kubeflow_gke_workspaces import KF, KFV, LAST, STATE, example_kind, start_workspace

ACTIVE = "podsnapshot.gke.kubeflow.org/active"
STARTED = "podsnapshot.gke.kubeflow.org/checkpoint-started-at"

pytestmark = pytest.mark.timeout(120)


def ws_obj(sim) -> dict:
    return sim.custom.get_namespaced_custom_object(KF, KFV, NS, "workspaces", "ws1")


def pod_cond(sim, ctype: str) -> str | None:
    pods = [p for p in sim.pods() if p["metadata"]["name"] == "ws-ws1-0"]
    for c in (pods[0]["status"].get("conditions") or []) if pods else []:
        if c["type"] == ctype:
            return c["status"]
    return None


def backend(client, pod: str, **kw) -> KubeflowBackend:
    kw.setdefault("restored_condition_wait", 0)
    b = KubeflowBackend(api_client=client, pod_name=pod, namespace=NS, gpu_model="nvidia-l4",
                        **kw)
    b.workspaces.failure_poll = 0.1
    return b


async def running_workspace(sim) -> str:
    pod = await asyncio.to_thread(start_workspace, sim, example_kind())
    # the add-on's readiness gate: Ready only once the add-on says the pod is active
    await asyncio.to_thread(sim.wait, lambda: pod_cond(sim, "Ready") == "True", 10, "pod Ready")
    return pod


@pytest.mark.parametrize("fault", ["trigger", "upload"])
async def test_a_failed_addon_snapshot_is_ended_and_said(notebook_client, kfsim, recorder,
                                                         fault):
    """Before: the pause waited out checkpoint_timeout on checkpoint-state and left the
    Workspace Checkpointing, its pod out of the Service."""
    pod = await running_workspace(kfsim)
    if fault == "trigger":
        kfsim.trigger_outcome = "failed"  # Triggered=False/Failed with GKE's message
        gke_says = "CUDA checkpoint returned an error"
    else:
        kfsim.upload_outcome = "failed"  # PodSnapshot Ready=False/Failed
        gke_says = "403 Forbidden"
    b = backend(notebook_client, pod, checkpoint_timeout=60)
    ctx = pause_ctx(recorder)
    await b.snapshot(ctx)
    t0 = time.monotonic()
    task = asyncio.create_task(b.release(ctx))
    # the add-on took the pod out of the Service at once
    await asyncio.to_thread(kfsim.wait, lambda: pod_cond(kfsim, "Ready") == "False", 10,
                            "pod out of the Service")
    with pytest.raises(BackendError) as err:
        await asyncio.wait_for(task, 30)
    assert err.value.reason == "snapshot_failed", err.value
    assert gke_says in str(err.value) and "keeps running" in str(err.value)
    assert time.monotonic() - t0 < 20  # read from GKE's conditions, not the 60 s timeout
    (event,) = [f for e, f in recorder.events if e == "gke_workspaces_checkpoint_failed"]
    assert gke_says in event["reason"] and event["left_behind"] is None
    # the stuck state is gone: no checkpoint-state, the pod back in service; the failed
    # trigger stays (deleting it would wake the add-on into making a new one)
    ann = ws_obj(kfsim)["metadata"].get("annotations") or {}
    assert STATE not in ann and ws_obj(kfsim)["spec"]["paused"] is False
    (failed,) = kfsim.cr("podsnapshotmanualtriggers")
    await asyncio.to_thread(kfsim.wait, lambda: pod_cond(kfsim, "Ready") == "True", 10,
                            "pod Ready again")
    # and the next pause works: the add-on replaces the trigger of the old stamp
    kfsim.trigger_outcome, kfsim.upload_outcome = "complete", "ready"
    ctx = pause_ctx(recorder, "f2")
    await b.snapshot(ctx)
    assert (await b.release(ctx)).checkpoint_state == "Ready"
    assert len(kfsim.gkw_triggers_made) == 2, kfsim.gkw_triggers_made
    assert kfsim.gkw_triggers_made[1][1] != failed["metadata"]["annotations"][STARTED]


async def test_cold_restart_does_not_pin_the_new_pod_to_the_deleted_snapshot(
        admin, notebook_client, kfsim, recorder):
    """The restore crashes; the resumer deletes the snapshot and the pod. Before: the
    Workspace's last-checkpoint-name stayed, and the add-on's pod webhook pinned the new pod to
    the snapshot just deleted."""
    pod = await running_workspace(kfsim)
    b = backend(notebook_client, pod, checkpoint_timeout=30)
    ctx = pause_ctx(recorder)
    await b.snapshot(ctx)
    rel = await b.release(ctx)
    snap = rel.snapshot
    assert snap and ws_obj(kfsim)["metadata"]["annotations"][LAST] == snap
    await asyncio.to_thread(kfsim.wait, lambda: not kfsim.pods(), 10, "pod stopped")
    kfsim.restore_mode = "crash"
    out = await resume_workspace(Kube(admin), NS, "ws1", poll=0.05, timeout=40,
                                 restored_condition_wait=0.3, discard_wait=5)
    assert out["state"] == "cold_started", out
    (p,) = kfsim.pods()
    assert PS_NAME_ANNOTATION not in (p["metadata"].get("annotations") or {}), p["metadata"]
    assert kfsim.pinned_missing == []  # no pod ever named a snapshot that is gone
    assert snap not in [s["metadata"]["name"] for s in kfsim.cr("podsnapshots")]


async def test_a_stop_under_the_addon_takes_no_snapshot(admin, notebook_client, kfsim,
                                                        recorder):
    """The cpu-small "stop without a snapshot": before, the add-on intercepted the
    paused=true, froze and uploaded the pod, and the kernels came back live."""
    pod = await running_workspace(kfsim)
    b = backend(notebook_client, pod)
    ctx = pause_ctx(recorder)
    ctx.mode = "stop"  # snapshot() is not called for a stop
    rel = await b.release(ctx)
    assert rel.to_dict() == {"released": True, "stopped_via": "workspace", "owner": "ws1",
                             "snapshot_opt_out": True}
    await asyncio.to_thread(kfsim.wait, lambda: not kfsim.pods(), 10, "pod stopped")
    assert kfsim.snapshots_created == 0 and not kfsim.cr("podsnapshotmanualtriggers")
    ann = ws_obj(kfsim)["metadata"]["annotations"]
    # the example kind opts in; the Workspace had no setting of its own to keep
    assert ann[GKW_ENABLED] == "false" and ann[STOP_OPT_OUT_ANNOTATION] == ""
    # the resume opts it back in before the pod is created, so the pod gets the add-on's gate
    out = await resume_workspace(Kube(admin), NS, "ws1", poll=0.05, timeout=30,
                                 restored_condition_wait=0)
    assert out["state"] == "started", out
    ann = ws_obj(kfsim)["metadata"].get("annotations") or {}
    assert GKW_ENABLED not in ann and STOP_OPT_OUT_ANNOTATION not in ann
    (p,) = kfsim.pods()
    assert [g["conditionType"] for g in p["spec"].get("readinessGates") or []] == [ACTIVE]


async def test_a_dashboard_resume_after_a_stop_is_opted_back_in_by_the_server(
        notebook_client, kfsim, recorder):
    """Kubeflow's dashboard resumes with spec.paused=false only: the server's resume puts the
    Workspace's own setting back."""
    pod = await running_workspace(kfsim)
    await asyncio.to_thread(kfsim.custom.patch_namespaced_custom_object, KF, KFV, NS,
                            "workspaces", "ws1",
                            {"metadata": {"annotations": {GKW_ENABLED: "true"}}})
    ctx = pause_ctx(recorder)
    ctx.mode = "stop"
    await backend(notebook_client, pod).release(ctx)
    assert ws_obj(kfsim)["metadata"]["annotations"][STOP_OPT_OUT_ANNOTATION] == "true"
    await asyncio.to_thread(kfsim.wait, lambda: not kfsim.pods(), 10, "pod stopped")
    await asyncio.to_thread(kfsim.custom.patch_namespaced_custom_object, KF, KFV, NS,
                            "workspaces", "ws1", {"spec": {"paused": False}})
    await asyncio.to_thread(kfsim.wait, lambda: any(
        p["status"].get("phase") == "Running" for p in kfsim.pods()), 10, "pod back")
    rctx = resume_ctx(recorder)
    rctx.pause = {"mode": "stop"}
    b = backend(notebook_client, pod)
    await b._undo_stop_opt_out()
    ann = ws_obj(kfsim)["metadata"]["annotations"]
    assert ann[GKW_ENABLED] == "true" and STOP_OPT_OUT_ANNOTATION not in ann


async def test_a_statefulset_recreates_a_stopped_pod(kfsim):
    """kubernetes/kubernetes pkg/controller/statefulset/stateful_set_control.go processReplica:
    a Failed or Succeeded replica is deleted and re-created (RecreatingTerminatedPod), which is
    what GKE's postCheckpoint: stop leaves behind."""
    kfsim.apps.create_namespaced_stateful_set(NS, {
        "metadata": {"name": "nb"},
        "spec": {"replicas": 1, "serviceName": "nb", "selector": {"matchLabels": {"app": "nb"}},
                 "template": {"metadata": {"labels": {"app": "nb"}},
                              "spec": {"containers": [{"name": "main", "image": "img"}]}}}})
    first = await asyncio.to_thread(kfsim.wait, lambda: next((
        p for p in kfsim.pods() if p["status"].get("phase") == "Running"), None), 10, "nb-0")
    kfsim.patch_pod_status("nb-0", {"phase": "Succeeded"})
    await asyncio.to_thread(kfsim.wait, lambda: any(
        p["metadata"]["uid"] != first["metadata"]["uid"] and
        p["status"].get("phase") == "Running" for p in kfsim.pods()), 10, "nb-0 re-created")


async def test_ending_a_failed_snapshot_never_brings_the_trigger_back(notebook_client, kfsim,
                                                                      recorder):
    """Before, the failed trigger was deleted while the Workspace still read Checkpointing: the
    add-on, woken by the deletion of a trigger it owns, made a new one at once, and GKE would
    snapshot and stop the pod the pause had just said keeps running."""
    pod = await running_workspace(kfsim)
    kfsim.trigger_outcome = "failed"
    b = backend(notebook_client, pod, checkpoint_timeout=60)
    ctx = pause_ctx(recorder)
    await b.snapshot(ctx)
    with pytest.raises(BackendError) as err:
        await asyncio.wait_for(b.release(ctx), 30)
    assert err.value.reason == "snapshot_failed" and "keeps running" in str(err.value)
    await asyncio.to_thread(kfsim.wait, lambda: pod_cond(kfsim, "Ready") == "True", 10,
                            "pod Ready again")
    await asyncio.sleep(1.0)  # a few rounds of the add-on's reconcile loop
    assert len(kfsim.gkw_triggers_made) == 1, kfsim.gkw_triggers_made
    assert kfsim.snapshots_created == 0 and pod_cond(kfsim, "Ready") == "True"


async def test_a_resume_after_the_snapshot_expired_starts_cold_without_a_pin(
        admin, notebook_client, kfsim, recorder):
    """GKE deleted the pod snapshot (unused past the policy's retention) while the Workspace
    was paused. Before, the resume set paused=false as it was, and the pod webhook pinned the
    new pod to the snapshot that is gone."""
    pod = await running_workspace(kfsim)
    b = backend(notebook_client, pod, checkpoint_timeout=30)
    ctx = pause_ctx(recorder)
    await b.snapshot(ctx)
    snap = (await b.release(ctx)).snapshot
    assert snap and ws_obj(kfsim)["metadata"]["annotations"][LAST] == snap
    await asyncio.to_thread(kfsim.wait, lambda: not kfsim.pods(), 10, "pod stopped")
    # GKE's retention deletes the unused snapshot (lastAccessTimeout: 7d)
    await asyncio.to_thread(kfsim.custom.delete_namespaced_custom_object, "podsnapshot.gke.io",
                            "v1", NS, "podsnapshots", snap)
    said: list[str] = []
    out = await resume_workspace(Kube(admin), NS, "ws1", poll=0.05, timeout=30,
                                 restored_condition_wait=0,
                                 on_update=lambda u: said.append(u["reason"] or ""))
    assert out["state"] == "started" and "restores from the checkpoint" in out["reason"], out
    (p,) = kfsim.pods()
    assert PS_NAME_ANNOTATION not in (p["metadata"].get("annotations") or {}), said
    assert kfsim.pinned_missing == []
    assert any(snap in m and "is gone" in m for m in said), said
    ann = ws_obj(kfsim)["metadata"].get("annotations") or {}
    assert LAST not in ann and STATE not in ann, ann


async def test_a_platform_pause_is_seen_when_its_state_lands_after_the_condition(
        apiserver, notebook_client, kfsim):
    """A pause Kubeflow began: webhook.go mutateWorkspace writes the pod's readiness condition
    (its own UpdateStatus) before it answers, and the API server stores the Workspace,
    Checkpointing, only after. Before, the watcher read the Workspace once when the condition
    dropped, found no checkpoint-state (or one left from before), and never took the
    application checkpoint."""
    pod = await running_workspace(kfsim)
    kfsim.stop()  # the add-on's loop stays out of it (it would put the pod back in service)
    b = backend(notebook_client, pod)
    started: list[str] = []

    async def start_pause(trigger: str) -> None:
        started.append(trigger)

    def requests_since(n: int) -> list[tuple[str, str]]:
        return apiserver.call(lambda: list(apiserver.server.requests[n:]))

    # a resume's Restoring not cleared yet (the add-on clears it once the pod is Ready)
    await asyncio.to_thread(kfsim.custom.patch_namespaced_custom_object, KF, KFV, NS,
                            "workspaces", "ws1", {"metadata": {"annotations": {
                                STATE: "Restoring"}}})
    n = apiserver.call(lambda: len(apiserver.server.requests))
    watcher = asyncio.create_task(b.workspaces.watch_platform_pause(start_pause))
    try:
        await asyncio.to_thread(kfsim.wait, lambda: ("watch", "pods") in requests_since(n),
                                10, "the watcher watching its pod")
        # the webhook's own write first: the pod leaves its Service
        n = apiserver.call(lambda: len(apiserver.server.requests))
        (p,) = kfsim.pods()
        kfsim._set_active(p, "False", "CheckpointingInProgress")
        await asyncio.to_thread(kfsim.wait, lambda: any(
            r == "workspaces" for _, r in requests_since(n)), 10, "the watcher's read")
        # then the Workspace as the webhook answered it
        await asyncio.to_thread(kfsim.custom.patch_namespaced_custom_object, KF, KFV, NS,
                                "workspaces", "ws1", {"metadata": {"annotations": {
                                    STATE: "Checkpointing", STARTED: "2026-12-01T10:00:00Z"}}})
        await asyncio.to_thread(kfsim.wait, lambda: started == ["gke-workspaces"], 10,
                                "the application checkpoint started")
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def test_a_pod_the_addon_did_not_set_up_is_paused_without_a_snapshot(
        admin, notebook_client, kfsim, recorder):
    """The Workspace was opted out when its pod was created (a stop, or the add-on's webhook
    down: failurePolicy Ignore), and opted in since: webhook.go mutatePod gave the pod neither
    gVisor, which a pod snapshot needs, nor the readiness gate. Before, the pause went through
    the add-on, which held it and triggered a snapshot GKE cannot take."""
    pod = await asyncio.to_thread(start_workspace, kfsim, example_kind(),
                                  {GKW_ENABLED: "false"})
    (p,) = kfsim.pods()
    assert not p["spec"].get("readinessGates") and not p["spec"].get("runtimeClassName")
    await asyncio.to_thread(kfsim.custom.patch_namespaced_custom_object, KF, KFV, NS,
                            "workspaces", "ws1",
                            {"metadata": {"annotations": {GKW_ENABLED: "true"}}})
    b = backend(notebook_client, pod, checkpoint_timeout=30)
    ctx = pause_ctx(recorder)
    snap = await b.snapshot(ctx)
    assert snap.gke_workspaces is False and snap.hold_writes is False, snap
    rel = await asyncio.wait_for(b.release(ctx), 20)
    assert rel.released and rel.snapshot_opt_out and "cannot snapshot it" in (rel.reason or "")
    await asyncio.to_thread(kfsim.wait, lambda: not kfsim.pods(), 10, "pod stopped")
    assert not kfsim.gkw_triggers_made and kfsim.snapshots_created == 0
    ws = ws_obj(kfsim)
    assert ws["spec"]["paused"] is True and STATE not in (ws["metadata"].get("annotations") or {})
    # the resume opts it back in before the pod is created: the new pod is set up
    out = await resume_workspace(Kube(admin), NS, "ws1", poll=0.05, timeout=30,
                                 restored_condition_wait=0)
    assert out["state"] == "started", out
    (p,) = kfsim.pods()
    assert p["spec"].get("runtimeClassName") == "gvisor", p["spec"]
    assert [g["conditionType"] for g in p["spec"]["readinessGates"]] == [ACTIVE]
