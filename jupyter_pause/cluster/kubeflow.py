"""Kubeflow Workspaces backend (`kubeflow.org/v1beta1`, Workspace `spec.paused`).

Pause, after the server wrote the application checkpoint, sets `spec.paused=true` on the own
Workspace (found from the pod label `notebooks.kubeflow.org/workspace-name`); with GKE Workspaces'
snapshot add-on it then follows the add-on's pod snapshot (workspaces.Workspaces). Whether the
add-on manages a Workspace follows its own rule (gkw.gkw_manages): an explicit "false" on the
Workspace wins, then a podConfig that requests TPUs (never snapshotted), then the Workspace's
opt-in, then the WorkspaceKind's.
"""

from __future__ import annotations

from typing import Any, ClassVar

from traitlets import Bool, Float, validate

from .. import configcheck as cc
from .base import BackendError, PauseContext
from .kube import (
    GKW_LAST_CHECKPOINT_ANNOTATION,
    GKW_STATE_ANNOTATION,
    KUBEFLOW_GROUP,
    KUBEFLOW_VERSION,
    PS_NAME_ANNOTATION,
    WORKSPACE_LABEL,
    WORKSPACES,
    KubeError,
    condition,
)
from .podbackend import PodBackend
from .results import ReleaseResult, RestoreVerdict, SnapshotResult


class KubeflowBackend(PodBackend):
    """Pause = checkpoint + Workspace spec.paused; GKE Workspaces adds the pod snapshot."""

    name = "kubeflow"

    # GKE Workspaces deletes the snapshots it restored itself (reconcile.go, on the way out of
    # Restoring), and this backend's identity may not delete snapshots (rbac.yaml).
    single_use_snapshots = Bool(False, help="Delete the workspace's pod snapshots once a "
                                "resume is verified (GKE Workspaces does that itself).").tag(
                                    config=True)
    checkpoint_timeout = Float(1800.0, help="Seconds to follow GKE Workspaces' checkpoint-state "
                               "before reporting the pod snapshot as failed.").tag(config=True)
    config_checks: ClassVar[dict[str, cc.Check]] = {**PodBackend.config_checks, "checkpoint_timeout": cc.seconds(positive=True)}

    @validate("checkpoint_timeout")
    def _validate_kubeflow_config(self, proposal: Any) -> Any:
        return self._checked(proposal)

    async def why_not(self) -> str | None:
        why = await self.feature_missing(
            KUBEFLOW_GROUP, KUBEFLOW_VERSION, {WORKSPACES.kind},
            not_installed="Kubeflow Workspaces are not installed (kubeflow.org/v1beta1 is not "
            "served)", incomplete="Kubeflow Workspaces (kubeflow.org/v1beta1 Workspace) are not "
            "installed")
        if why:
            return why
        try:
            pod = await self.pod.get()
        except BackendError as e:
            return str(e)
        if not (pod["metadata"].get("labels") or {}).get(WORKSPACE_LABEL):
            return f"this pod is not a Kubeflow Workspace pod (no {WORKSPACE_LABEL} label)"
        return None

    async def snapshot(self, ctx: PauseContext) -> SnapshotResult:
        return await self.workspaces.snapshot(ctx)

    async def release(self, ctx: PauseContext) -> ReleaseResult:
        return await self.workspaces.release(ctx, timeout=self.checkpoint_timeout)

    async def restore_verdict(self) -> RestoreVerdict:
        try:
            _, _, obj = await self.workspaces.of_pod()
            pod = await self.pod.await_restored_condition(await self.pod.get())
        except (BackendError, KubeError) as e:
            return RestoreVerdict(live=None, reason=str(e))
        ann = obj["metadata"].get("annotations") or {}
        if condition(pod, "PodRestored") is None and not await self.workspaces.addon_manages(obj):
            return RestoreVerdict(
                live=False, reason="workspace restarted without a pod snapshot (plain Kubeflow)")
        trigger = await self.snapshots.trigger_of(pod, pod["metadata"]["namespace"], None)
        # the add-on pins the snapshot it restores with ps-name (webhook.go mutatePod); the
        # Workspace's last-checkpoint-name is cleared once the restored pod is Ready
        expected = (pod["metadata"].get("annotations") or {}).get(PS_NAME_ANNOTATION)
        live, why = await self.judge(pod, trigger, expected)
        return RestoreVerdict(live=live, reason=why,
                              snapshot=ann.get(GKW_LAST_CHECKPOINT_ANNOTATION),
                              checkpoint_state=ann.get(GKW_STATE_ANNOTATION))
