"""What a real GKE cluster does on resume that the code must notice (tier 1).

- A restore that crashes: the kubelet reports it only in `containerStatuses` (CrashLoopBackOff with
  the runtime's `StartError` in `lastState.terminated`), never as a pod phase, and GKE has no
  cold-start fallback on that path (gke-labs/pod-migration issue 15).
- A pod that waits on scheduling gates (PodScheduled=False/SchedulingGated, KEP-3521) or on an
  image pull (ImagePullBackOff).
- The per-pod service-account token volume (ServiceAccount admission) and GKE's Warning event when
  it skips a restore (pod-migration issue 13); PodRestored naming the snapshot it restored
  (agent-sandbox `check_pod_restored_from_snapshot`).
- A capture that takes minutes: trigger and snapshot waits that run out, finalizers that hold.
"""

from __future__ import annotations

import asyncio

from jupyter_pause.cluster.base import BackendError
from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.cluster.kube import PS_NAME_ANNOTATION, Kube
from jupyter_pause.cluster.pod import distilled_spec_hash
from jupyter_pause.cluster.resume import pod_state, resume_workspace

from .conftest import NS, notebook_pod, pause_ctx, resume_ctx
from .test_gke_backend import start_pod


def backend(client, pod: str, **kw) -> GKEBackend:
    kw.setdefault("trigger_timeout", 10)
    kw.setdefault("snapshot_timeout", 10)
    kw.setdefault("restored_condition_wait", 0)
    kw.setdefault("discard_wait", 1)
    return GKEBackend(api_client=client, pod_name=pod, namespace=NS, **kw)


def objects(apiserver, plural: str) -> list[dict]:
    srv = apiserver.server
    kind = next(k for k in srv.kinds if k.plural == plural)
    return apiserver.call(lambda: list(srv.store[kind].values()))


def make_statefulset(sim, name: str = "nb", *, pod_of=lambda pod: pod) -> str:
    """notebook-statefulset.yaml's shape: selected by `app`, the workspace label beside it;
    ``pod_of`` changes the template's pod (a PVC, say)."""
    pod = pod_of(notebook_pod("x", labels={"app": name, "jupyter-pause.io/workspace": name}))
    sim.apps.create_namespaced_stateful_set(NS, {
        "metadata": {"name": name},
        "spec": {"replicas": 1, "serviceName": name,
                 "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": pod["metadata"]["labels"]},
                              "spec": pod["spec"]}}})
    sim.wait(lambda: any(p["metadata"]["name"] == f"{name}-0" and
                         p["status"].get("phase") == "Running" for p in sim.pods()),
             what=f"{name}-0 running")
    return f"{name}-0"


async def pause_statefulset(client, sim, recorder, pod: str) -> dict:
    b = backend(client, pod, gpu_model="nvidia-l4")
    ctx = pause_ctx(recorder)
    snap = await b.snapshot(ctx)
    assert (await b.release(ctx)).stopped_via == "statefulset"
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 10, "pod stopped")
    return snap


# -- kubelet-shaped statuses (core/v1 PodStatus/ContainerStatus; reasons from the kubelet's
# pkg/kubelet/container/sync_result.go and pkg/kubelet/images/types.go) --

def _pod(phase: str, statuses: list[dict], conditions: list[dict] | None = None,
         **spec) -> dict:
    return {"metadata": {"name": "nb-0", "uid": "u1", "annotations": {}},
            "spec": {"nodeName": "node-a", **spec},
            "status": {"phase": phase, "containerStatuses": statuses,
                       "conditions": conditions or [
                           {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]}}


def _waiting(reason: str, message: str, last: dict | None = None) -> dict:
    cs = {"name": "jupyterlab", "ready": False, "restartCount": 4, "image": "img",
          "imageID": "", "started": False,
          "state": {"waiting": {"reason": reason, "message": message}}}
    if last:
        cs["lastState"] = {"terminated": last}
    return cs


def test_pod_state_reads_what_the_kubelet_reports() -> None:
    crash = _pod("Running", [_waiting(
        "CrashLoopBackOff", "back-off 40s restarting failed container=jupyterlab pod=nb-0_ns(u1)",
        {"exitCode": 128, "reason": "StartError",
         "message": "OCI runtime restore failed: vfs.CompleteRestore() failed"})])
    state, why = pod_state(crash)
    assert state == "crashing" and "CrashLoopBackOff" in why and "CompleteRestore" in why
    for reason in ("RunContainerError", "CreateContainerError"):
        assert pod_state(_pod("Pending", [_waiting(reason, "runsc: restore failed")]))[0] == \
            "crashing"
    state, why = pod_state(_pod("Pending", [_waiting(
        "ImagePullBackOff", 'Back-off pulling image "jupyter/lab:9"')]))
    assert state == "image_pull_failing" and "jupyter/lab:9" in why
    assert pod_state(_pod("Pending", [_waiting(
        "CreateContainerConfigError", 'configmap "cfg" not found')]))[0] == "config_error"
    gated = _pod("Pending", [], [{"type": "PodScheduled", "status": "False",
                                  "reason": "SchedulingGated",
                                  "message": "Scheduling is blocked due to non-empty scheduling "
                                  "gates"}], schedulingGates=[{"name": "example.com/restore"}])
    gated["spec"].pop("nodeName")
    state, why = pod_state(gated)
    assert state == "gated" and "example.com/restore" in why
    unsched = _pod("Pending", [], [{"type": "PodScheduled", "status": "False",
                                    "reason": "Unschedulable",
                                    "message": "0/3 nodes are available: 3 Insufficient "
                                    "nvidia.com/gpu."}])
    unsched["spec"].pop("nodeName")
    assert pod_state(unsched) == ("waiting_for_capacity",
                                  "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")


async def test_crashing_restore_falls_back_to_a_cold_start(apiserver, admin, notebook_client,
                                                           sim, recorder):
    pod = make_statefulset(sim)
    snap = await pause_statefulset(notebook_client, sim, recorder, pod)
    sim.restore_mode = "crash"  # the restore itself crashes (vfs.CompleteRestore() failed)
    updates: list[dict] = []
    out = await resume_workspace(Kube(admin), NS, "nb", on_update=updates.append, poll=0.05,
                                 timeout=20, restored_condition_wait=0.3, discard_wait=5)
    assert out["state"] == "cold_started", out
    assert "CrashLoopBackOff" in out["reason"] and "CompleteRestore" in out["reason"]
    assert any(u["state"] == "restore_crashed" for u in updates)
    # GKE would pick the crashing snapshot again: it is gone, and the new pod runs without it.
    assert snap.snapshot not in [s["metadata"]["name"] for s in objects(apiserver,
                                                                           "podsnapshots")]
    (p,) = sim.pods()
    assert p["status"]["phase"] == "Running" and p["status"]["containerStatuses"][0]["ready"]
    assert sim.restores == []


async def test_crashing_restore_of_a_bare_pod_is_recreated_without_ps_name(
        apiserver, admin, notebook_client, sim, recorder):
    start_pod(sim, notebook_pod("nb"))
    b = backend(notebook_client, "nb", gpu_model="nvidia-l4")
    await b.snapshot(pause_ctx(recorder))
    await asyncio.to_thread(sim.wait, lambda: any(
        p["status"].get("phase") == "Succeeded" for p in sim.pods()), 10, "pod Completed")
    sim.restore_mode = "crash"
    out = await resume_workspace(Kube(admin), NS, "nb", poll=0.05, timeout=20,
                                 restored_condition_wait=0.3, discard_wait=5)
    assert out["state"] == "cold_started" and "CrashLoopBackOff" in out["reason"], out
    (p,) = sim.pods()
    assert PS_NAME_ANNOTATION not in (p["metadata"].get("annotations") or {})
    assert p["status"]["phase"] == "Running"


async def test_a_second_crash_is_a_failure_not_a_loop(apiserver, admin, notebook_client, sim,
                                                      recorder):
    pod = make_statefulset(sim)
    await pause_statefulset(notebook_client, sim, recorder, pod)
    sim.restore_mode = "crash"
    # After the fallback the cold pod crashes too (the application itself fails to start):
    # the kubelet's crash model applies to every start, with or without a snapshot.
    orig = sim.snapshot_for

    def crash_always(p: dict) -> dict | None:
        return orig(p) or {"metadata": {"name": "none", "annotations": {}}}
    sim.snapshot_for = crash_always
    out = await resume_workspace(Kube(admin), NS, "nb", poll=0.05, timeout=20,
                                 restored_condition_wait=0.3, discard_wait=2)
    assert out["state"] == "failed" and "CrashLoopBackOff" in out["reason"], out


async def test_gates_and_image_pulls_are_reported(admin, sim):
    sim.image_pull_fails = True
    gated = notebook_pod("gated")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    sim.create_pod(gated)
    sim.create_pod(notebook_pod("pulling"))
    seen: dict[str, list[dict]] = {"gated": [], "pulling": []}
    for name, updates in seen.items():
        out = await resume_workspace(Kube(admin), NS, name, on_update=updates.append,
                                     poll=0.05, timeout=1.5)
        assert out["state"] == "timeout"
    assert any(u["state"] == "gated" and "example.com/wait" in u["reason"]
               for u in seen["gated"])
    assert any(u["state"] == "image_pull_failing" and "ImagePullBackOff" in u["reason"]
               for u in seen["pulling"])


# -- cold-start reasons --

async def test_token_volume_differs_per_pod_but_not_the_distilled_spec(sim):
    """Every pod gets its own kube-api-access-<random> volume (ServiceAccount admission)."""
    sim.add_node("gpu-l4-b", "nvidia-l4", 1)
    a = start_pod(sim, notebook_pod("a", labels={"app": "x"}))
    b = start_pod(sim, notebook_pod("b", labels={"app": "x"}))
    assert a["spec"]["volumes"] != b["spec"]["volumes"]
    assert all(v["name"].startswith("kube-api-access-") for v in a["spec"]["volumes"])
    assert distilled_spec_hash(a) == distilled_spec_hash(b)


async def test_skipped_restore_reports_gkes_warning_not_a_spec_change(
        admin, notebook_client, sim, recorder):
    pod = make_statefulset(sim)
    await pause_statefulset(notebook_client, sim, recorder, pod)
    sim.restore_mode = "skip"  # GKE skips the restore (e.g. a newer node version) and warns
    out = await resume_workspace(Kube(admin), NS, "nb", poll=0.05, timeout=20,
                                 restored_condition_wait=0.3)
    assert out["state"] == "cold_started"
    b = backend(notebook_client, pod, gpu_model="nvidia-l4")
    verdict = await b.restored_live(resume_ctx(recorder))
    assert verdict.live is False, verdict
    assert verdict.reason.startswith("pod was cold-started: GKE: ")
    assert "falling back to a cold start" in verdict.reason
    assert "spec changed" not in verdict.reason


async def test_podrestored_from_another_snapshot_is_not_this_pause(
        admin, notebook_client, sim, recorder):
    pod = make_statefulset(sim)
    snap = await pause_statefulset(notebook_client, sim, recorder, pod)
    out = await resume_workspace(Kube(admin), NS, "nb", poll=0.05, timeout=20,
                                 restored_condition_wait=0.3)
    assert out["state"] == "restored_live" and snap.snapshot in out["reason"]
    # GKE picked an older snapshot of the workspace (PodRestored names it), not this pause's.
    p = next(x for x in sim.pods() if x["metadata"]["name"] == pod)
    conds = [c for c in p["status"]["conditions"] if c["type"] != "PodRestored"] + [{
        "type": "PodRestored", "status": "True", "reason": "Restored",
        "message": "Pod restored from snapshot jp-nb-20260101-000000-00000000-aaaaaa"}]
    await asyncio.to_thread(sim.patch_pod_status, pod, {"conditions": conds})
    b = backend(notebook_client, pod, gpu_model="nvidia-l4")
    verdict = await b.restored_live(resume_ctx(recorder))
    assert verdict.live is False, verdict
    assert snap.snapshot in verdict.reason and "another pod snapshot" in verdict.reason


# -- long captures --

async def test_trigger_wait_that_runs_out_looks_once_more(apiserver, notebook_client, sim,
                                                          recorder):
    """The capture ends as the wait runs out (the watch saw nothing): a fresh read finds the
    trigger Complete, and the snapshot that completed is used, not deleted."""
    start_pod(sim, notebook_pod("nb"))
    sim.trigger_outcome = "hold"  # the pod is frozen for the capture
    apiserver.call(apiserver.server.muted_watches.add, "podsnapshotmanualtriggers")
    # The trigger completes only once the test saw it: the wait must not run out before that
    b = backend(notebook_client, "nb", trigger_timeout=6)
    task = asyncio.create_task(b.snapshot(pause_ctx(recorder)))
    await asyncio.to_thread(sim.wait, lambda: objects(apiserver, "podsnapshotmanualtriggers"),
                            5, "trigger created")
    sim.trigger_outcome = "complete"
    out = await task
    assert out.snapshot in [s["metadata"]["name"] for s in objects(apiserver, "podsnapshots")]


async def test_snapshot_wait_that_runs_out_looks_once_more(apiserver, notebook_client, sim,
                                                           recorder):
    start_pod(sim, notebook_pod("nb"))
    sim.upload_outcome = "hang"  # a capture of tens of GiB
    apiserver.call(apiserver.server.muted_watches.add, "podsnapshots")
    b = backend(notebook_client, "nb", snapshot_timeout=6)
    task = asyncio.create_task(b.snapshot(pause_ctx(recorder)))
    await asyncio.to_thread(sim.wait, lambda: objects(apiserver, "podsnapshots"), 5,
                            "snapshot created")
    sim.upload_outcome = "ready"
    out = await task
    assert out.snapshot


async def test_failed_snapshot_held_by_its_finalizer_stays_listed(apiserver, notebook_client,
                                                                  sim, recorder):
    start_pod(sim, notebook_pod("nb"))
    sim.upload_outcome = "failed"
    sim.stuck_deleting = True  # GKE's finalizer cannot remove the files (IAM, agent restart)
    b = backend(notebook_client, "nb", discard_wait=0.5)
    try:
        await b.snapshot(pause_ctx(recorder))
        raise AssertionError("the failed upload must fail the snapshot")
    except BackendError as e:
        assert e.reason == "snapshot_failed"
    (snap,) = objects(apiserver, "podsnapshots")
    assert snap["metadata"].get("deletionTimestamp")
    # The trigger is how `jupyter pause snapshots` and gc() find the snapshot: it stays.
    (trig,) = objects(apiserver, "podsnapshotmanualtriggers")
    assert snap["metadata"]["labels"]["gke-pod-snapshot-triggered-by"] == \
        trig["metadata"]["name"]
    sim.stuck_deleting = False  # the finalizer finishes: gc() cleans up in the safe order
    res = await b.gc(older_than=None, every_ready=True)
    assert not res["stuck"] and not objects(apiserver, "podsnapshotmanualtriggers")


async def test_discard_never_deletes_a_ready_snapshot(apiserver, notebook_client, sim,
                                                      recorder):
    start_pod(sim, notebook_pod("nb"))
    b = backend(notebook_client, "nb")
    out = await b.snapshot(pause_ctx(recorder))
    await b.snapshots.discard(NS, out.trigger, b.discard_wait)  # as a failed wait does
    assert [s["metadata"]["name"] for s in objects(apiserver, "podsnapshots")] == \
        [out.snapshot]
    assert objects(apiserver, "podsnapshotmanualtriggers")
