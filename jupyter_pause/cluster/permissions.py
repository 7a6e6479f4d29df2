"""The API verbs each identity needs, per (group, resource): what the shipped Roles grant
(examples/kubernetes/rbac.yaml, resumer-rbac.yaml; a test compares them) and doctor reviews."""

from __future__ import annotations

from .kube import KUBEFLOW_GROUP, SNAPSHOT_GROUP

# One ClusterRole per backend, so that an identity holds only what its backend does.
# The own pod and GKE's Warning event when it cold-starts a pod instead of restoring it
# (read-only; without it the cold-start reason comes from what the pause recorded).
_OWN_POD: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): ("get", "list", "watch"),
    ("", "events"): ("list",),
}
# The gke backend (a StatefulSet's or a bare pod's service account): ClusterRole
# jupyter-pause-notebook, bound by a RoleBinding. It snapshots the own pod itself.
NOTEBOOK_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    **_OWN_POD,
    (SNAPSHOT_GROUP, "podsnapshotpolicies"): ("get", "create"),
    (SNAPSHOT_GROUP, "podsnapshotmanualtriggers"): ("get", "list", "watch", "create", "delete"),
    (SNAPSHOT_GROUP, "podsnapshots"): ("get", "list", "watch", "delete"),
}
# A StatefulSet's notebook, on top of NOTEBOOK_PERMISSIONS and for two names only (a Role with
# resourceNames, rendered per StatefulSet: examples/kubernetes/notebook-statefulset.yaml): its
# StatefulSet's scale subresource (read the selector, scale to 0; statefulset.py) and its own pod
# (a pod with a PVC leaves the StatefulSet before GKE stops it: the selector labels removed).
STATEFULSET_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("apps", "statefulsets/scale"): ("get", "patch"),
    ("", "pods"): ("patch",),
}
# The kubeflow backend (each Workspace's own account, through the WorkspaceKind's
# serviceAccount.clusterRoles): ClusterRole jupyter-pause-kubeflow. It pauses the own Workspace
# and only reads what GKE Workspaces' add-on creates (a failed trigger is left to the add-on,
# workspaces.py).
KUBEFLOW_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    **_OWN_POD,
    (KUBEFLOW_GROUP, "workspaces"): ("get", "list", "watch", "patch"),  # spec.paused
    # read only: a failed trigger of the add-on is left to it (workspaces.py)
    (SNAPSHOT_GROUP, "podsnapshotmanualtriggers"): ("get", "list", "watch"),
    (SNAPSHOT_GROUP, "podsnapshots"): ("get", "list", "watch"),
}
# Cluster-scoped and read-only, each for one known object (resourceNames in rbac.yaml): doctor
# checks that the storage config is Ready; the Workspace's WorkspaceKind carries GKE Workspaces'
# opt-in annotation (the kubeflow backend falls back to the pod's own evidence when denied).
NOTEBOOK_CLUSTER_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    (SNAPSHOT_GROUP, "podsnapshotstorageconfigs"): ("get",),
}
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


def union(*grants: dict[tuple[str, str], tuple[str, ...]]) -> dict[tuple[str, str], tuple[str, ...]]:
    """What several Roles bound to one identity grant together (verbs of a resource merged)."""
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for g in grants:
        for key, verbs in g.items():
            out[key] = tuple(dict.fromkeys((*out.get(key, ()), *verbs)))
    return out
