"""A pod with a PersistentVolumeClaim: GKE's rule is `postCheckpoint: stop`.

GKE's Pod snapshot troubleshooting page ("Post-checkpoint mutation risks with PVCs"): with
`postCheckpoint: resume` the application keeps running and can change the PVC after the
checkpoint, and the restore then fails; use `stop`. Seen as `vfs.CompleteRestore() failed` and a
permanent CrashLoopBackOff in gke-labs/pod-migration issue 15. So nothing jupyter-pause owns may be
written to the pod's volumes once the trigger exists: the journal entry written before it
(checkpoint_written, state "snapshotting") has to settle the pause after a restore or a cold start.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from traitlets.config import Config

from jupyter_pause.cluster.base import BackendError
from jupyter_pause.cluster.doctor import run_checks
from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.cluster.kube import Kube, api_client_for
from jupyter_pause.cluster.permissions import (
    NOTEBOOK_CLUSTER_PERMISSIONS,
    NOTEBOOK_PERMISSIONS,
    union,
)
from jupyter_pause.cluster.resume import resume_workspace
from jupyter_pause.cluster.statefulset import DETACHED_ANNOTATION

from .conftest import NS, gke_server_config, notebook_pod, pause_ctx
from .test_e2e_server import _run
from .test_gke_backend import objects, start_pod
from .test_gke_restore_faults import make_statefulset

pytestmark = pytest.mark.timeout(300)


def with_pvc(pod: dict) -> dict:
    pod["spec"]["volumes"] = [{"name": "home", "persistentVolumeClaim": {"claimName": "home"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "home",
                                                     "mountPath": "/home/jovyan"}]
    return pod


def pvc_statefulset(sim, name: str = "nb") -> str:
    return make_statefulset(sim, name, pod_of=with_pvc)


def phase_of(sim, name: str) -> str | None:
    return next((p["status"].get("phase") for p in sim.pods() if p["metadata"]["name"] == name),
                None)


def unschedulable(sim, name: str) -> bool:
    return any(p["metadata"]["name"] == name and any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in p["status"].get("conditions") or []) for p in sim.pods())


async def test_statefulset_pod_with_pvc_leaves_its_statefulset_and_frees_the_gpu(
        apiserver, notebook_client, admin, sim, recorder):
    """GKE stops a pod with a PVC itself (postCheckpoint: stop) and the StatefulSet controller
    re-creates a Succeeded pod at once (stateful_set_control.go), which GKE restores: the pause
    takes the pod out of its StatefulSet and scales that to 0 before the trigger. The proof is a
    second GPU pod that gets the cluster's one GPU; then the resume brings the workspace back."""
    pod = await asyncio.to_thread(pvc_statefulset, sim)
    b = GKEBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                   gpu_model="nvidia-l4", trigger_timeout=10, snapshot_timeout=10)
    ctx = pause_ctx(recorder)
    out = await b.snapshot(ctx)
    assert out.stop_via == "statefulset" and out.hold_writes is True
    (policy,) = objects(apiserver, "podsnapshotpolicies")
    assert policy["spec"]["triggerConfig"] == {"type": "manual", "postCheckpoint": "stop"}
    await asyncio.to_thread(sim.wait, lambda: phase_of(sim, pod) == "Succeeded", 10,
                            "pod Completed by GKE")
    rel = await b.release(ctx)
    assert (rel.released, rel.stopped_via, rel.owner) == (True, "statefulset", "nb")
    sts = sim._raw(sim.apps.read_namespaced_stateful_set, "nb", NS)
    assert sts["spec"]["replicas"] == 0
    # the GPU is free: another workspace's pod is scheduled on the cluster's only GPU node
    await asyncio.to_thread(sim.create_pod, notebook_pod("other"))
    await asyncio.to_thread(sim.wait, lambda: phase_of(sim, "other") == "Running", 10,
                            "the other pod running")
    (stopped,) = [p for p in sim.pods() if p["metadata"]["name"] == pod]
    assert stopped["status"]["phase"] == "Succeeded" and sim.restores == []
    assert not stopped["metadata"].get("ownerReferences")
    assert "app" not in stopped["metadata"]["labels"]
    assert stopped["metadata"]["labels"]["jupyter-pause.io/workspace"] == "nb"
    assert stopped["metadata"]["uid"] == b.pod.paused_as["uid"]  # never re-created
    sim.delete_pod("other")
    await asyncio.to_thread(sim.wait, lambda: phase_of(sim, "other") is None, 10, "other gone")
    snap = out.snapshot
    res = await resume_workspace(Kube(admin), NS, "nb", poll=0.05, timeout=30,
                                 restored_condition_wait=1)
    assert res["state"] == "restored_live", res
    assert sim.restores == [(pod, snap)]
    (back,) = [p for p in sim.pods() if p["metadata"]["name"] == pod]
    assert back["metadata"]["labels"]["app"] == "nb"
    assert [r["name"] for r in back["metadata"]["ownerReferences"]] == ["nb"]


async def test_the_old_way_restores_the_pod_at_once_and_keeps_the_gpu(
        apiserver, notebook_client, admin, sim, recorder):
    """stop_via = "policy" leaves the pod in its StatefulSet: GKE stops it, the StatefulSet
    re-creates it, GKE restores it, and the GPU stays taken. Doctor warns about it."""
    pod = await asyncio.to_thread(pvc_statefulset, sim)
    b = GKEBackend(api_client=notebook_client, pod_name=pod, namespace=NS, stop_via="policy",
                   gpu_model="nvidia-l4", trigger_timeout=10, snapshot_timeout=10)
    out = await b.snapshot(pause_ctx(recorder))
    assert out.stop_via == "policy"
    await asyncio.to_thread(sim.wait, lambda: sim.restores, 10, "the re-created pod restored")
    assert sim._raw(sim.apps.read_namespaced_stateful_set, "nb", NS)["spec"]["replicas"] == 1
    await asyncio.to_thread(sim.create_pod, notebook_pod("other"))
    await asyncio.to_thread(sim.wait, lambda: unschedulable(sim, "other"), 10,
                            "the other pod waiting for the GPU")
    checks = {c.name: c for c in await run_checks(
        Kube(admin), pod_name=pod, namespace=NS,
        config=Config({"GKEBackend": {"stop_via": "policy"}}))}
    c = checks["accelerator release"]
    assert c.status == "warn" and "StatefulSet nb re-creates this pod" in c.detail, c
    assert "stop_via at 'auto'" in c.fix


async def test_a_failed_snapshot_puts_the_pod_back_into_its_statefulset(
        apiserver, notebook_client, sim, recorder):
    pod = await asyncio.to_thread(pvc_statefulset, sim)
    uid = next(p["metadata"]["uid"] for p in sim.pods() if p["metadata"]["name"] == pod)
    sim.trigger_outcome = "failed"
    b = GKEBackend(api_client=notebook_client, pod_name=pod, namespace=NS,
                   gpu_model="nvidia-l4", trigger_timeout=10, snapshot_timeout=10,
                   discard_wait=2)
    with pytest.raises(BackendError):
        await b.snapshot(pause_ctx(recorder))
    assert sim._raw(sim.apps.read_namespaced_stateful_set, "nb", NS)["spec"]["replicas"] == 1

    def adopted() -> dict | None:
        return next((p for p in sim.pods() if p["metadata"]["name"] == pod and
                     p["metadata"].get("ownerReferences")), None)

    back = await asyncio.to_thread(sim.wait, adopted, 10, "the pod adopted again")
    assert back["metadata"]["uid"] == uid and back["status"]["phase"] == "Running"
    assert back["metadata"]["labels"]["app"] == "nb"
    assert DETACHED_ANNOTATION not in (back["metadata"].get("annotations") or {})


async def test_without_the_statefulsets_role_the_pause_stops_before_the_trigger(
        apiserver, sim, recorder):
    """An rbac.yaml without notebook-statefulset.yaml's Role: the pause says what to grant and
    takes no snapshot that would leave the GPU in use."""
    srv = apiserver.server
    apiserver.call(setattr, srv, "user", "system:admin")
    apiserver.call(srv.grant, "system:serviceaccount:user-ns:jupyter", "nb-token",
                   union(NOTEBOOK_PERMISSIONS, NOTEBOOK_CLUSTER_PERMISSIONS))
    pod = await asyncio.to_thread(pvc_statefulset, sim)
    b = GKEBackend(api_client=api_client_for(apiserver.url, token="nb-token"), pod_name=pod,
                   namespace=NS, gpu_model="nvidia-l4", trigger_timeout=10, snapshot_timeout=10)
    with pytest.raises(BackendError) as e:
        await b.snapshot(pause_ctx(recorder))
    assert e.value.reason == "rbac" and "notebook-statefulset.yaml" in e.value.hint
    assert objects(apiserver, "podsnapshotmanualtriggers") == []
    assert phase_of(sim, pod) == "Running"


async def test_existing_resume_policy_is_refused_for_a_pvc_pod(apiserver, notebook_client, sim,
                                                               recorder):
    start_pod(sim, with_pvc(notebook_pod("nb")))
    sim.custom.create_namespaced_custom_object("podsnapshot.gke.io", "v1", NS,
                                               "podsnapshotpolicies", {
        "apiVersion": "podsnapshot.gke.io/v1", "kind": "PodSnapshotPolicy",
        "metadata": {"name": "jp-nb"},
        "spec": {"selector": {"matchLabels": {"jupyter-pause.io/workspace": "nb"}},
                 "storageConfigName": "jupyter-pause-snapshots",
                 "triggerConfig": {"type": "manual"}}})  # postCheckpoint defaults to resume
    b = GKEBackend(api_client=notebook_client, pod_name="nb", namespace=NS,
                   gpu_model="nvidia-l4", trigger_timeout=10, snapshot_timeout=10)
    with pytest.raises(BackendError) as e:
        await b.snapshot(pause_ctx(recorder))
    assert e.value.reason == "policy_mismatch" and "postCheckpoint: stop" in e.value.hint
    assert objects(apiserver, "podsnapshotmanualtriggers") == []


@pytest.fixture
def jp_server_config(tmp_path, apiserver):
    return gke_server_config(tmp_path, apiserver.url, discard_wait=5.0)


async def test_nothing_is_written_after_the_trigger_and_the_next_start_settles_it(
        jp_serverapp, jp_fetch, api, apiserver, admin, sim):
    lifecycle = jp_serverapp.web_app.settings["jupyter_pause_lifecycle"]

    await asyncio.to_thread(start_pod, sim, with_pvc(notebook_pod("nb")))
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "nb.ipynb", "name": "nb.ipynb", "type": "notebook",
         "kernel": {"name": "python3"}}))
    kid = json.loads(r.body)["kernel"]["id"]
    await _run(jp_serverapp, kid, "x = 41 + 1")

    state_dir = lifecycle.journal.dir
    before_trigger: dict[str, str] = {}

    def files() -> dict[str, str]:
        return {p.name: p.read_text() for p in state_dir.iterdir() if p.is_file()}

    def on_create(kind, obj: dict) -> None:  # runs while the API server creates the trigger
        if kind.kind == "PodSnapshotManualTrigger":
            before_trigger.update(files())

    apiserver.call(apiserver.server.on_create.append, on_create)
    await api("POST", "pause", {"trigger": "manual"})
    await lifecycle.wait()
    assert before_trigger, "no trigger was created"
    await asyncio.to_thread(sim.wait, lambda: any(
        p["status"].get("phase") == "Succeeded" for p in sim.pods()), 10, "pod Completed by GKE")
    assert (await api("GET", "status"))["state"] == "paused"  # what the person sees
    # What is on the volume: exactly what was there when the trigger was created.
    assert files() == before_trigger
    journal = [json.loads(line) for line in before_trigger["journal.jsonl"].splitlines()]
    assert journal[-1]["event"] == "checkpoint_written"
    assert json.loads(before_trigger["state.json"])["state"] == "snapshotting"

    # The restore crashes (as with a volume written after the snapshot) and the resume falls
    # back to a cold start; the server that starts in that pod reads the journal.
    await jp_serverapp.kernel_manager.shutdown_all()
    sim.restore_mode = "crash"
    out = await resume_workspace(Kube(admin), NS, "nb", poll=0.05, timeout=30,
                                 restored_condition_wait=0.3, discard_wait=5)
    assert out["state"] == "cold_started", out
    lifecycle.load()  # the next server start
    assert lifecycle.state["state"] == "paused"
    await lifecycle.start()  # resume_on_start: restores from the application checkpoint
    await lifecycle.wait()
    st = await api("GET", "status")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    (k,) = st["last_report"]["kernels"]
    assert await _run(jp_serverapp, k["kernel_id"], "print(x)") == "42\n"
