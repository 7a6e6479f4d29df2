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

from jupyter_pause.cluster.base import BackendError
from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.cluster.kube import Kube
from jupyter_pause.cluster.resume import resume_workspace

from .conftest import NS, gke_server_config, notebook_pod, pause_ctx
from .test_e2e_server import _run
from .test_gke_backend import objects, start_pod

pytestmark = pytest.mark.timeout(300)


def with_pvc(pod: dict) -> dict:
    pod["spec"]["volumes"] = [{"name": "home", "persistentVolumeClaim": {"claimName": "home"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "home",
                                                     "mountPath": "/home/jovyan"}]
    return pod


async def test_statefulset_pod_with_pvc_is_snapshotted_with_stop(apiserver, notebook_client, sim,
                                                                  recorder):
    """Before: a StatefulSet pod got `postCheckpoint: resume` and was then scaled down, so the
    server's shutdown wrote to the home volume after the snapshot."""
    pod = with_pvc(notebook_pod("x", labels={"app": "nb"}))
    sim.apps.create_namespaced_stateful_set(NS, {
        "metadata": {"name": "nb"},
        "spec": {"replicas": 1, "serviceName": "nb", "selector": {"matchLabels": {"app": "nb"}},
                 "template": {"metadata": {"labels": {"app": "nb"}}, "spec": pod["spec"]}}})
    await asyncio.to_thread(sim.wait, lambda: any(
        p["metadata"]["name"] == "nb-0" and p["status"].get("phase") == "Running"
        for p in sim.pods()), 10, "nb-0 running")
    b = GKEBackend(api_client=notebook_client, pod_name="nb-0", namespace=NS,
                   gpu_model="nvidia-l4", trigger_timeout=10, snapshot_timeout=10)
    out = await b.snapshot(pause_ctx(recorder))
    assert out["stop_via"] == "policy" and out["hold_writes"] is True
    (policy,) = objects(apiserver, "podsnapshotpolicies")
    assert policy["spec"]["triggerConfig"] == {"type": "manual", "postCheckpoint": "stop"}
    await asyncio.to_thread(sim.wait, lambda: any(
        p["status"].get("phase") == "Succeeded" for p in sim.pods()), 10, "pod Completed by GKE")
    # GKE stopped it; the process does not scale its StatefulSet (it would not run any more).
    assert (await b.release(pause_ctx(recorder)))["stopped_via"] == "policy"
    sts = sim._raw(sim.apps.read_namespaced_stateful_set, "nb", NS)
    assert sts["spec"]["replicas"] == 1


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
