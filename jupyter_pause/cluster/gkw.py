"""The GKE Workspaces snapshot add-on, as the gke and kubeflow backends, doctor and shutdown see it.

Everything here follows gke-labs/workspaces providers/gke/internal/snapshot: the annotation and
readiness-gate names (snapshot.go), the policy name (reconcile.go `policyNameFor`), and whether
the add-on manages a Workspace (cache.go `snapshotEnabled`): an explicit "false" on the Workspace
wins, then a podConfig that requests TPUs (never snapshotted), then the Workspace's opt-in, then the
WorkspaceKind's. One rule for every caller, so the backends cannot disagree about the same pod.
"""

from __future__ import annotations

from .kube import (
    GKW_STATE_ANNOTATION,
    POLICIES,
    WORKSPACE_LABEL,
    WORKSPACEKINDS,
    WORKSPACES,
    Kube,
    KubeError,
)

GKW_ENABLED_ANNOTATION = "podsnapshot.gke.kubeflow.org/enabled"
# The add-on treats GKE Pod Migration's opt-in as a snapshot opt-in too (cache.go).
POD_MIGRATION_ENABLED_ANNOTATION = "pod-migration.gke.io/enabled"
# snapshot.go ReadinessGateConditionType: the pod webhook (webhook.go mutatePod) adds it to every
# pod it manages.
GKW_READINESS_GATE = "podsnapshot.gke.kubeflow.org/active"
# snapshot.go: when the webhook started the checkpoint (cleared with checkpoint-state).
GKW_STARTED_ANNOTATION = "podsnapshot.gke.kubeflow.org/checkpoint-started-at"
TPU_RESOURCE = "google.com/tpu"  # snapshot.go ResourceTPU
# snapshot.go CheckpointState*: the add-on's only states (no Failed or Error).
CHECKPOINTING, READY, RESTORING = "Checkpointing", "Ready", "Restoring"


def gkw_policy_name(workspace: str) -> str:
    """reconcile.go policyNameFor: the policy the add-on keeps for every enabled Workspace."""
    return f"ws-{workspace}-policy"


def has_gate(pod: dict | None) -> bool:
    gates = ((pod or {}).get("spec") or {}).get("readinessGates") or []
    return any(g.get("conditionType") == GKW_READINESS_GATE for g in gates)


def _opted(ann: dict, value: str) -> bool:
    return any(str(ann.get(k, "")).lower() == value
               for k in (GKW_ENABLED_ANNOTATION, POD_MIGRATION_ENABLED_ANNOTATION))


def _requests_tpu(kind: dict, pod_config: str) -> bool:
    """cache.go podConfigRequestsTPU: positive-only, by the resources the podConfig declares."""
    options = ((kind.get("spec") or {}).get("podTemplate") or {}).get("options") or {}
    for v in (options.get("podConfig") or {}).get("values") or []:
        if v.get("id") == pod_config:
            res = (v.get("spec") or {}).get("resources") or {}
            return any(TPU_RESOURCE in (res.get(f) or {}) for f in ("limits", "requests"))
    return False


def gkw_enabled(ws: dict, kind: dict | None) -> bool:
    """cache.go snapshotEnabled for a Workspace and its WorkspaceKind (None: the kind could not be
    read, where the add-on, too, goes by the Workspace's own annotation)."""
    ann = (ws.get("metadata") or {}).get("annotations") or {}
    if str(ann.get(GKW_ENABLED_ANNOTATION, "")).lower() == "false":
        return False
    if not (ws.get("spec") or {}).get("kind"):
        return False  # cache.go: no kind name, not enabled
    if kind is None:
        return _opted(ann, "true")
    pod_config = (((ws.get("spec") or {}).get("podTemplate") or {}).get("options") or {}).get(
        "podConfig") or ""
    if _requests_tpu(kind, pod_config):
        return False
    return _opted(ann, "true") or _opted((kind.get("metadata") or {}).get("annotations") or {},
                                         "true")


async def gkw_manages(kube: Kube, ws: dict, pod: dict | None = None) -> bool:
    """Does the add-on manage this Workspace? snapshotEnabled with its WorkspaceKind when the kind
    is readable (cluster-scoped: rbac.yaml's ClusterRoleBinding, not the kind's clusterRoles);
    otherwise the add-on's own mark on the pod, made with the kind in hand at pod creation."""
    kind_name = (ws.get("spec") or {}).get("kind")
    kind = None
    if kind_name:
        try:
            kind = await kube.get(WORKSPACEKINDS, kind_name)
        except KubeError:
            kind = None
    if kind is not None or not kind_name:
        return gkw_enabled(ws, kind)
    ann = (ws.get("metadata") or {}).get("annotations") or {}
    if str(ann.get(GKW_ENABLED_ANNOTATION, "")).lower() == "false":
        return False
    return gkw_enabled(ws, None) or has_gate(pod)


async def gkw_manages_pod(kube: Kube, pod: dict) -> bool:
    """Does the add-on snapshot this pod? Then a policy and trigger of ours would make two
    policies select one pod: the gke backend joins the add-on's flow instead. The add-on's own rule
    decides (`gkw_manages`); only when the Workspace is unreadable do its marks on the pod (the
    readiness gate) and in the namespace (its ws-<workspace>-policy) stand in for it."""
    ws = (pod["metadata"].get("labels") or {}).get(WORKSPACE_LABEL)
    if not ws:
        return False
    ns = pod["metadata"]["namespace"]
    try:
        obj = await kube.get_or_none(WORKSPACES, ws, ns)
    except KubeError:
        obj = None
    if obj is not None:
        return await gkw_manages(kube, obj, pod)
    if has_gate(pod):
        return True
    try:
        pol = await kube.get_or_none(POLICIES, gkw_policy_name(ws), ns)
    except KubeError:
        return False
    return pol is not None and ((pol.get("spec") or {}).get("selector") or {}).get(
        "matchLabels", {}).get(WORKSPACE_LABEL) == ws


async def checkpoint_state(kube: Kube, pod: dict) -> str | None:
    """The add-on's checkpoint-state annotation on the pod's Workspace (None: not a Workspace pod,
    or no state). Raises KubeError when the Workspace cannot be read."""
    meta = pod.get("metadata") or {}
    ws = (meta.get("labels") or {}).get(WORKSPACE_LABEL)
    if not ws:
        return None
    obj = await kube.get_or_none(WORKSPACES, ws, meta.get("namespace"))
    return ((obj or {}).get("metadata", {}).get("annotations") or {}).get(GKW_STATE_ANNOTATION)
