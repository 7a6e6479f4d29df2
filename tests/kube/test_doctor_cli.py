"""`jupyter pause doctor` and `jupyter pause resume --namespace` (tier 1, the real CLI parser)."""

from __future__ import annotations

import asyncio
import json

from traitlets.config import Config

from jupyter_pause import cli
from jupyter_pause.cluster.doctor import run_checks
from jupyter_pause.cluster.kube import Kube

from .conftest import NS, kubeconfig, notebook_pod, pause_ctx
from .test_gke_backend import backend, start_pod
from .test_resume import make_workspace, pause_workspace


def storage_config(sim, ready: bool = True) -> None:
    sim.custom.create_cluster_custom_object("podsnapshot.gke.io", "v1",
                                            "podsnapshotstorageconfigs", {
        "apiVersion": "podsnapshot.gke.io/v1", "kind": "PodSnapshotStorageConfig",
        "metadata": {"name": "jupyter-pause-snapshots"},
        "spec": {"snapshotStorageConfig": {"gcs": {"bucket": "b"}}}})
    sim.custom.patch_cluster_custom_object_status(
        "podsnapshot.gke.io", "v1", "podsnapshotstorageconfigs", "jupyter-pause-snapshots",
        {"status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                    "reason": "Ready" if ready else "BucketNotFound",
                                    "message": "" if ready else "bucket b not found"}]}})


async def test_doctor_all_ok(tmp_path, apiserver, admin, sim):
    start_pod(sim, notebook_pod("nb"))
    storage_config(sim)
    cfg_file = tmp_path / "jupyter_server_config.py"
    cfg_file.write_text("import selectors  # selectors.PollSelector()\n")
    config = Config({"KernelManager": {"transport": "ipc"}})
    checks = await run_checks(Kube(admin), pod_name="nb", namespace=NS, config=config,
                              config_files=[str(cfg_file)])
    # The one gap: no policy selects the pod until the server's first start sets it up.
    assert [(c.name, c.status) for c in checks if c.status != "ok"] == [("snapshot policy",
                                                                        "warn")]
    await backend(Kube(admin).api_client, "nb").describe()  # the server starts
    checks = await run_checks(Kube(admin), pod_name="nb", namespace=NS, config=config,
                              config_files=[str(cfg_file)])
    assert [c.name for c in checks if c.status != "ok"] == []
    (pol,) = [c for c in checks if c.name == "snapshot policy"]
    assert pol.detail == "jp-nb selects this pod (manual, postCheckpoint: stop)"
    names = {c.name for c in checks}
    assert {"runtime class", "kernel transport", "server selector", "storage config",
            "crds podsnapshot.gke.io", "rbac podsnapshotmanualtriggers.podsnapshot.gke.io",
            "rbac pods"} <= names


def test_doctor_cli_reports_missing(tmp_path, apiserver, sim, capsys, monkeypatch):
    body = notebook_pod("nb")
    del body["spec"]["runtimeClassName"]
    start_pod(sim, body)
    storage_config(sim, ready=False)
    apiserver.call(apiserver.server.deny, "delete", "podsnapshots")
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(tmp_path / "cfg"))
    rc = cli.main(["doctor", "--kubeconfig", kubeconfig(tmp_path, apiserver.url),
                   "--namespace", NS, "--pod", "nb"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "runtime class" in out and "runtimeClassName is unset" in out
    assert "denied: delete" in out and "fix: apply examples/kubernetes/rbac.yaml" in out
    assert "bucket b not found" in out
    assert "KernelManager.transport = 'tcp'" in out and "PollSelector" in out


def test_cli_resume_namespace_shows_capacity_wait(tmp_path, apiserver, notebook_client, sim,
                                                   recorder, capsys):
    pod = make_workspace(sim)
    asyncio.run(pause_workspace(notebook_client, sim, recorder, pod))
    sim.nodes = {}

    import threading
    threading.Timer(1.5, sim.add_node, ("gpu-l4-b", "nvidia-l4", 1)).start()
    rc = cli.main(["resume", "--namespace", NS, "ws1", "--poll", "0.05", "--kubeconfig",
                   kubeconfig(tmp_path, apiserver.url)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "waiting for capacity: 0/0 nodes are available" in out
    assert out.strip().splitlines()[-1].startswith("restored live: Pod restored from snapshot")


def test_cli_resume_without_namespace_is_the_local_command(capsys):
    rc = cli.main(["resume", "--url", "http://127.0.0.1:9"])
    assert rc == cli.EXIT_NO_SERVER  # went to the local server path, not Kubernetes
    assert backend  # imported helpers stay used


def test_cli_snapshots_cleans_in_order_and_respects_retention(tmp_path, apiserver, notebook_client,
                                                              sim, recorder, capsys):
    start_pod(sim, notebook_pod("nb"))
    out = asyncio.run(backend(notebook_client, "nb").snapshot(pause_ctx(recorder)))
    kc = kubeconfig(tmp_path, apiserver.url)
    # younger than an hour: kept
    assert cli.main(["snapshots", "--namespace", NS, "nb", "--keep", "0", "--older-than",
                     "3600", "--kubeconfig", kc]) == 0
    assert "deleted: nothing" in capsys.readouterr().out
    assert cli.main(["snapshots", "--namespace", NS, "nb", "--keep", "0", "--teardown",
                     "--kubeconfig", kc]) == 0
    text = capsys.readouterr().out
    deleted = text.splitlines()[0].removeprefix("deleted: ").split(", ")
    assert deleted == [out.snapshot, out.trigger, "jp-nb"]  # snapshots, trigger, policy
    assert "left: nothing" in text
    reqs = [r for r in apiserver.call(lambda: list(apiserver.server.requests))
            if r[0] == "delete"]
    assert [r[1] for r in reqs] == ["podsnapshots", "podsnapshotmanualtriggers",
                                    "podsnapshotpolicies"]


def test_cli_resume_forbidden_is_one_line(tmp_path, apiserver, sim, capsys):
    make_workspace(sim)
    apiserver.call(apiserver.server.deny, "patch", "workspaces")
    rc = cli.main(["resume", "-n", NS, "ws1", "--kubeconfig", kubeconfig(tmp_path, apiserver.url)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1
    assert "forbidden" in err and "Traceback" not in err


async def test_doctor_policy_that_does_not_select_or_resumes_with_a_pvc(apiserver, admin, sim):
    body = notebook_pod("nb")
    body["spec"]["volumes"] = [{"name": "home", "persistentVolumeClaim": {"claimName": "home"}}]
    start_pod(sim, body)
    policy = {"apiVersion": "podsnapshot.gke.io/v1", "kind": "PodSnapshotPolicy",
              "metadata": {"name": "jp-nb"},
              "spec": {"selector": {"matchLabels": {"jupyter-pause.io/workspace": "other"}},
                       "storageConfigName": "jupyter-pause-snapshots",
                       "triggerConfig": {"type": "manual", "postCheckpoint": "resume"}}}
    sim.custom.create_namespaced_custom_object("podsnapshot.gke.io", "v1", NS,
                                               "podsnapshotpolicies", policy)
    checks = await run_checks(Kube(admin), pod_name="nb", namespace=NS, config=Config())
    (c,) = [c for c in checks if c.name == "snapshot policy"]
    assert (c.status, c.detail) == ("missing", "jp-nb does not select this pod")
    sim.custom.patch_namespaced_custom_object(
        "podsnapshot.gke.io", "v1", NS, "podsnapshotpolicies", "jp-nb",
        {"spec": {"selector": {"matchLabels": {"jupyter-pause.io/workspace": "nb"}}}})
    checks = await run_checks(Kube(admin), pod_name="nb", namespace=NS, config=Config())
    (c,) = [c for c in checks if c.name == "snapshot policy"]
    assert c.status == "missing" and "postCheckpoint: resume" in c.detail and "PVC" in c.detail


async def test_doctor_workspace_pod_reviews_the_kind_read_and_points_to_the_workspacekind(
        apiserver, admin, sim):
    """A Kubeflow Workspace pod runs as ws-<workspace> and gets only the ClusterRoles its
    WorkspaceKind names in podTemplate.serviceAccount.clusterRoles, each bound by a namespaced
    RoleBinding (kubeflow/notebooks notebooks-v2 workspacekind_types.go `ClusterRoles`,
    workspace_controller.go generateServiceAccountName / reconcileRoleBindings). The cluster-scoped
    WorkspaceKind read behind GKE Workspaces' opt-in (gke-labs/workspaces cache.go) can only come
    from rbac.yaml's ClusterRoleBinding, so doctor reviews it and says where each grant lives."""
    pod = make_workspace(sim)
    apiserver.call(apiserver.server.deny, "get", "workspacekinds")
    apiserver.call(apiserver.server.deny, "watch", "podsnapshotmanualtriggers")
    for backend_name, roles in (("kubeflow", ["jupyter-pause-kubeflow"]),
                                ("gke", ["jupyter-pause-notebook", "jupyter-pause-kubeflow"])):
        checks = {c.name: c for c in await run_checks(
            Kube(admin), pod_name=pod, namespace=NS, backend=backend_name, config=Config())}
        kinds = checks["rbac workspacekinds.kubeflow.org"]
        # the one kind this Workspace is made from (rbac.yaml names it in resourceNames)
        assert (kinds.status, kinds.detail) == ("missing", "denied: get on jupyterlab")
        assert "ClusterRoleBinding" in kinds.fix and "system:serviceaccounts:user-ns" in kinds.fix
        trig = checks["rbac podsnapshotmanualtriggers.podsnapshot.gke.io"]
        assert trig.status == "missing" and "denied: watch" in trig.detail
        assert "podTemplate.serviceAccount" in trig.fix
        assert [r for r in ("jupyter-pause-notebook", "jupyter-pause-kubeflow")
                if r in trig.fix] == roles, trig.fix
        assert "ws-ws1" in trig.fix and "for the pod's service account" not in trig.fix
        # each backend's role, not one for both: the kubeflow identity snapshots nothing itself
        snaps = checks["rbac podsnapshots.podsnapshot.gke.io"]
        assert ("delete" in snaps.detail) is (backend_name == "gke"), snaps


async def test_doctor_checks_how_a_statefulset_pod_with_a_pvc_frees_its_accelerator(
        apiserver, admin, sim):
    """notebook-statefulset.yaml mounts its home from a volumeClaimTemplate, so a pause uses
    postCheckpoint: stop (GKE's rule for PVCs) and GKE leaves the pod Succeeded; the StatefulSet
    controller deletes a Succeeded pod and creates it again (kubernetes stateful_set_control.go
    processReplica: `isFailed(replicas[i]) || isSucceeded(replicas[i])`), and GKE restores the
    new pod at once. The pause takes the pod out of its StatefulSet first (statefulset.py):
    doctor reviews the named Role that needs, and warns when stop_via = "policy" leaves the pod
    in; a bare pod with a PVC stays stopped by itself."""
    from jupyter_pause.cluster.kube import api_client_for
    from jupyter_pause.cluster.permissions import (
        NOTEBOOK_CLUSTER_PERMISSIONS,
        NOTEBOOK_PERMISSIONS,
        STATEFULSET_PERMISSIONS,
        union,
    )

    from .test_gke_pvc import pvc_statefulset, with_pvc

    await asyncio.to_thread(pvc_statefulset, sim)
    sim.create_pod(with_pvc(notebook_pod("bare")))  # Pending: one GPU node; doctor reads it

    async def release(api, config: Config):
        checks = {c.name: c for c in await run_checks(Kube(api), pod_name="nb-0", namespace=NS,
                                                      config=config)}
        return checks["accelerator release"]

    c = await release(admin, Config())
    assert c.status == "ok" and "out of StatefulSet nb and scales it to 0" in c.detail, c
    c = await release(admin, Config({"GKEBackend": {"stop_via": "policy"}}))
    assert c.status == "warn" and "StatefulSet nb re-creates this pod" in c.detail, c
    srv = apiserver.server
    apiserver.call(setattr, srv, "user", "system:admin")
    sa = f"system:serviceaccount:{NS}:jupyter"
    apiserver.call(srv.grant, sa, "old", union(NOTEBOOK_PERMISSIONS, NOTEBOOK_CLUSTER_PERMISSIONS))
    c = await release(api_client_for(apiserver.url, token="old"), Config())
    assert c.status == "missing" and "notebook-statefulset.yaml" in c.fix, c
    assert "patch statefulsets/scale nb" in c.detail and "patch pods nb-0" in c.detail, c
    apiserver.call(srv.grant, sa, "new", union(NOTEBOOK_PERMISSIONS, NOTEBOOK_CLUSTER_PERMISSIONS,
                                               STATEFULSET_PERMISSIONS))
    assert (await release(api_client_for(apiserver.url, token="new"), Config())).status == "ok"
    checks = await run_checks(Kube(admin), pod_name="bare", namespace=NS, config=Config())
    assert "accelerator release" not in {c.name for c in checks}


def test_doctor_names_the_store_and_its_credentials(tmp_path, capsys, monkeypatch):
    """The store line says which credential source the object store will be opened with, from
    each ecosystem's own chain (here botocore's: environment variables first)."""
    monkeypatch.setenv("JUPYTER_PAUSE_STORE_URL", "s3://team-bucket/checkpoints")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    cli.main(["doctor", "--json", "--kubeconfig", str(tmp_path / "missing")])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    store = checks["checkpoint store"]
    assert store["status"] == "ok", store
    assert "s3://team-bucket/checkpoints" in store["detail"]
    assert "environment variables AWS_ACCESS_KEY_ID" in store["detail"], store

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    cli.main(["doctor", "--json", "--kubeconfig", str(tmp_path / "missing")])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["checkpoint store"]["status"] == "warn", checks["checkpoint store"]
    assert "no credentials found" in checks["checkpoint store"]["detail"]
