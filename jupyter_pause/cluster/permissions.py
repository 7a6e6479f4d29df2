"""The API verbs each identity needs, per (group, resource): what the shipped Roles grant
(examples/kubernetes/rbac.yaml, resumer-rbac.yaml; a test compares them) and doctor reviews."""

from __future__ import annotations

from .kube import KUBEFLOW_GROUP, SNAPSHOT_GROUP

# Every verb the notebook's service account uses: ClusterRole jupyter-pause-notebook (bound by a
# RoleBinding or a WorkspaceKind's serviceAccount.clusterRoles).
NOTEBOOK_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): ("get", "list", "watch"),  # the own pod: identity, PodRestored
    # GKE's Warning event when it cold-starts a pod instead of restoring it (read-only; without
    # it the cold-start reason comes from what the pause recorded)
    ("", "events"): ("list",),
    ("apps", "statefulsets"): ("patch",),  # release(): scale the own StatefulSet to 0
    (KUBEFLOW_GROUP, "workspaces"): ("get", "list", "watch", "patch"),  # spec.paused
    (SNAPSHOT_GROUP, "podsnapshotpolicies"): ("get", "create"),
    (SNAPSHOT_GROUP, "podsnapshotmanualtriggers"): ("get", "list", "watch", "create", "delete"),
    (SNAPSHOT_GROUP, "podsnapshots"): ("get", "list", "watch", "delete"),
}
# Cluster-scoped and read-only: doctor checks that the policy's storage config is Ready.
NOTEBOOK_CLUSTER_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    (SNAPSHOT_GROUP, "podsnapshotstorageconfigs"): ("get",),
}
# Cluster-scoped and read-only: the kubeflow backend reads the Workspace's WorkspaceKind for GKE
# Workspaces' opt-in annotation (it falls back to the pod's own evidence when this is denied).
KUBEFLOW_CLUSTER_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    (KUBEFLOW_GROUP, "workspacekinds"): ("get",),
}
# What `jupyter pause resume --namespace NS WORKSPACE` needs (a person or a portal, not the pod).
RESUMER_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): ("get", "list", "create", "delete"),
    ("apps", "statefulsets"): ("get", "patch"),
    (KUBEFLOW_GROUP, "workspaces"): ("get", "patch"),
    (SNAPSHOT_GROUP, "podsnapshotmanualtriggers"): ("list",),
    # delete: a snapshot whose restore crashes is dropped before the pod is started cold
    (SNAPSHOT_GROUP, "podsnapshots"): ("get", "delete"),
}
