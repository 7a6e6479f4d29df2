"""Kubeflow Workspaces (`kubeflow.org/v1beta1`): pausing the own Workspace through `spec.paused`.

Plain Kubeflow then scales the pod away: the checkpoint is the way back. With GKE Workspaces'
snapshot add-on, the same change becomes a pod snapshot first; its progress is the Workspace
annotation `podsnapshot.gke.kubeflow.org/checkpoint-state` (Checkpointing -> Ready, Restoring on
resume), which the pause reports while it waits. Those three are all the states the add-on has
(gke-labs/workspaces providers/gke/internal/snapshot/snapshot.go): it has no branch for a failed
snapshot (the Workspace stays "Checkpointing"), so the wait gives up after its timeout.

`Workspaces` is the component both cluster backends hold: the kubeflow backend pauses with it,
and the gke backend too for a pod the add-on manages (gkw.gkw_manages_pod).
"""

from __future__ import annotations

from typing import Any

from .base import BackendError, PauseContext
from .gkw import gkw_manages
from .kube import (
    GKW_LAST_CHECKPOINT_ANNOTATION,
    GKW_STATE_ANNOTATION,
    WORKSPACE_LABEL,
    WORKSPACES,
    KubeError,
)
from .pod import OwnPod, checked


class Workspaces:
    """The own pod's Kubeflow Workspace: find it, pause it, follow GKE Workspaces' checkpoint."""

    def __init__(self, pod: OwnPod) -> None:
        self.pod = pod

    async def of_pod(self) -> tuple[str, str, dict]:
        """(workspace name, namespace, Workspace object) of the own pod."""
        pod = await self.pod.get()
        ws = (pod["metadata"].get("labels") or {}).get(WORKSPACE_LABEL)
        if not ws:
            raise BackendError(f"this pod has no {WORKSPACE_LABEL} label", reason="not_workspace")
        ns = pod["metadata"]["namespace"]
        return ws, ns, await checked(self.pod.kube.get(WORKSPACES, ws, ns))

    async def addon_manages(self, obj: dict) -> bool:
        """Does GKE Workspaces' snapshot add-on manage this Workspace (gkw.gkw_manages)?"""
        try:
            pod = await self.pod.get()
        except BackendError:
            pod = None
        return await gkw_manages(self.pod.kube, obj, pod)

    async def set_paused(self, ws: str, ns: str) -> dict:
        """`spec.paused=true`; returns the Workspace as the API server answered."""
        return await checked(self.pod.kube.patch(WORKSPACES, ws, {"spec": {"paused": True}}, ns))

    async def snapshot(self, ctx: PauseContext) -> dict[str, Any]:
        """Before the pause: who we are (after a restore this process wakes up inside release()),
        and whether the add-on will snapshot the pod when the Workspace is paused."""
        ws, _, obj = await self.of_pod()
        self.pod.remember(await self.pod.get(), ws)
        # The pod snapshot (if any) is GKE Workspaces' job, started by release() setting paused.
        # The add-on stops the pod after it (postCheckpoint: stop, reconcile.go): from then on
        # the pause writes nothing to the pod's volumes (the lifecycle's hold_writes).
        managed = await self.addon_manages(obj)
        # "kubeflow" whichever backend asked: the pause goes through the Kubeflow Workspace.
        return {"skipped": True, "workspace": ws, "backend": "kubeflow",
                "gke_workspaces": managed, "hold_writes": managed}

    async def release(self, ctx: PauseContext, *, timeout: float) -> dict[str, Any]:
        """Pause the Workspace; with the add-on, follow its pod snapshot for `timeout` s."""
        ws, ns, obj = await self.of_pod()
        ctx.progress(f"Pausing workspace {ws}")
        managed = await self.addon_manages(obj)
        out = await self.set_paused(ws, ns) or {}
        # The add-on's Workspace webhook answers the pause itself: paused held at false and
        # checkpoint-state Checkpointing in the very response. That is proof, whatever we read.
        intercepted = ((out.get("metadata") or {}).get("annotations") or {}).get(
            GKW_STATE_ANNOTATION) == "Checkpointing" and not (out.get("spec") or {}).get("paused")
        if not (managed or intercepted):
            return {"released": True, "stopped_via": "workspace", "owner": ws}
        # GKE Workspaces: the webhook turns paused back to false and checkpoints first. The pod
        # (this process) is frozen while it uploads and stopped after, so a release that returns
        # by itself either saw Ready, or wakes up in the pod restored from that snapshot.
        return await self.follow_checkpoint(ctx, ws, ns, timeout=timeout)

    async def follow_checkpoint(self, ctx: PauseContext, ws: str, ns: str, *,
                                timeout: float) -> dict[str, Any]:
        seen: list[str] = []

        def done(w: dict | None) -> Any:
            if w is None:
                return ("gone", None)
            ann = w["metadata"].get("annotations") or {}
            state = ann.get(GKW_STATE_ANNOTATION)
            if state == "Ready" and (w.get("spec") or {}).get("paused"):
                return ("ready", ann.get(GKW_LAST_CHECKPOINT_ANNOTATION))
            if state == "Restoring" or (seen and state is None):
                return ("resumed", None)  # the workspace was resumed since: we are restored
            return None

        def on_change(w: dict | None) -> None:
            state = ((w or {}).get("metadata", {}).get("annotations") or {}).get(
                GKW_STATE_ANNOTATION)
            if state and (not seen or seen[-1] != state):
                seen.append(state)
                ctx.progress(f"GKE Workspaces: checkpoint-state {state}")

        try:
            kind, detail = await self.pod.kube.wait_for(WORKSPACES, ws, ns, done,
                                                        on_change=on_change, timeout=timeout)
        except TimeoutError:
            if await self.pod.restored_here():
                return self._woke(ws)
            raise BackendError(
                f"GKE Workspaces did not finish the pod snapshot of {ws} within "
                f"{timeout:.0f} s (checkpoint-state "
                f"{seen[-1] if seen else 'unset'})", reason="snapshot_timeout",
                hint="the application checkpoint is the way back; check the snapshot add-on "
                "logs") from None
        except KubeError as e:
            raise BackendError(str(e), reason="kubernetes") from None
        if kind == "resumed" or await self.pod.restored_here():
            return self._woke(ws)
        return {"released": True, "stopped_via": "workspace", "owner": ws, "snapshot": detail,
                "checkpoint_state": seen[-1] if seen else None}

    def _woke(self, ws: str) -> dict[str, Any]:
        # Never pause again: the restored pod is the resumed workspace.
        self.pod.paused_as["woke_up"] = True
        return {"released": False, "woke_up": True, "stopped_via": "workspace", "owner": ws,
                "reason": "this pod was restored from the pod snapshot"}
