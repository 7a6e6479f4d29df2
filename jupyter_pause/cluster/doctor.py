"""`jupyter pause doctor`: what a working pause needs, checked from inside the notebook pod.

Each check gives ok / missing / warn with what it saw and how to fix it: the gVisor runtime class,
the time the server gets after SIGTERM (grace.py), the kernels' IPC transport, the server's
poll() selector, the RBAC verbs (SelfSubjectAccessReview for every verb the product uses), the
feature's CRDs, the snapshot storage config, and whether a PodSnapshotPolicy selects this pod.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from jupyter_server.serverapp import ServerApp

from .gkw import gkw_manages_pod, gkw_policy_name, has_gate
from .grace import DEFAULT_BUDGET_S, grace_finding
from .kube import (
    KUBEFLOW_GROUP,
    KUBEFLOW_VERSION,
    PODS,
    POLICIES,
    SNAPSHOT_GROUP,
    SNAPSHOT_KINDS,
    SNAPSHOT_VERSION,
    STATEFULSETS,
    STORAGE_CONFIGS,
    WORKSPACE_LABEL,
    WORKSPACES,
    Kube,
    KubeError,
    Res,
    condition,
)
from .permissions import (
    KUBEFLOW_CLUSTER_PERMISSIONS,
    KUBEFLOW_PERMISSIONS,
    NOTEBOOK_CLUSTER_PERMISSIONS,
    NOTEBOOK_PERMISSIONS,
    STATEFULSET_PERMISSIONS,
)
from .pod import has_pvc, pod_owner, workspace_key
from .snapshots import default_policy_name

OK, MISSING, WARN = "ok", "missing", "warn"


@dataclasses.dataclass
class Check:
    """One doctor finding: ok / missing / warn, what was seen, and how to fix it."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def load_server_config() -> tuple[Any, list[str]]:
    """The Jupyter server's configuration as the server would load it, and its files."""
    app = ServerApp()
    app.load_config_file()
    files = [str(f) for f in app.loaded_config_files]
    return app.config, files


def check_transport(config: Any) -> Check:
    transport = None
    for section in ("KernelManager", "AsyncIOLoopKernelManager", "IOLoopKernelManager",
                    "ConnectionFileMixin"):
        if section in config and "transport" in config[section]:
            transport = config[section]["transport"]
    if transport == "ipc":
        return Check("kernel transport", OK, "KernelManager.transport = 'ipc'")
    return Check("kernel transport", MISSING, f"KernelManager.transport = {transport or 'tcp'!r}",
                 "set c.KernelManager.transport = 'ipc' (loopback TCP sockets do not survive a "
                 "pod snapshot reliably; see examples/kubernetes/jupyter-server-config.yaml)")


def check_selector(files: list[str]) -> Check:
    for f in files:
        try:
            if "PollSelector" in Path(f).read_text():
                return Check("server selector", OK, f"PollSelector event loop set in {f}")
        except OSError:
            continue
    return Check("server selector", MISSING, "the server uses the default epoll event loop",
                 "install the PollSelector event loop policy in jupyter_server_config.py (see "
                 "examples/kubernetes/jupyter-server-config.yaml)")


async def check_release(kube: Kube, pod: dict, gkw_managed: bool,
                        stop_via: str = "auto") -> Check | None:
    """Does a pause free this StatefulSet pod's accelerator? A pod with a PVC is stopped by GKE
    itself (postCheckpoint: stop, GKE's rule for PVCs), which leaves it Succeeded, and a
    StatefulSet deletes a Succeeded pod and creates it again (kubernetes
    pkg/controller/statefulset/stateful_set_control.go processReplica), which GKE restores at
    once. So the pause takes the pod out of its StatefulSet and scales that to 0
    (statefulset.py), with the named Role of notebook-statefulset.yaml; any other stop_via than
    auto/statefulset leaves the pod to be re-created."""
    owner = pod_owner(pod)
    if gkw_managed or not owner or owner[0] != "StatefulSet":
        return None
    meta = pod["metadata"]
    pvc = has_pvc(pod)
    if stop_via == "policy":
        return Check("accelerator release", WARN,
                     f"StatefulSet {owner[1]} re-creates this pod after GKE stops it "
                     "(c.GKEBackend.stop_via = 'policy': postCheckpoint: stop, the pod left in "
                     "the StatefulSet), and GKE restores it at once: a pause is taken but the "
                     "accelerator stays in use",
                     "leave c.GKEBackend.stop_via at 'auto': the pause then scales StatefulSet "
                     f"{owner[1]} to 0, a pod with a PVC taken out of it first (the PVC stays)")
    if stop_via not in ("auto", "statefulset"):
        return None
    wanted: list[tuple[str, Res, str | None, str]] = [
        (verb, STATEFULSETS, "scale", owner[1])
        for verb in STATEFULSET_PERMISSIONS[("apps", "statefulsets/scale")]]
    if pvc:
        wanted += [(verb, PODS, None, meta["name"])
                   for verb in STATEFULSET_PERMISSIONS[("", "pods")]]
    denied = []
    try:
        for verb, res, sub, name in wanted:
            allowed, _ = await kube.access_review(verb, res, meta["namespace"], name,
                                                  subresource=sub)
            if not allowed:
                denied.append(f"{verb} {res.plural}{'/' + sub if sub else ''} {name}")
    except KubeError as e:
        return Check("accelerator release", WARN, f"cannot review access: {e}")
    how = (f"takes the pod out of StatefulSet {owner[1]} and scales it to 0 (its PVC stays)"
           if pvc else f"scales StatefulSet {owner[1]} to 0")
    if denied:
        return Check("accelerator release", MISSING,
                     f"a pause {how}, but this identity is denied: {', '.join(denied)}",
                     "apply the Role and RoleBinding of examples/kubernetes/"
                     "notebook-statefulset.yaml (renamed for this StatefulSet)")
    return Check("accelerator release", OK, f"a pause {how}")


def check_shutdown_grace(pod: dict, config: Any, env: dict | None = None,
                         s6: bool | None = None) -> Check:
    """Does the server get the shutdown checkpoint's budget after SIGTERM (grace.py)?"""
    budget = DEFAULT_BUDGET_S
    section = config.get("PauseApp") if hasattr(config, "get") else None
    if section is not None and "shutdown_checkpoint_budget" in section:
        budget = float(section["shutdown_checkpoint_budget"])
    enough, detail, fix = grace_finding(pod, budget, env, s6=s6)
    return Check("shutdown grace", OK if enough else WARN, detail, fix)


async def workspace_kind_name(kube: Kube, pod: dict | None) -> str | None:
    """spec.kind of the pod's Workspace (None when it cannot be read)."""
    meta = (pod or {}).get("metadata") or {}
    ws = (meta.get("labels") or {}).get(WORKSPACE_LABEL)
    try:
        obj = await kube.get_or_none(WORKSPACES, ws, meta.get("namespace")) if ws else None
    except KubeError:
        return None
    return ((obj or {}).get("spec") or {}).get("kind") or None


def rbac_fix(pod: dict | None, *, cluster_scoped: bool, backend: str = "gke") -> str:
    """How to grant a missing verb to this pod's identity. Kubeflow Notebooks v2 runs a Workspace
    as its own ServiceAccount ws-<workspace> (workspace_controller.go) and binds only the
    ClusterRoles its WorkspaceKind names in podTemplate.serviceAccount.clusterRoles, with a
    RoleBinding in the Workspace's namespace: cluster-scoped reads need rbac.yaml's
    ClusterRoleBinding, which covers the namespace's service accounts."""
    meta = (pod or {}).get("metadata") or {}
    ws = (meta.get("labels") or {}).get(WORKSPACE_LABEL)
    if not ws:
        sa = ((pod or {}).get("spec") or {}).get("serviceAccountName") or "the pod's"
        return (f"apply examples/kubernetes/rbac.yaml for service account {sa}"
                if pod else "apply examples/kubernetes/rbac.yaml for the pod's service account")
    sa = ((pod or {}).get("spec") or {}).get("serviceAccountName") or f"ws-{ws}"
    if cluster_scoped:
        return ("apply the ClusterRoleBinding jupyter-pause-cluster-reader-<namespace> of "
                "examples/kubernetes/rbac.yaml (group system:serviceaccounts:"
                f"{meta.get('namespace') or '<namespace>'}); a WorkspaceKind's clusterRoles "
                "are bound per namespace and cannot grant cluster-scoped reads")
    role = ("{name: jupyter-pause-kubeflow}" if backend == "kubeflow" else
            "{name: jupyter-pause-notebook}, {name: jupyter-pause-kubeflow}")
    return (f"add `clusterRoles: [{role}]` to the WorkspaceKind's "
            "spec.podTemplate.serviceAccount (examples/kubernetes/workspacekind.yaml; Kubeflow "
            f"binds it to the Workspace's account {sa}) and apply the ClusterRoles and the "
            "ClusterRoleBinding in examples/kubernetes/rbac.yaml")


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector against labels (matchLabels and matchExpressions)."""
    sel = selector or {}
    if not sel.get("matchLabels") and not sel.get("matchExpressions"):
        return False  # GKE requires a selector; an empty one is taken as selecting nothing
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    for e in sel.get("matchExpressions") or []:
        key, op, vals = e.get("key"), e.get("operator"), set(e.get("values") or [])
        ok = {"In": labels.get(key) in vals, "NotIn": labels.get(key) not in vals,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


async def check_policy(kube: Kube, pod: dict, policy_name: str | None = None) -> Check:
    """Does a PodSnapshotPolicy select this pod (the one the server sets up, or the add-on's)?"""
    meta = pod["metadata"]
    labels, ns = meta.get("labels") or {}, meta["namespace"]
    ws = labels.get(WORKSPACE_LABEL)
    gated = has_gate(pod)
    key = workspace_key(pod)
    names = [n for n in (policy_name, gkw_policy_name(ws) if ws else None,
                         default_policy_name(key[1]) if key else None) if n]
    if not names:
        return Check("snapshot policy", MISSING, "the pod has no stable label a policy can "
                     "select", "label the pod template with jupyter-pause.io/workspace=<name>")
    for name in dict.fromkeys(names):
        try:
            pol = await kube.get_or_none(POLICIES, name, ns)
        except KubeError as e:
            return Check("snapshot policy", WARN, f"cannot read {name}: {e}")
        if pol is None:
            continue
        spec = pol.get("spec") or {}
        if not selects(spec.get("selector"), labels):
            return Check("snapshot policy", MISSING, f"{name} does not select this pod",
                         "fix its spec.selector or delete it (the server re-creates it)")
        post = (spec.get("triggerConfig") or {}).get("postCheckpoint", "resume")
        if has_pvc(pod) and post != "stop":
            return Check("snapshot policy", MISSING,
                         f"{name} selects this pod with postCheckpoint: {post}, and the pod "
                         "mounts a PVC", "set postCheckpoint: stop (GKE's rule for pods "
                         "with a PVC)")
        who = " (GKE Workspaces)" if name == gkw_policy_name(ws or "") else ""
        return Check("snapshot policy", OK, f"{name}{who} selects this pod "
                     f"({(spec.get('triggerConfig') or {}).get('type')}, postCheckpoint: {post})")
    if gated:
        return Check("snapshot policy", WARN, "GKE Workspaces manages this pod but its policy "
                     f"{gkw_policy_name(ws or '')} is not there yet", "check the add-on")
    return Check("snapshot policy", WARN, f"no PodSnapshotPolicy selects this pod yet "
                 f"({names[-1]} is missing)", "start the notebook server once (it creates the "
                 "policy) or apply examples/kubernetes/snapshot-storage.yaml")


async def run_checks(kube: Kube | None, *, pod_name: str | None, namespace: str | None,
                     backend: str = "gke", storage_config: str = "jupyter-pause-snapshots",
                     config: Any = None, config_files: list[str] | None = None,
                     policy_name: str | None = None) -> list[Check]:
    """The checks for this pod and backend; `kube` None means no cluster access at all."""
    checks: list[Check] = []
    if config is None:
        try:
            config, config_files = load_server_config()
        except Exception as e:  # noqa: BLE001 (a broken config file must not break the doctor)
            checks.append(Check("server config", WARN, f"could not load: {e}".splitlines()[0]))
            config, config_files = {}, []
    checks.append(check_transport(config))
    checks.append(check_selector(config_files or []))
    if kube is None:
        checks.append(Check("kubernetes", MISSING, "no Kubernetes access (not in a pod, no "
                            "kubeconfig)", "run the doctor inside the notebook pod"))
        return checks

    pod: dict | None = None
    if not pod_name or not namespace:
        checks.append(Check("own pod", MISSING, "POD_NAME/POD_NAMESPACE unknown",
                            "set POD_NAME and POD_NAMESPACE with the downward API"))
    else:
        try:
            pod = await kube.get(PODS, pod_name, namespace)
            checks.append(Check("own pod", OK, f"{namespace}/{pod_name}"))
        except KubeError as e:
            checks.append(Check("own pod", MISSING, str(e),
                                "grant get on pods (examples/kubernetes/rbac.yaml)"))
    if pod is not None:
        rc = (pod.get("spec") or {}).get("runtimeClassName")
        checks.append(Check("runtime class", OK, "gvisor") if rc == "gvisor" else Check(
            "runtime class", MISSING, f"runtimeClassName is {rc or 'unset'}",
            "run the pod with runtimeClassName: gvisor (GKE Sandbox); pod snapshots need it"))
        checks.append(check_shutdown_grace(pod, config))

    # RBAC: every verb the product uses, reviewed by the API server itself.
    is_ws = bool((((pod or {}).get("metadata") or {}).get("labels") or {}).get(WORKSPACE_LABEL))
    if backend == "kubeflow":
        wanted = dict(KUBEFLOW_PERMISSIONS)
    else:
        wanted = dict(NOTEBOOK_PERMISSIONS)
        if is_ws:  # the gke backend pauses a Workspace's pod through its Workspace
            ws_res = (KUBEFLOW_GROUP, "workspaces")
            wanted[ws_res] = KUBEFLOW_PERMISSIONS[ws_res]
    # (group, resource, verbs, namespace, name): the cluster-scoped reads are of one object each
    perms: list[tuple[str, str, tuple[str, ...], str | None, str | None]] = [
        (g, r, v, namespace, None) for (g, r), v in wanted.items()]
    if backend == "gke":
        perms += [(g, r, v, None, storage_config)
                  for (g, r), v in NOTEBOOK_CLUSTER_PERMISSIONS.items()]
    if is_ws:
        # the WorkspaceKind read behind GKE Workspaces' opt-in (gkw.gkw_manages)
        kind_name = await workspace_kind_name(kube, pod)
        perms += [(g, r, v, None, kind_name)
                  for (g, r), v in KUBEFLOW_CLUSTER_PERMISSIONS.items()]
    for group, resource, verbs, ns, name in perms:
        res = Res(group, "v1", resource, namespaced=ns is not None)
        denied = []
        try:
            for verb in verbs:
                allowed, _ = await kube.access_review(verb, res, ns, name)
                if not allowed:
                    denied.append(verb)
        except KubeError as e:
            checks.append(Check(f"rbac {res.resource}", WARN, f"cannot review access: {e}"))
            continue
        if denied:
            checks.append(Check(f"rbac {res.resource}", MISSING, f"denied: {', '.join(denied)}"
                                + (f" on {name}" if name else ""),
                                rbac_fix(pod, cluster_scoped=ns is None, backend=backend)))
        else:
            checks.append(Check(f"rbac {res.resource}", OK, ", ".join(verbs)))

    # The feature's CRDs.
    feature: tuple[tuple[str, str, set[str]], ...] = (
        (SNAPSHOT_GROUP, SNAPSHOT_VERSION, set(SNAPSHOT_KINDS)),)
    if backend == "kubeflow":
        feature += ((KUBEFLOW_GROUP, KUBEFLOW_VERSION, {WORKSPACES.kind}),)
    for group, version, kinds in feature:
        try:
            served = {r.get("kind") for r in await kube.api_resources(group, version)}
            missing = kinds - served
            checks.append(Check(f"crds {group}", MISSING if missing else OK,
                                f"not served: {', '.join(sorted(missing))}" if missing else
                                ", ".join(sorted(kinds)),
                                "enable the feature on the cluster" if missing else ""))
        except KubeError as e:
            fix = ("enable GKE Pod Snapshots on the cluster (GKE Sandbox node pool)"
                   if group == SNAPSHOT_GROUP else "install Kubeflow Workspaces (notebooks v2)")
            checks.append(Check(f"crds {group}", MISSING, f"{group}/{version} not served "
                                f"({e.status or 'error'})", fix))

    if backend == "gke":
        try:
            sc = await kube.get(STORAGE_CONFIGS, storage_config)
            ready = condition(sc, "Ready")
            if ready and ready.get("status") == "True":
                checks.append(Check("storage config", OK, f"{storage_config} Ready"))
            else:
                why = (ready or {}).get("message") or (ready or {}).get("reason") or "no Ready"
                checks.append(Check("storage config", MISSING, f"{storage_config} not Ready: "
                                    f"{why}", "check the bucket and its IAM for the pod's KSA"))
        except KubeError as e:
            fix = ("create it (examples/kubernetes/snapshot-storage.yaml) or set "
                   "c.GKEBackend.storage_config" if e.status == 404 else
                   "bind the jupyter-pause-storage-reader ClusterRole (rbac.yaml)")
            checks.append(Check("storage config", MISSING, str(e), fix))
        if pod is not None:
            checks.append(await check_policy(kube, pod, policy_name))
            gke = config.get("GKEBackend") if hasattr(config, "get") else None
            stop_via = str((gke or {}).get("stop_via", "auto"))
            release = await check_release(kube, pod, await gkw_manages_pod(kube, pod), stop_via)
            if release is not None:
                checks.append(release)
    return checks


def format_table(checks: list[Check]) -> str:
    width = max([len(c.name) for c in checks] + [5])
    lines = [f"{'CHECK'.ljust(width)}  STATUS   DETAIL"]
    for c in checks:
        lines.append(f"{c.name.ljust(width)}  {c.status.ljust(7)}  {c.detail}")
        if c.fix and c.status != OK:
            lines.append(f"{''.ljust(width)}  {''.ljust(7)}  fix: {c.fix}")
    return "\n".join(lines)
