"""The shipped manifests say what the code does: RBAC verbs, CRD shapes, server settings."""

from __future__ import annotations

from pathlib import Path

import yaml

from jupyter_pause.cluster.permissions import (
    KUBEFLOW_CLUSTER_PERMISSIONS,
    KUBEFLOW_PERMISSIONS,
    NOTEBOOK_CLUSTER_PERMISSIONS,
    NOTEBOOK_PERMISSIONS,
    RESUMER_PERMISSIONS,
    STATEFULSET_PERMISSIONS,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def rules(doc: dict) -> dict[tuple[str, str], tuple[str, ...]]:
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for r in doc["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                out[(g, res)] = tuple(sorted(set(out.get((g, res), ())) | set(r["verbs"])))
    return out


def norm(perms: dict) -> dict:
    return {k: tuple(sorted(v)) for k, v in perms.items()}


def test_notebook_role_grants_exactly_what_the_code_uses():
    by_kind = {d["kind"]: d for d in docs("rbac.yaml")}
    roles = {d["metadata"]["name"]: d for d in docs("rbac.yaml") if d["kind"] == "ClusterRole"}
    assert rules(roles["jupyter-pause-notebook"]) == norm(NOTEBOOK_PERMISSIONS)
    assert rules(roles["jupyter-pause-kubeflow"]) == norm(KUBEFLOW_PERMISSIONS)
    assert rules(roles["jupyter-pause-cluster-reader"]) == norm(
        {**NOTEBOOK_CLUSTER_PERMISSIONS, **KUBEFLOW_CLUSTER_PERMISSIONS})
    # each cluster-scoped read names the one object it needs: the storage config of
    # snapshot-storage.yaml, the WorkspaceKind of workspacekind.yaml
    named = {r["resources"][0]: r.get("resourceNames")
             for r in roles["jupyter-pause-cluster-reader"]["rules"]}
    (storage,) = [d for d in docs("snapshot-storage.yaml")
                  if d["kind"] == "PodSnapshotStorageConfig"]
    assert named == {"podsnapshotstorageconfigs": [storage["metadata"]["name"]],
                     "workspacekinds": [docs("workspacekind.yaml")[0]["metadata"]["name"]]}
    rb = by_kind["RoleBinding"]
    assert rb["roleRef"]["name"] == "jupyter-pause-notebook"
    sub = rb["subjects"][0]
    assert sub["kind"] == "ServiceAccount" and sub["name"] == by_kind["ServiceAccount"][
        "metadata"]["name"]
    # Kubeflow binds the kind's clusterRoles to each Workspace's own account (ws-<name>)
    (wsk,) = docs("workspacekind.yaml")
    assert [r["name"] for r in wsk["spec"]["podTemplate"]["serviceAccount"]["clusterRoles"]] == [
        "jupyter-pause-kubeflow"]
    crb = by_kind["ClusterRoleBinding"]
    assert crb["roleRef"]["name"] == "jupyter-pause-cluster-reader"
    assert {"kind": "Group", "name": "system:serviceaccounts:user-ns",
            "apiGroup": "rbac.authorization.k8s.io"} in crb["subjects"]
    granted = {v for vs in NOTEBOOK_PERMISSIONS.values() for v in vs}
    assert "*" not in granted and "escalate" not in granted and "bind" not in granted
    assert "delete" not in NOTEBOOK_PERMISSIONS[("", "pods")]
    assert "create" not in NOTEBOOK_PERMISSIONS[("podsnapshot.gke.io", "podsnapshots")]
    # a Workspace's identity cannot snapshot a pod, drop a snapshot, or make a policy; the gke
    # one touches no Workspace
    kf = KUBEFLOW_PERMISSIONS
    assert "create" not in kf[("podsnapshot.gke.io", "podsnapshotmanualtriggers")]
    assert "delete" not in kf[("podsnapshot.gke.io", "podsnapshots")]
    assert ("podsnapshot.gke.io", "podsnapshotpolicies") not in kf
    assert ("kubeflow.org", "workspaces") not in NOTEBOOK_PERMISSIONS


def test_statefulset_role_names_the_statefulset_and_its_pod_only():
    """The pause scales its own StatefulSet and takes its pod out of it (statefulset.py): the
    example's Role grants that for those two names and nothing namespace-wide; the ClusterRole
    no longer patches every StatefulSet of the namespace."""
    by_kind = {d["kind"]: d for d in docs("notebook-statefulset.yaml")}
    sts, role, rb = by_kind["StatefulSet"], by_kind["Role"], by_kind["RoleBinding"]
    assert rules(role) == norm(STATEFULSET_PERMISSIONS)
    name = sts["metadata"]["name"]
    assert {r["resources"][0]: r["resourceNames"] for r in role["rules"]} == {
        "statefulsets/scale": [name], "pods": [f"{name}-0"]}
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                             "name": role["metadata"]["name"]}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "namespace": sts["metadata"]["namespace"],
                               "name": sts["spec"]["template"]["spec"]["serviceAccountName"]}]
    assert not any(g == "apps" for g, _ in NOTEBOOK_PERMISSIONS)


def test_resumer_role_matches_the_code():
    (role,) = docs("resumer-rbac.yaml")
    assert rules(role) == norm(RESUMER_PERMISSIONS)


def test_crds_have_the_reference_shapes():
    crds = {d["spec"]["names"]["kind"]: d for d in docs("crds/podsnapshot.gke.io.yaml")}
    assert set(crds) == {"PodSnapshot", "PodSnapshotPolicy", "PodSnapshotManualTrigger",
                         "PodSnapshotStorageConfig"}
    assert crds["PodSnapshotStorageConfig"]["spec"]["scope"] == "Cluster"
    for kind, crd in crds.items():
        v = crd["spec"]["versions"][0]
        assert crd["spec"]["group"] == "podsnapshot.gke.io" and v["name"] == "v1"
        assert v["subresources"] == {"status": {}}, kind
    trig = crds["PodSnapshotManualTrigger"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert trig["properties"]["spec"]["required"] == ["targetPod"]
    assert "snapshotCreated" in trig["properties"]["status"]["properties"]
    pol = crds["PodSnapshotPolicy"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    tc = pol["properties"]["spec"]["properties"]["triggerConfig"]["properties"]
    assert "manual" in tc["type"]["enum"] and tc["postCheckpoint"]["enum"] == ["resume", "stop"]
    kf = {d["spec"]["names"]["kind"]: d for d in docs("crds/kubeflow.org.yaml")}
    assert kf["WorkspaceKind"]["spec"]["scope"] == "Cluster"
    ws = kf["Workspace"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert ws["properties"]["spec"]["properties"]["paused"]["type"] == "boolean"
    # upstream's schema, not a stub: required fields as in kubeflow/notebooks notebooks-v2
    wsk = kf["WorkspaceKind"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spawner = wsk["properties"]["spec"]["properties"]["spawner"]
    assert {"icon", "logo", "displayName", "description"} <= set(spawner["required"])
    assert "required" in ws["properties"]["spec"] and "podTemplate" in ws["properties"]["spec"][
        "required"]
    assert "x-kubernetes-preserve-unknown-fields" not in wsk["properties"]["spec"]


def kind_schema(*path: str) -> dict:
    crds = {d["spec"]["names"]["kind"]: d for d in docs("crds/kubeflow.org.yaml")}
    node = crds["WorkspaceKind"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for p in path:
        node = node["properties"][p]
    return node


def test_culling_settings_work_with_the_extension():
    """Kubeflow's culler (activityRules) pauses only on a fresh, successful activityProbe; the
    jupyter probe must name a port of the kind (kubeflow/notebooks notebooks-v2
    workspacekind_types.go ActivityProbeJupyter, helper/probe.go RunJupyterProbe)."""
    (wsk,) = docs("workspacekind.yaml")
    spec, tmpl = wsk["spec"], wsk["spec"]["podTemplate"]
    assert any(r["effect"].get("pauseWorkspace") for r in spec["activityRules"])
    probe = tmpl["activityProbe"]
    assert probe["jupyter"]["lastActivity"] is True
    assert probe["jupyter"]["portId"] in {p["id"] for p in tmpl["ports"]}
    assert probe["minProbeIntervalSeconds"] <= probe["probeIntervalSeconds"]
    for rule in spec["activityRules"]:
        # never cull a Workspace faster than the probe can see it (a pause is decided at probe time)
        assert rule["config"]["secondsSinceActive"] >= probe["probeIntervalSeconds"]
    # the pod's grace period cannot be set through a WorkspaceKind (no such field), so the
    # shutdown checkpoint has Kubernetes' default 30 s: its budget must leave the kernels time
    assert "terminationGracePeriodSeconds" not in kind_schema("spec", "podTemplate")["properties"]
    from jupyter_pause.server.app import PauseApp

    assert PauseApp.shutdown_checkpoint_budget.default_value < 30


def test_server_config_is_snapshot_ready():
    (cm,) = docs("jupyter-server-config.yaml")
    code = cm["data"]["jupyter_server_config.py"]
    assert 'c.KernelManager.transport = "ipc"' in code and "PollSelector" in code
    compile(code, "jupyter_server_config.py", "exec")
    (wsk,) = docs("workspacekind.yaml")
    assert wsk["kind"] == "WorkspaceKind"
    assert wsk["metadata"]["annotations"]["podsnapshot.gke.kubeflow.org/enabled"] == "true"
    (sts,) = [d for d in docs("notebook-statefulset.yaml") if d["kind"] == "StatefulSet"]
    spec = sts["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    env = {e["name"] for e in spec["containers"][0]["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env
    assert "jupyter-pause.io/workspace" in sts["spec"]["template"]["metadata"]["labels"]
