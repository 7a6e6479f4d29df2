"""GKEBackend against the API test server and the simulated cluster (tier 1)."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_pause.cluster.base import BackendError
from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.cluster.kube import PODS, SNAPSHOTS, TRIGGERS, Kube
from jupyter_pause.cluster.snapshots import dns_name, trigger_name

from .conftest import NS, notebook_pod, pause_ctx, resume_ctx


def backend(client, pod: str, **kw) -> GKEBackend:
    kw.setdefault("trigger_timeout", 10)
    kw.setdefault("snapshot_timeout", 10)
    kw.setdefault("restored_condition_wait", 0)
    return GKEBackend(api_client=client, pod_name=pod, namespace=NS, **kw)


def template() -> dict:
    pod = notebook_pod("x", labels={"app": "nb"})
    return {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}


def start_pod(sim, body: dict) -> dict:
    sim.create_pod(body)
    name = body["metadata"]["name"]
    return sim.wait(lambda: next((p for p in sim.pods() if p["metadata"]["name"] == name and
                                  p["status"].get("phase") == "Running"), None),
                    what=f"pod {name} running")


def objects(apiserver, plural: str) -> list[dict]:
    srv = apiserver.server
    kind = next(k for k in srv.kinds if k.plural == plural)
    return apiserver.call(lambda: list(srv.store[kind].values()))


async def test_describe_detects_feature(apiserver, notebook_client):
    b = backend(notebook_client, "nb")
    d = await b.describe()
    assert d == {"name": "gke", "configured": True, "can_pause": True, "why_not": None}
    apiserver.call(apiserver.server.hidden_groups.add, "podsnapshot.gke.io")
    b2 = backend(notebook_client, "nb")
    d2 = await b2.describe()
    assert d2["can_pause"] is False and "not installed" in d2["why_not"]


async def test_snapshot_ok_then_release_statefulset(apiserver, notebook_client, sim, recorder):
    sim.apps.create_namespaced_stateful_set(NS, {
        "metadata": {"name": "nb"},
        "spec": {"replicas": 1, "serviceName": "nb",
                 "selector": {"matchLabels": {"app": "nb"}},
                 "template": template()}})
    sim.wait(lambda: any(p["metadata"]["name"] == "nb-0" and p["status"].get("phase") == "Running"
                         for p in sim.pods()), what="nb-0 running")
    b = backend(notebook_client, "nb-0", gpu_model="nvidia-l4")
    ctx = pause_ctx(recorder)
    out = await b.snapshot(ctx)
    assert out.snapshot and out.stop_via == "statefulset"
    assert any("Ready" in m or "AwaitingCheckpoint" in m for m in recorder.messages)
    policy = objects(apiserver, "podsnapshotpolicies")[0]
    assert policy["spec"]["triggerConfig"] == {"type": "manual", "postCheckpoint": "resume"}
    assert policy["spec"]["selector"]["matchLabels"] == {
        "statefulset.kubernetes.io/pod-name": "nb-0"}
    trig = objects(apiserver, "podsnapshotmanualtriggers")[0]
    assert trig["spec"] == {"targetPod": "nb-0"} and len(trig["metadata"]["name"]) <= 63
    snap = objects(apiserver, "podsnapshots")[0]
    assert snap["metadata"]["name"] == out.snapshot
    # release only after Ready: the pod goes away through its StatefulSet
    rel = await b.release(ctx)
    assert rel.to_dict() == {"released": True, "stopped_via": "statefulset", "owner": "nb"}
    sim.wait(lambda: not any(p["metadata"]["name"] == "nb-0" for p in sim.pods()),
             what="nb-0 stopped")


async def test_trigger_failed_is_reported_and_cleaned(apiserver, notebook_client, sim, recorder):
    start_pod(sim, notebook_pod("nb"))
    sim.trigger_outcome = "failed"
    b = backend(notebook_client, "nb")
    with pytest.raises(BackendError) as ei:
        await b.snapshot(pause_ctx(recorder))
    assert ei.value.reason == "snapshot_failed"
    assert "CUDA checkpoint returned an error" in str(ei.value)
    assert objects(apiserver, "podsnapshotmanualtriggers") == []  # not leaked
    # the pod keeps running: nothing was stopped
    assert any(p["metadata"]["name"] == "nb" and p["status"]["phase"] == "Running"
               for p in sim.pods())


async def test_trigger_error_reason(apiserver, notebook_client, sim, recorder):
    start_pod(sim, notebook_pod("nb"))
    sim.trigger_outcome = "error"
    sim.trigger_message = "gVisor checkpoint: ENOSPC"
    with pytest.raises(BackendError, match="Error: gVisor checkpoint: ENOSPC"):
        await backend(notebook_client, "nb").snapshot(pause_ctx(recorder))


async def test_snapshot_never_ready_times_out(apiserver, notebook_client, sim, recorder):
    start_pod(sim, notebook_pod("nb"))
    sim.upload_outcome = "hang"
    b = backend(notebook_client, "nb", snapshot_timeout=1.5)
    with pytest.raises(BackendError) as ei:
        await b.snapshot(pause_ctx(recorder))
    assert ei.value.reason == "snapshot_timeout" and "not Ready after" in str(ei.value)
    assert any("AwaitingCheckpoint" in m for m in recorder.messages)


async def test_pod_deleted_mid_upload(apiserver, notebook_client, sim, recorder):
    start_pod(sim, notebook_pod("nb"))
    sim.upload_s = 30
    b = backend(notebook_client, "nb")
    task = asyncio.create_task(b.snapshot(pause_ctx(recorder)))
    await asyncio.to_thread(sim.wait, lambda: objects(apiserver, "podsnapshots"),
                            what="snapshot created")
    await asyncio.to_thread(sim.delete_pod, "nb")
    with pytest.raises(BackendError, match="deleted before the checkpoint upload finished"):
        await task


async def test_rbac_forbidden_on_trigger(apiserver, notebook_client, sim, recorder):
    start_pod(sim, notebook_pod("nb"))
    apiserver.call(apiserver.server.deny, "create", "podsnapshotmanualtriggers")
    with pytest.raises(BackendError) as ei:
        await backend(notebook_client, "nb").snapshot(pause_ctx(recorder))
    assert ei.value.reason == "rbac" and "forbidden" in str(ei.value)
    assert ei.value.hint and "rbac.yaml" in ei.value.hint
    assert "\n" not in str(ei.value)


async def test_existing_trigger_is_joined_not_duplicated(apiserver, notebook_client, sim,
                                                         recorder):
    start_pod(sim, notebook_pod("nb"))
    sim.upload_s = 0.5
    b1, b2 = backend(notebook_client, "nb"), backend(notebook_client, "nb")
    # Hold the agent until both pauses see the same pending trigger.
    sim.trigger_outcome = "hold"
    apiserver.call(apiserver.server.fail_next, "create", "podsnapshotmanualtriggers", 409, 1,
                   "AlreadyExists", "already exists")
    t1 = asyncio.create_task(b1.snapshot(pause_ctx(recorder)))
    await asyncio.to_thread(sim.wait, lambda: objects(apiserver, "podsnapshotmanualtriggers"),
                            what="trigger")
    t2 = asyncio.create_task(b2.snapshot(pause_ctx(recorder)))
    await asyncio.sleep(0.3)
    sim.trigger_outcome = "complete"
    r1, r2 = await asyncio.gather(t1, t2)
    assert r1.snapshot == r2.snapshot and r1.trigger == r2.trigger
    assert len(objects(apiserver, "podsnapshotmanualtriggers")) == 1
    assert sim.snapshots_created == 1


async def test_watch_dropped_and_410_resumed(apiserver, notebook_client, sim, recorder):
    start_pod(sim, notebook_pod("nb"))
    sim.upload_s = 1.0
    apiserver.call(apiserver.server.drop_watches_after, 1)
    b = backend(notebook_client, "nb")
    task = asyncio.create_task(b.snapshot(pause_ctx(recorder)))
    await asyncio.to_thread(sim.wait, lambda: objects(apiserver, "podsnapshots"), what="snap")
    apiserver.call(apiserver.server.expire_watches)  # history compacted: 410 Gone
    out = await task
    assert out.snapshot
    reqs = apiserver.call(lambda: list(apiserver.server.requests))
    assert reqs.count(("list", "podsnapshots")) >= 2  # re-listed after the 410


async def test_policy_stop_for_bare_pod_and_gc(apiserver, notebook_client, sim, recorder):
    start_pod(sim, notebook_pod("nb"))
    b = backend(notebook_client, "nb", keep_snapshots=1)
    out1 = await b.snapshot(pause_ctx(recorder))
    assert out1.stop_via == "policy"
    pol = objects(apiserver, "podsnapshotpolicies")[0]
    assert pol["spec"]["triggerConfig"]["postCheckpoint"] == "stop"
    sim.wait(lambda: any(p["status"].get("phase") == "Succeeded" for p in sim.pods()),
             what="pod Completed")
    assert (await b.release(pause_ctx(recorder))).stopped_via == "policy"
    # Two more snapshots of the same workspace (new pods), then gc keeps the newest one.
    for i in range(2):
        await asyncio.to_thread(sim.delete_pod, "nb")
        await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 5, "pod gone")
        await asyncio.to_thread(start_pod, sim, notebook_pod("nb", image=f"jupyter/lab:{i}"))
        await backend(notebook_client, "nb").snapshot(pause_ctx(recorder))
        await asyncio.sleep(1.1)  # creationTimestamps have second resolution
    assert len(objects(apiserver, "podsnapshots")) == 3
    dry = await b.gc(keep=1, older_than=None, dry_run=True)
    assert len(dry["would_delete"]) == 4 and objects(apiserver, "podsnapshots")
    res = await b.gc(keep=1, older_than=None, dry_run=False)
    assert len(res["deleted"]) == 4 and not res["stuck"]
    left = objects(apiserver, "podsnapshots")
    assert len(left) == 1 and left[0]["metadata"]["name"] in res["remaining"]
    assert len(objects(apiserver, "podsnapshotmanualtriggers")) == 1
    assert objects(apiserver, "podsnapshotpolicies")  # the policy stays while snapshots exist


async def test_woke_up_in_restored_pod_does_not_stop_it(apiserver, notebook_client, sim,
                                                         recorder):
    """A restore revives this process mid-snapshot: the pod by its name now has another uid."""
    sim.apps.create_namespaced_stateful_set(NS, {
        "metadata": {"name": "nb"},
        "spec": {"replicas": 1, "serviceName": "nb",
                 "selector": {"matchLabels": {"app": "nb"}},
                 "template": template()}})
    sim.wait(lambda: any(p["status"].get("phase") == "Running" for p in sim.pods()), what="run")
    sim.upload_s = 1.0
    b = backend(notebook_client, "nb-0")
    task = asyncio.create_task(b.snapshot(pause_ctx(recorder)))
    await asyncio.to_thread(sim.wait, lambda: objects(apiserver, "podsnapshots"), what="snap")
    # The snapshot is being uploaded. Emulate "this process now runs in the restored pod":
    # the StatefulSet's pod was replaced (new uid) while the process slept in the wait.
    sim.upload_s = 0
    await task
    await asyncio.to_thread(sim.delete_pod, "nb-0")
    await asyncio.to_thread(sim.wait, lambda: any(
        p["metadata"]["name"] == "nb-0" and p["status"].get("phase") == "Running"
        for p in sim.pods()), 10, "nb-0 back")
    rel = await b.release(pause_ctx(recorder))
    assert rel.released is False and rel.woke_up is True
    sts = sim.apps.read_namespaced_stateful_set("nb", NS)
    assert sts.spec.replicas == 1


async def test_restored_live_reasons(apiserver, notebook_client, admin, sim, recorder):
    kube = Kube(admin)
    # pause on an L4 node
    start_pod(sim, notebook_pod("nb"))
    b = backend(notebook_client, "nb", gpu_model="nvidia-l4")
    out = await b.snapshot(pause_ctx(recorder))
    await asyncio.to_thread(sim.delete_pod, "nb")
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 5, "gone")
    # live restore
    start_pod(sim, notebook_pod("nb", annotations={"podsnapshot.gke.io/ps-name": out.snapshot}))
    b_new = backend(notebook_client, "nb", gpu_model="nvidia-l4")
    verdict = await b_new.restored_live(resume_ctx(recorder))
    assert verdict.live is True, verdict
    assert out.snapshot in verdict.reason
    # cold start on another GPU model: no PodRestored; the reason comes from the trigger record
    await kube.delete(PODS, "nb", NS)
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 5, "gone")
    sim.nodes = {"gpu-t4-a": ("nvidia-tesla-t4", 1)}
    start_pod(sim, notebook_pod("nb", annotations={"podsnapshot.gke.io/ps-name": out.snapshot}))
    b_t4 = backend(notebook_client, "nb", gpu_model="nvidia-tesla-t4")
    verdict = await b_t4.restored_live(resume_ctx(recorder))
    assert verdict.live is False, verdict
    assert verdict.reason.startswith("pod was cold-started: snapshot for another GPU model")
    # a failed restore reports GKE's reason
    await kube.delete(PODS, "nb", NS)
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 5, "gone")
    sim.restore_mode = "fail"
    sim.nodes = {"gpu-l4-a": ("nvidia-l4", 1)}
    start_pod(sim, notebook_pod("nb", annotations={"podsnapshot.gke.io/ps-name": out.snapshot}))
    b_f = backend(notebook_client, "nb", gpu_model="nvidia-l4")
    verdict = await b_f.restored_live(resume_ctx(recorder))
    assert verdict.live is False, verdict
    assert "RestoreFailed" in verdict.reason
    assert len(await kube.list(SNAPSHOTS, NS)) and (await kube.list(TRIGGERS, NS))["items"]


def test_names_fit_kubernetes_limits():
    name = trigger_name("My_Very-Long.Workspace" * 6)
    assert len(name) <= 63 and name.startswith("jp-my-very-long-workspace")
    assert all(ch.isalnum() or ch == "-" for ch in name) and name == name.lower()
    assert len(dns_name("jp", "w" * 100)) == 63


async def test_podrestored_after_ready_is_waited_for(apiserver, notebook_client, sim, recorder):
    """GKE sets PodRestored some seconds after the container runs: no premature cold start."""
    start_pod(sim, notebook_pod("nb"))
    out = await backend(notebook_client, "nb", gpu_model="nvidia-l4").snapshot(
        pause_ctx(recorder))
    await asyncio.to_thread(sim.delete_pod, "nb")
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 5, "gone")
    sim.restored_delay = 1.0
    start_pod(sim, notebook_pod("nb", annotations={"podsnapshot.gke.io/ps-name": out.snapshot}))
    b = backend(notebook_client, "nb", gpu_model="nvidia-l4", restored_condition_wait=10)
    verdict = await b.restored_live(resume_ctx(recorder))
    assert verdict.live is True, verdict
    # without waiting, the same pod would have looked cold-started
    assert sim.restores


def stop_ctx(recorder):
    ctx = pause_ctx(recorder)
    ctx.mode = "stop"  # an idle stop: no checkpoint, snapshot() is never called
    return ctx


async def test_stop_mode_bare_pod_with_policy_path_is_refused(apiserver, notebook_client, sim,
                                                              recorder):
    """A stop takes no snapshot, so no trigger's postCheckpoint: stop would ever stop a bare pod:
    release must say so instead of claiming the accelerator was released."""
    start_pod(sim, notebook_pod("nb"))
    for stop_via in ("auto", "policy"):
        b = backend(notebook_client, "nb", stop_via=stop_via)
        with pytest.raises(BackendError) as err:
            await b.release(stop_ctx(recorder))
        assert err.value.reason == "no_owner" and "without a snapshot" in str(err.value)
        assert err.value.hint and "pause instead" in err.value.hint
    await asyncio.sleep(0.3)  # the simulated cluster would have acted by now
    (pod,) = sim.pods()
    assert pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
    assert not objects(apiserver, "podsnapshotmanualtriggers")


async def test_stop_mode_policy_path_stops_through_statefulset(apiserver, notebook_client, sim,
                                                                recorder):
    sim.apps.create_namespaced_stateful_set(NS, {
        "metadata": {"name": "nb"},
        "spec": {"replicas": 1, "serviceName": "nb",
                 "selector": {"matchLabels": {"app": "nb"}},
                 "template": template()}})
    sim.wait(lambda: any(p["metadata"]["name"] == "nb-0" and p["status"].get("phase") == "Running"
                         for p in sim.pods()), what="nb-0 running")
    b = backend(notebook_client, "nb-0", stop_via="policy")
    rel = await b.release(stop_ctx(recorder))
    assert rel.to_dict() == {"released": True, "stopped_via": "statefulset", "owner": "nb"}
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 10, "nb-0 stopped")
    assert sim.apps.read_namespaced_stateful_set("nb", NS).spec.replicas == 0
    assert not objects(apiserver, "podsnapshotmanualtriggers")


async def test_stop_mode_policy_path_pauses_the_workspace(apiserver, notebook_client, sim,
                                                           recorder):
    sim.custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", NS, "workspaces", {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Workspace",
        "metadata": {"name": "ws1"}, "spec": {"paused": False, "kind": "jupyterlab"}})
    sim.wait(lambda: any(p["metadata"]["name"] == "ws-ws1-0" and
                         p["status"].get("phase") == "Running" for p in sim.pods()),
             what="ws-ws1-0 running")
    b = backend(notebook_client, "ws-ws1-0", stop_via="policy")
    rel = await b.release(stop_ctx(recorder))
    assert rel.to_dict() == {"released": True, "stopped_via": "workspace", "owner": "ws1"}
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 10, "workspace pod stopped")
    ws = sim.custom.get_namespaced_custom_object("kubeflow.org", "v1beta1", NS, "workspaces",
                                                 "ws1")
    assert ws["spec"]["paused"] is True
