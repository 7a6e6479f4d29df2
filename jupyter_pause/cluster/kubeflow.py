"""Kubeflow Workspaces backend (`kubeflow.org/v1beta1`, Workspace `spec.paused`).

Pause, after the server wrote the application checkpoint, sets `spec.paused=true` on the own
Workspace (found from the pod label `notebooks.kubeflow.org/workspace-name`). Plain Kubeflow then
scales the pod away: the checkpoint is the way back. With GKE Workspaces' snapshot add-on, the same
change becomes a pod snapshot first; its progress is the Workspace annotation
`podsnapshot.gke.kubeflow.org/checkpoint-state` (Checkpointing -> Ready, Restoring on resume),
which release() reports while it waits. Those three are all the states the add-on has
(gke-labs/workspaces providers/gke/internal/snapshot/snapshot.go): it has no branch for a failed
snapshot (the Workspace stays "Checkpointing"), so release() gives up after `checkpoint_timeout`.

Whether the add-on manages a Workspace follows its own rule (snapshotEnabled in
providers/gke/internal/snapshot/cache.go): an explicit "false" on the Workspace wins, then a
podConfig that requests TPUs (never snapshotted), then the Workspace's opt-in, then the
WorkspaceKind's.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from traitlets import Float

from .base import BackendError, PauseContext, ResumeContext
from .gke import GKEBackend, _unreachable, restore_reason
from .gkw import (  # noqa: F401 (GKW_READINESS_GATE, gkw_enabled: kept importable from here)
    GKW_ENABLED_ANNOTATION,
    GKW_READINESS_GATE,
    gkw_enabled,
    gkw_manages,
)
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


class KubeflowBackend(GKEBackend):
    """Pause = checkpoint + Workspace spec.paused; GKE Workspaces adds the pod snapshot."""

    name = "kubeflow"

    checkpoint_timeout = Float(1800.0, help="Seconds to follow GKE Workspaces' checkpoint-state "
                               "before reporting the pod snapshot as failed.").tag(config=True)

    async def describe(self) -> dict[str, Any]:
        if self._described and time.monotonic() - self._described[0] < 60:
            return self._described[1]
        why = None
        try:
            kinds = {r.get("kind") for r in await self.kube.api_resources(KUBEFLOW_GROUP,
                                                                          KUBEFLOW_VERSION)}
            if "Workspace" not in kinds:
                why = "Kubeflow Workspaces (kubeflow.org/v1beta1 Workspace) are not installed"
        except KubeError as e:
            why = ("Kubeflow Workspaces are not installed (kubeflow.org/v1beta1 is not served)"
                   if e.status in (403, 404) else _unreachable(e))
        except Exception as e:  # noqa: BLE001 (no kubeconfig, not in a cluster)
            why = f"no Kubernetes access: {e}".splitlines()[0]
        if why is None:
            try:
                pod = await self.own_pod()
                if not (pod["metadata"].get("labels") or {}).get(WORKSPACE_LABEL):
                    why = f"this pod is not a Kubeflow Workspace pod (no {WORKSPACE_LABEL} label)"
            except BackendError as e:
                why = str(e)
        out = {"name": self.name, "configured": why is None, "can_pause": why is None,
               "why_not": why}
        self._described = (time.monotonic(), out)
        return out

    async def _workspace(self) -> tuple[str, str, dict]:
        pod = await self.own_pod()
        ws = (pod["metadata"].get("labels") or {}).get(WORKSPACE_LABEL)
        if not ws:
            raise BackendError(f"this pod has no {WORKSPACE_LABEL} label", reason="not_workspace")
        ns = pod["metadata"]["namespace"]
        return ws, ns, await self._k(self.kube.get(WORKSPACES, ws, ns))

    async def _gkw(self, obj: dict) -> bool:
        """Does GKE Workspaces' snapshot add-on manage this Workspace (gkw.gkw_manages)?"""
        try:
            pod = await self.own_pod()
        except BackendError:
            pod = None
        return await gkw_manages(self.kube, obj, pod)

    async def snapshot(self, ctx: PauseContext) -> dict[str, Any]:
        ws, ns, obj = await self._workspace()
        pod = await self.own_pod()
        # Who we are now: after a restore this process wakes up inside release() (see there).
        self._pause = {"pod": pod["metadata"]["name"], "uid": pod["metadata"]["uid"],
                       "hostname": socket.gethostname(), "namespace": ns, "workspace": ws}
        # The pod snapshot (if any) is GKE Workspaces' job, started by release() setting paused.
        # The add-on stops the pod after it (postCheckpoint: stop, reconcile.go): from then on
        # the pause writes nothing to the pod's volumes (the lifecycle's hold_writes).
        managed = await self._gkw(obj)
        return {"skipped": True, "workspace": ws, "backend": self.name,
                "gke_workspaces": managed, "hold_writes": managed}

    async def release(self, ctx: PauseContext) -> dict[str, Any]:
        ws, ns, obj = await self._workspace()
        ctx.progress(f"Pausing workspace {ws}")
        managed = await self._gkw(obj)
        out = await self._k(self.kube.patch(WORKSPACES, ws, {"spec": {"paused": True}}, ns))
        # The add-on's Workspace webhook answers the pause itself: paused held at false and
        # checkpoint-state Checkpointing in the very response. That is proof, whatever we read.
        out = out or {}
        intercepted = ((out.get("metadata") or {}).get("annotations") or {}).get(
            GKW_STATE_ANNOTATION) == "Checkpointing" and not (out.get("spec") or {}).get("paused")
        if not (managed or intercepted):
            return {"released": True, "stopped_via": "workspace", "owner": ws}
        # GKE Workspaces: the webhook turns paused back to false and checkpoints first. The pod
        # (this process) is frozen while it uploads and stopped after, so a release that returns
        # by itself either saw Ready, or wakes up in the pod restored from that snapshot.
        return await self._follow_checkpoint(ctx, ws, ns)

    async def _follow_checkpoint(self, ctx: PauseContext, ws: str, ns: str) -> dict[str, Any]:
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
            kind, detail = await self.kube.wait_for(WORKSPACES, ws, ns, done, on_change=on_change,
                                                    timeout=self.checkpoint_timeout)
        except TimeoutError:
            if await self._restored_here():
                return self._woke(ws)
            raise BackendError(
                f"GKE Workspaces did not finish the pod snapshot of {ws} within "
                f"{self.checkpoint_timeout:.0f} s (checkpoint-state "
                f"{seen[-1] if seen else 'unset'})", reason="snapshot_timeout",
                hint="the application checkpoint is the way back; check the snapshot add-on "
                "logs") from None
        except KubeError as e:
            raise BackendError(str(e), reason="kubernetes") from None
        if kind == "resumed" or await self._restored_here():
            return self._woke(ws)
        return {"released": True, "stopped_via": "workspace", "owner": ws, "snapshot": detail,
                "checkpoint_state": seen[-1] if seen else None}

    def _woke(self, ws: str) -> dict[str, Any]:
        # Never pause again: the restored pod is the resumed workspace.
        self._pause["woke_up"] = True
        return {"released": False, "woke_up": True, "stopped_via": "workspace", "owner": ws,
                "reason": "this pod was restored from the pod snapshot"}

    async def restore_verdict(self) -> dict[str, Any]:
        try:
            _, _, obj = await self._workspace()
            pod = await self._await_restored_condition(await self.own_pod())
        except (BackendError, KubeError) as e:
            return {"live": None, "reason": str(e), "snapshot": None}
        ann = obj["metadata"].get("annotations") or {}
        if condition(pod, "PodRestored") is None and not await self._gkw(obj):
            return {"live": False, "snapshot": None,
                    "reason": "workspace restarted without a pod snapshot (plain Kubeflow)"}
        trigger = await self._snapshot_trigger(pod, pod["metadata"]["namespace"], None)
        # the add-on pins the snapshot it restores with ps-name (webhook.go mutatePod); the
        # Workspace's last-checkpoint-name is cleared once the restored pod is Ready
        expected = (pod["metadata"].get("annotations") or {}).get(PS_NAME_ANNOTATION)
        live, why = restore_reason(pod, trigger, await self._gpu(pod),
                                   await self._pod_events(pod), expected)
        return {"live": live, "reason": why,
                "snapshot": ann.get(GKW_LAST_CHECKPOINT_ANNOTATION),
                "checkpoint_state": ann.get(GKW_STATE_ANNOTATION)}

    async def restored_live(self, ctx: ResumeContext | None = None) -> bool | None:
        return await super().restored_live(ctx)
