"""Tier 2: the same backends against a real kube-apiserver (v1.20.2 + etcd, RBAC on).
(Over 400 lines: one costly fixture, the running apiserver, is shared by every test here.)

tests/kube/scripts/run.sh starts it with an admin, the notebook's service-account identity and a
user "resumer". The shipped CRDs, examples/kubernetes/rbac.yaml and resumer-rbac.yaml (bound to
"resumer") are applied with the admin credentials; the backend then runs with the NOTEBOOK
credentials and `jupyter pause resume --namespace` with the RESUMER ones, so these tests prove that
each shipped Role lets its holder do its job and denies it what it does not need. A Kubeflow
Workspace's own identity (ServiceAccount "ws-<name>", bound the way the Kubeflow controller binds the
WorkspaceKind's clusterRoles) is used through the admin's impersonation. The Kubeflow CRDs are
upstream's (crds/kubeflow.org.yaml). The simulated cluster (admin) plays scheduler, kubelet,
StatefulSet/Workspace controllers and the GKE snapshot agent.

Build the binary with tests/kube/scripts/build.sh (cached in ~/.cache/kube-apiserver-1.20.2) and
install etcd; set KUBE_APISERVER_BIN to use another binary.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from jupyter_pause.cluster.doctor import run_checks
from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.cluster.kube import PODS, STATEFULSETS, Kube, KubeError, Res
from jupyter_pause.cluster.kubeflow import KubeflowBackend
from jupyter_pause.cluster.permissions import (
    KUBEFLOW_PERMISSIONS,
    NOTEBOOK_PERMISSIONS,
    RESUMER_PERMISSIONS,
    STATEFULSET_PERMISSIONS,
)
from jupyter_pause.cluster.resume import resume_workspace

from .conftest import NS, KubeflowSim, Recorder, notebook_pod, pause_ctx, resume_ctx, workspace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kubernetes"
RUN_SH = Path(__file__).parent / "scripts" / "run.sh"
BIN = Path(os.environ.get("KUBE_APISERVER_BIN") or
           Path.home() / ".cache" / "kube-apiserver-1.20.2" / "kube-apiserver")

pytestmark = [
    pytest.mark.kube_apiserver,
    pytest.mark.skipif(not BIN.is_file(), reason=f"no kube-apiserver binary at {BIN} (build it "
                       "with tests/kube/scripts/build.sh, or set KUBE_APISERVER_BIN)"),
    pytest.mark.skipif(shutil.which("etcd") is None,
                       reason="etcd not on PATH (apt-get install etcd-server)"),
]


def _client(kubeconfig: Path) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def apply(api: client.ApiClient, path: Path) -> None:
    """Create every object of a manifest (a tiny `kubectl create -f`)."""
    ext = client.ApiextensionsV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    core = client.CoreV1Api(api)
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc["kind"] == "StatefulSet":  # the workloads are the tests' own
            continue
        kind, ns = doc["kind"], doc["metadata"].get("namespace")
        namespaced = {"ServiceAccount": core.create_namespaced_service_account,
                      "Role": rbac.create_namespaced_role,
                      "RoleBinding": rbac.create_namespaced_role_binding}
        cluster = {"CustomResourceDefinition": ext.create_custom_resource_definition,
                   "ClusterRole": rbac.create_cluster_role,
                   "ClusterRoleBinding": rbac.create_cluster_role_binding}
        if kind in namespaced:
            namespaced[kind](ns, doc)
        else:
            cluster[kind](doc)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("kube")
    env = {**os.environ, "NB_NAMESPACE": NS, "NB_SERVICEACCOUNT": "jupyter"}
    proc = subprocess.run(["bash", str(RUN_SH), str(d), str(BIN)], check=False, env=env, capture_output=True,
                          text=True, timeout=150)
    pids = [int(p) for p in (d / "pids").read_text().split()] if (d / "pids").exists() else []
    try:
        assert proc.returncode == 0, proc.stderr[-2000:]
        admin = _client(d / "admin.kubeconfig")
        core = client.CoreV1Api(admin)
        core.create_namespace({"metadata": {"name": NS}})
        client.NodeV1Api(admin).create_runtime_class(
            {"metadata": {"name": "gvisor"}, "handler": "runsc"})
        for f in ("crds/podsnapshot.gke.io.yaml", "crds/kubeflow.org.yaml", "rbac.yaml",
                  "resumer-rbac.yaml", "notebook-statefulset.yaml"):
            apply(admin, EXAMPLES / f)
        client.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(NS, {
            "metadata": {"name": "jupyter-pause-resumer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "jupyter-pause-resumer"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": "resumer"}]})
        custom = client.CustomObjectsApi(admin)
        deadline = time.monotonic() + 60
        while True:  # CRDs are served once Established
            try:
                kinds = {r.kind for r in custom.get_api_resources("podsnapshot.gke.io", "v1")
                         .resources} | {r.kind for r in custom.get_api_resources(
                             "kubeflow.org", "v1beta1").resources}
                if {"PodSnapshot", "PodSnapshotManualTrigger", "Workspace",
                        "WorkspaceKind"} <= kinds:
                    break
            except ApiException:
                pass
            assert time.monotonic() < deadline, "CRDs not served"
            time.sleep(0.5)
        custom.create_cluster_custom_object("podsnapshot.gke.io", "v1",
                                            "podsnapshotstorageconfigs", {
            "apiVersion": "podsnapshot.gke.io/v1", "kind": "PodSnapshotStorageConfig",
            "metadata": {"name": "jupyter-pause-snapshots"},
            "spec": {"snapshotStorageConfig": {"gcs": {"bucket": "b", "path": "p"}}}})
        custom.patch_cluster_custom_object_status(
            "podsnapshot.gke.io", "v1", "podsnapshotstorageconfigs", "jupyter-pause-snapshots",
            {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                                        "lastTransitionTime":
                                        "2026-01-01T00:00:00Z"}]}})
        yield {"dir": d, "admin": admin, "notebook": _client(d / "notebook.kubeconfig"),
               "resumer": _client(d / "resumer.kubeconfig")}
    finally:
        _stop(pids)


def _stop(pids: list[int]) -> None:
    """SIGTERM the apiserver and etcd this module started; SIGKILL what is left after 15 s."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 15
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def sim(cluster):
    # KubeflowSim: a SimCluster whose Workspace status is complete (the real CRD requires it)
    s = KubeflowSim(cluster["admin"], NS, nodes={"gpu-l4-a": ("nvidia-l4", 1)}, tick=0.1).start()
    yield s
    s.stop()
    # leave the namespace empty for the next test
    core = client.CoreV1Api(cluster["admin"])
    apps = client.AppsV1Api(cluster["admin"])
    custom = client.CustomObjectsApi(cluster["admin"])
    for sts in apps.list_namespaced_stateful_set(NS, _preload_content=False).json()["items"]:
        apps.delete_namespaced_stateful_set(sts["metadata"]["name"], NS)
    for plural, group, version in (("workspaces", "kubeflow.org", "v1beta1"),
                                   ("podsnapshots", "podsnapshot.gke.io", "v1"),
                                   ("podsnapshotmanualtriggers", "podsnapshot.gke.io", "v1"),
                                   ("podsnapshotpolicies", "podsnapshot.gke.io", "v1")):
        for o in custom.list_namespaced_custom_object(group, version, NS, plural)["items"]:
            if o["metadata"].get("finalizers"):
                custom.patch_namespaced_custom_object(
                    group, version, NS, plural, o["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                    _content_type="application/merge-patch+json")
            custom.delete_namespaced_custom_object(group, version, NS, plural,
                                                   o["metadata"]["name"])
    for p in core.list_namespaced_pod(NS, _preload_content=False).json()["items"]:
        core.delete_namespaced_pod(p["metadata"]["name"], NS, grace_period_seconds=0)
    for k in custom.list_cluster_custom_object("kubeflow.org", "v1beta1", "workspacekinds")["items"]:
        custom.delete_cluster_custom_object("kubeflow.org", "v1beta1", "workspacekinds",
                                            k["metadata"]["name"])
    rbac = client.RbacAuthorizationV1Api(cluster["admin"])
    for rb in rbac.list_namespaced_role_binding(NS, label_selector=WS_LABEL).items:
        rbac.delete_namespaced_role_binding(rb.metadata.name, NS)
    for sa in core.list_namespaced_service_account(NS, label_selector=WS_LABEL).items:
        core.delete_namespaced_service_account(sa.metadata.name, NS)
    assert not s.errors, s.errors


def _status(fn, *args, **kw) -> int:
    try:
        fn(*args, **kw)
        return 200
    except ApiException as e:
        return e.status


def test_shipped_role_denies_what_is_not_needed(cluster, sim):
    nb = cluster["notebook"]
    core, custom = client.CoreV1Api(nb), client.CustomObjectsApi(nb)
    sim.create_pod(notebook_pod("victim"))
    sim.wait(lambda: sim.pods(), what="pod")
    # allowed: its own job
    assert _status(core.read_namespaced_pod, "victim", NS, _preload_content=False) == 200
    assert _status(custom.list_namespaced_custom_object, "podsnapshot.gke.io", "v1", NS,
                   "podsnapshots") == 200
    # denied: everything else
    assert _status(core.delete_namespaced_pod, "victim", NS) == 403
    assert _status(core.create_namespaced_pod, NS, notebook_pod("x")) == 403
    assert _status(core.read_namespaced_secret, "any", NS) == 403
    assert _status(core.list_namespaced_secret, NS) == 403
    assert _status(custom.create_namespaced_custom_object, "podsnapshot.gke.io", "v1", NS,
                   "podsnapshots", {"apiVersion": "podsnapshot.gke.io/v1", "kind": "PodSnapshot",
                                    "metadata": {"name": "forged"},
                                    "spec": {"policyName": "x"}}) == 403
    assert _status(custom.delete_namespaced_custom_object, "podsnapshot.gke.io", "v1", NS,
                   "podsnapshotpolicies", "any") == 403
    assert _status(core.list_namespace) == 403
    assert _status(custom.list_namespaced_custom_object, "podsnapshot.gke.io", "v1", "default",
                   "podsnapshots") == 403  # another namespace


async def test_every_verb_the_product_uses_is_granted(cluster, sim):
    kube = Kube(cluster["notebook"])
    for (group, resource), verbs in NOTEBOOK_PERMISSIONS.items():
        for verb in verbs:
            allowed, why = await kube.access_review(verb, Res(group, "v1", resource), NS)
            assert allowed, (verb, resource, why)
    for verb, resource in (("delete", "pods"), ("create", "podsnapshots"),
                           ("delete", "podsnapshotpolicies"), ("get", "secrets")):
        group = "podsnapshot.gke.io" if resource.startswith("podsnapshot") else ""
        allowed, _ = await kube.access_review(verb, Res(group, "v1", resource), NS)
        assert not allowed, (verb, resource)


async def test_statefulset_role_grants_its_two_names_and_nothing_else(cluster, sim):
    """notebook-statefulset.yaml's Role (resourceNames) as the real RBAC authorizer reads it: the
    calls the pause makes on its own StatefulSet and pod work (statefulset.py: the Scale's
    selector, the pod's labels, replicas 0 and back), the same calls on any other StatefulSet or
    pod are forbidden, and so is a patch of the StatefulSet itself (its pod template)."""
    apps = client.AppsV1Api(cluster["admin"])
    for name in ("analysis", "other"):
        apps.create_namespaced_stateful_set(NS, {
            "metadata": {"name": name},
            "spec": {"replicas": 0, "serviceName": name,
                     "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": notebook_pod("x")["spec"]}}})
    for name in ("analysis-0", "victim"):
        sim.create_pod(notebook_pod(name))
    await asyncio.to_thread(sim.wait, lambda: len(sim.pods()) == 2, 20, "pods")
    kube = Kube(cluster["notebook"])
    for verb, group, resource in STATEFULSET_PERMISSIONS_FLAT:
        res = Res(group, "v1", resource.split("/")[0])
        sub = resource.split("/")[1] if "/" in resource else None
        own = "analysis" if group == "apps" else "analysis-0"
        other = "other" if group == "apps" else "victim"
        assert (await kube.access_review(verb, res, NS, own, subresource=sub))[0], resource
        assert not (await kube.access_review(verb, res, NS, other, subresource=sub))[0], resource
    scale = await kube.get_scale(STATEFULSETS, "analysis", NS)
    assert scale["status"]["selector"] == "app=analysis"
    assert (await kube.scale(STATEFULSETS, "analysis", NS, 1))["spec"]["replicas"] == 1
    await kube.scale(STATEFULSETS, "analysis", NS, 0)
    await kube.patch(PODS, "analysis-0", {"metadata": {"labels": {"app": None}}}, NS)
    for call in (kube.get_scale(STATEFULSETS, "other", NS),
                 kube.scale(STATEFULSETS, "other", NS, 1),
                 kube.patch(STATEFULSETS, "analysis", {"spec": {"replicas": 1}}, NS),
                 kube.patch(PODS, "victim", {"metadata": {"labels": {"app": None}}}, NS),
                 kube.delete(PODS, "analysis-0", NS)):
        with pytest.raises(KubeError) as e:
            await call
        assert e.value.status == 403, e.value


async def test_resumer_role_grants_what_resume_uses_and_nothing_else(cluster, sim):
    kube = Kube(cluster["resumer"])
    for (group, resource), verbs in RESUMER_PERMISSIONS.items():
        for verb in verbs:
            allowed, why = await kube.access_review(verb, Res(group, "v1", resource), NS)
            assert allowed, (verb, resource, why)
    for verb, group, resource in (("get", "", "secrets"), ("delete", "apps", "statefulsets"),
                                  ("patch", "", "pods"), ("deletecollection", "", "pods"),
                                  ("create", "podsnapshot.gke.io", "podsnapshots"),
                                  ("create", "podsnapshot.gke.io", "podsnapshotmanualtriggers")):
        allowed, _ = await kube.access_review(verb, Res(group, "v1", resource), NS)
        assert not allowed, (verb, resource)
    core = client.CoreV1Api(cluster["resumer"])
    assert _status(core.list_namespaced_secret, NS) == 403
    assert _status(core.list_namespaced_pod, "default") == 403  # another namespace


@pytest.mark.parametrize("pvc", [False, True])
async def test_gke_pause_and_resume_with_notebook_identity(cluster, sim, pvc):
    """The example's StatefulSet "analysis" and the notebook's identity with rbac.yaml and
    notebook-statefulset.yaml's named Role: release() scales it through the scale subresource;
    with a PVC the pause takes the pod out of the StatefulSet first (GKE stops it after the
    snapshot), and the resumer deletes that stopped pod before scaling back."""
    spec = notebook_pod("x")["spec"]
    if pvc:
        spec["volumes"] = [{"name": "home", "persistentVolumeClaim": {"claimName": "home"}}]
        spec["containers"][0]["volumeMounts"] = [{"name": "home", "mountPath": "/home/jovyan"}]
    labels = {"app": "analysis", "jupyter-pause.io/workspace": "analysis"}
    sim.apps.create_namespaced_stateful_set(NS, {
        "metadata": {"name": "analysis"},
        "spec": {"replicas": 1, "serviceName": "analysis",
                 "selector": {"matchLabels": {"app": "analysis"}},
                 "template": {"metadata": {"labels": labels}, "spec": spec}}})
    await asyncio.to_thread(sim.wait, lambda: any(
        p["status"].get("phase") == "Running" for p in sim.pods()), 20, "analysis-0 running")
    rec = Recorder()
    b = GKEBackend(api_client=cluster["notebook"], pod_name="analysis-0", namespace=NS,
                   gpu_model="nvidia-l4", trigger_timeout=30, snapshot_timeout=30,
                   restored_condition_wait=0)
    assert (await b.describe())["can_pause"] is True
    ctx = pause_ctx(rec)
    snap = await b.snapshot(ctx)
    assert snap.snapshot and snap.stop_via == "statefulset" and snap.hold_writes is pvc
    rel = await b.release(ctx)
    assert rel.stopped_via == "statefulset"
    # the GPU is free: no pod, or only the stopped one out of the StatefulSet
    await asyncio.to_thread(sim.wait, lambda: all(
        p["status"].get("phase") == "Succeeded" and not p["metadata"].get("ownerReferences")
        for p in sim.pods()), 20, "stopped")
    assert bool(sim.pods()) is pvc and sim.restores == []
    sts = client.AppsV1Api(cluster["admin"]).read_namespaced_stateful_set("analysis", NS)
    assert sts.spec.replicas == 0
    # out of the pod, with the resumer's credentials: bring it back; the policy restores it
    sim.nodes = {}
    updates: list[dict] = []
    task = asyncio.create_task(resume_workspace(Kube(cluster["resumer"]), NS, "analysis",
                                                on_update=updates.append, poll=0.1,
                                                restored_condition_wait=1))
    await asyncio.to_thread(sim.wait, lambda: any(u["state"] == "waiting_for_capacity"
                                                  for u in updates), 20, "unschedulable")
    sim.add_node("gpu-l4-b", "nvidia-l4", 1)
    out = await task
    assert out["state"] == "restored_live", out
    b2 = GKEBackend(api_client=cluster["notebook"], pod_name="analysis-0", namespace=NS,
                    gpu_model="nvidia-l4", restored_condition_wait=0)
    assert (await b2.restored_live(resume_ctx(rec))).live is True
    # clean-up with the notebook identity: keep none, the policy stays (its delete is denied)
    res = await b2.gc(older_than=None, dry_run=False, every_ready=True)
    assert snap.snapshot in res["deleted"] and not res["stuck"]


async def test_doctor_with_notebook_identity(cluster, sim):
    sim.create_pod(notebook_pod("nb"))
    await asyncio.to_thread(sim.wait, lambda: sim.pods(), 20, "pod")
    from traitlets.config import Config

    # the server creates the snapshot policy when it starts, with the notebook's identity
    await GKEBackend(api_client=cluster["notebook"], pod_name="nb", namespace=NS).ensure_policy()

    checks = await run_checks(Kube(cluster["notebook"]), pod_name="nb", namespace=NS,
                              config=Config({"KernelManager": {"transport": "ipc"}}),
                              config_files=[str(EXAMPLES / "jupyter-server-config.yaml")])
    bad = [(c.name, c.detail) for c in checks if c.status != "ok"]
    assert bad == []


async def test_kubeflow_pause_and_two_concurrent_resumes(cluster, sim):
    """Workspace spec.paused with the notebook identity; two resumes at once restore once (the
    lease relies on the real apiserver's resourceVersion precondition on merge patches). The gke
    backend on a Workspace's pod pauses through the Workspace: its identity holds both backends'
    ClusterRoles (rbac.yaml; doctor names both)."""
    client.RbacAuthorizationV1Api(cluster["admin"]).create_namespaced_role_binding(NS, {
        "metadata": {"name": "jupyter-pause-kubeflow-jupyter"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "jupyter-pause-kubeflow"},
        "subjects": [{"kind": "ServiceAccount", "name": "jupyter", "namespace": NS}]})
    sim.custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", NS, "workspaces",
                                               workspace("ws1"))
    await asyncio.to_thread(sim.wait, lambda: any(
        p["status"].get("phase") == "Running" for p in sim.pods()), 20, "ws-ws1-0 running")
    rec = Recorder()
    gke = GKEBackend(api_client=cluster["notebook"], pod_name="ws-ws1-0", namespace=NS,
                     gpu_model="nvidia-l4", trigger_timeout=30, snapshot_timeout=30)
    snap = await gke.snapshot(pause_ctx(rec))
    kf = KubeflowBackend(api_client=cluster["notebook"], pod_name="ws-ws1-0", namespace=NS)
    assert (await kf.describe())["can_pause"] is True
    assert (await kf.release(pause_ctx(rec))).stopped_via == "workspace"
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 20, "stopped")
    resumer = Kube(cluster["resumer"])
    a, b = await asyncio.gather(
        resume_workspace(resumer, NS, "ws1", poll=0.1, holder="alice", restored_condition_wait=1),
        resume_workspace(resumer, NS, "ws1", poll=0.1, holder="bob", restored_condition_wait=1))
    assert a["state"] == b["state"] == "restored_live", (a, b)
    assert snap.snapshot in a["reason"]
    assert sorted([a["joined"], b["joined"]]) == [False, True]
    assert len(sim.restores) == 1


WS_LABEL = "notebooks.kubeflow.org/workspace-name"
STATEFULSET_PERMISSIONS_FLAT = [(verb, group, resource)
                                for (group, resource), verbs in STATEFULSET_PERMISSIONS.items()
                                for verb in verbs]
EXAMPLE_FILES = ("snapshot-storage.yaml", "jupyter-server-config.yaml", "notebook-statefulset.yaml",
                 "workspacekind.yaml", "rbac.yaml", "resumer-rbac.yaml")


def dropped(sent: object, got: object, path: str = "") -> list[str]:
    """Where `got` (read back) lost or changed what `sent` had; fields the server added (defaults,
    metadata) are fine. A field the schema does not know is pruned and shows up here."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [f"{path}: {got!r}"]
        return [d for k, v in sent.items()
                for d in (dropped(v, got[k], f"{path}.{k}") if k in got else [f"{path}.{k}"])]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [f"{path}: {got!r}"]
        return [d for i, (a, b) in enumerate(zip(sent, got, strict=False)) for d in dropped(a, b, f"{path}[{i}]")]
    return [] if sent == got else [f"{path}: sent {sent!r}, read back {got!r}"]


def create_dry_run(api: client.ApiClient, doc: dict) -> dict:
    """`kubectl create --dry-run=server -f`: the apiserver's full admission, validation, defaulting
    and pruning, nothing stored; returns the object as it would be stored."""
    kind, ns = doc["kind"], doc["metadata"].get("namespace")
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    rbac, custom = client.RbacAuthorizationV1Api(api), client.CustomObjectsApi(api)
    kw = {"dry_run": "All", "_preload_content": False}
    typed = {"ConfigMap": (core.create_namespaced_config_map, True),
             "ServiceAccount": (core.create_namespaced_service_account, True),
             "StatefulSet": (apps.create_namespaced_stateful_set, True),
             "Role": (rbac.create_namespaced_role, True),
             "RoleBinding": (rbac.create_namespaced_role_binding, True),
             "ClusterRole": (rbac.create_cluster_role, False),
             "ClusterRoleBinding": (rbac.create_cluster_role_binding, False)}
    if kind in typed:
        fn, namespaced = typed[kind]
        resp = fn(ns, doc, **kw) if namespaced else fn(doc, **kw)
    else:
        group, version = doc["apiVersion"].split("/")
        plural = {"PodSnapshotStorageConfig": "podsnapshotstorageconfigs",
                  "PodSnapshotPolicy": "podsnapshotpolicies",
                  "WorkspaceKind": "workspacekinds"}[kind]
        resp = (custom.create_namespaced_custom_object(group, version, ns, plural, doc, **kw)
                if ns else custom.create_cluster_custom_object(group, version, plural, doc, **kw))
    return json.loads(resp.data)


def test_example_manifests_are_accepted_with_no_field_pruned(cluster):
    """Every shipped example passes the real apiserver's validation against the real CRD schemas
    (crds/kubeflow.org.yaml is kubeflow/notebooks notebooks-v2's), and reads back with every field
    it sent: a field the schema does not have would be silently pruned, i.e. never take effect."""
    seen, problems = [], {}
    for name in EXAMPLE_FILES:
        for doc in yaml.safe_load_all((EXAMPLES / name).read_text()):
            if not doc:
                continue
            doc["metadata"]["name"] += "-check"  # never collide with what the fixture made
            try:
                got = create_dry_run(cluster["admin"], doc)
            except ApiException as e:
                problems[f"{name} {doc['kind']}"] = [f"rejected: {e.status} {e.body}"]
                continue
            if lost := dropped(doc, got):
                problems[f"{name} {doc['kind']}"] = lost
            seen.append(doc["kind"])
    assert not problems, problems
    assert {"ConfigMap", "PodSnapshotPolicy", "PodSnapshotStorageConfig", "StatefulSet",
            "WorkspaceKind", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} <= set(seen)


# -- Kubeflow Notebooks v2: each Workspace runs as its own ServiceAccount --------------------------

def example_kind() -> dict:
    (kind,) = [d for d in yaml.safe_load_all((EXAMPLES / "workspacekind.yaml").read_text()) if d]
    return kind


def play_workspace_controller_rbac(admin: client.ApiClient, ws: str, kind: dict) -> str:
    """What the Kubeflow Workspace controller does for a Workspace's identity (kubeflow/notebooks
    notebooks-v2 workspace_controller.go: generateServiceAccount, generateRoleBindingName,
    generateRoleBinding): ServiceAccount "ws-<name>", and per WorkspaceKind
    podTemplate.serviceAccount.clusterRoles entry a RoleBinding "ws-<name>-<sha256(name/role)[:8]>"
    of that ClusterRole in the Workspace's namespace. Returns the account's user name."""
    sa = f"ws-{ws}"
    labels = {WS_LABEL: ws}
    client.CoreV1Api(admin).create_namespaced_service_account(
        NS, {"metadata": {"name": sa, "labels": labels}})
    for role in kind["spec"]["podTemplate"]["serviceAccount"]["clusterRoles"]:
        digest = hashlib.sha256(f"{ws}/{role['name']}".encode()).hexdigest()[:8]
        client.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(NS, {
            "metadata": {"name": f"ws-{ws}-{digest}", "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": NS}]})
    return f"system:serviceaccount:{NS}:{sa}"


def as_user(cluster: dict, user: str) -> client.ApiClient:
    """The admin's connection, impersonating `user`; for a service-account user name the apiserver
    adds the groups a real token of that account carries (system:serviceaccounts,
    system:serviceaccounts:<ns>, system:authenticated)."""
    api = _client(cluster["dir"] / "admin.kubeconfig")
    api.set_default_header("Impersonate-User", user)
    return api


async def test_workspace_service_account_gets_what_the_backend_uses_via_the_kind(cluster, sim):
    kind = example_kind()
    kube_before = Kube(as_user(cluster, f"system:serviceaccount:{NS}:ws-ws9"))
    # before the controller binds the kind's clusterRoles, the account has nothing namespaced
    allowed, _ = await kube_before.access_review("patch", Res("kubeflow.org", "v1beta1",
                                                                "workspaces"), NS)
    assert not allowed
    user = play_workspace_controller_rbac(cluster["admin"], "ws9", kind)
    kube = Kube(as_user(cluster, user))
    for (group, resource), verbs in KUBEFLOW_PERMISSIONS.items():
        for verb in verbs:
            allowed, why = await kube.access_review(verb, Res(group, "v1", resource), NS)
            assert allowed, (verb, resource, why)
    # the cluster-scoped reads: the one storage config and the one kind, nothing else
    for (group, resource), name in (
            (("podsnapshot.gke.io", "podsnapshotstorageconfigs"), "jupyter-pause-snapshots"),
            (("kubeflow.org", "workspacekinds"), kind["metadata"]["name"])):
        res = Res(group, "v1", resource, False)
        allowed, why = await kube.access_review("get", res, None, name)
        assert allowed, (resource, why)
        allowed, _ = await kube.access_review("get", res, None, "another")
        assert not allowed, resource
    for verb, group, resource, ns in (
            # the kubeflow backend's identity snapshots nothing itself (its own ClusterRole)
            ("create", "podsnapshot.gke.io", "podsnapshotmanualtriggers", NS),
            ("delete", "podsnapshot.gke.io", "podsnapshots", NS),
            ("create", "podsnapshot.gke.io", "podsnapshotpolicies", NS),
            ("patch", "apps", "statefulsets", NS),
            ("delete", "", "pods", NS), ("create", "", "pods", NS), ("get", "", "secrets", NS),
            ("delete", "kubeflow.org", "workspaces", NS),
            ("create", "kubeflow.org", "workspaces", NS),
            ("create", "podsnapshot.gke.io", "podsnapshots", NS),
            ("delete", "podsnapshot.gke.io", "podsnapshotpolicies", NS),
            ("create", "rbac.authorization.k8s.io", "rolebindings", NS),
            ("patch", "kubeflow.org", "workspaces", "default"),  # a RoleBinding: own namespace
            ("get", "", "pods", "default"),
            ("list", "kubeflow.org", "workspacekinds", None),
            ("patch", "kubeflow.org", "workspacekinds", None),
            ("get", "podsnapshot.gke.io", "podsnapshots", None)):  # all namespaces
        allowed, _ = await kube.access_review(verb, Res(group, "v1", resource, ns is not None), ns)
        assert not allowed, (verb, resource, ns)


async def test_kubeflow_pause_as_the_workspace_identity_with_the_examples_kind(cluster, sim):
    """The example WorkspaceKind (opt-in on the kind) on the real apiserver, the pause run with the
    identity Kubeflow gives the Workspace: it reads the kind, pauses and follows the add-on's
    checkpoint to Ready."""
    kind = example_kind()
    sim.custom.create_cluster_custom_object("kubeflow.org", "v1beta1", "workspacekinds", kind)
    user = play_workspace_controller_rbac(cluster["admin"], "ws2", kind)
    sim.custom.create_namespaced_custom_object("kubeflow.org", "v1beta1", NS, "workspaces",
                                               workspace("ws2", kind=kind["metadata"]["name"]))
    await asyncio.to_thread(sim.wait, lambda: any(
        p["metadata"]["name"] == "ws-ws2-0" and p["status"].get("phase") == "Running"
        for p in sim.pods()), 20, "ws-ws2-0 running")
    rec = Recorder()
    kf = KubeflowBackend(api_client=as_user(cluster, user), pod_name="ws-ws2-0", namespace=NS,
                         gpu_model="nvidia-l4", restored_condition_wait=0, checkpoint_timeout=30)
    assert (await kf.describe())["can_pause"] is True
    ctx = pause_ctx(rec)
    assert (await kf.snapshot(ctx)).gke_workspaces is True
    rel = await kf.release(ctx)
    assert rel.checkpoint_state == "Ready" and rel.snapshot, rel
    ws = sim.custom.get_namespaced_custom_object("kubeflow.org", "v1beta1", NS, "workspaces", "ws2")
    assert ws["spec"]["paused"] is True
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 20, "ws-ws2-0 stopped")
