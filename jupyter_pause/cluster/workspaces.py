"""Kubeflow Workspaces (`kubeflow.org/v1beta1`): pausing the own Workspace through `spec.paused`.

Plain Kubeflow then scales the pod away: the checkpoint is the way back. With GKE Workspaces'
snapshot add-on, the same change becomes a pod snapshot first; its progress is the Workspace
annotation `podsnapshot.gke.kubeflow.org/checkpoint-state` (Checkpointing -> Ready, Restoring on
resume), which the pause reports while it waits. Those three are all the states the add-on has
(gke-labs/workspaces providers/gke/internal/snapshot/snapshot.go): `reconcileCheckpointing`
(reconcile.go) has no branch for a failed trigger or PodSnapshot, so the Workspace would stay
"Checkpointing", unpaused, with its pod out of the Service (the webhook set the pod's readiness
condition `podsnapshot.gke.kubeflow.org/active=False`). The pause therefore reads the add-on's
trigger and PodSnapshot too, and on their failure ends the checkpoint itself: the checkpoint-state
cleared, which hands the Workspace back to the add-on's running path (the failed trigger stays,
see `_end_failed_checkpoint`), and the failure raised with GKE's own reason.

`Workspaces` is the component both cluster backends hold: the kubeflow backend pauses with it,
and the gke backend too for a pod the add-on manages (gkw.gkw_manages_pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .base import BackendError, PauseContext
from .gkw import (
    GKW_ENABLED_ANNOTATION,
    GKW_READINESS_GATE,
    GKW_STARTED_ANNOTATION,
    gkw_manages,
    has_gate,
)
from .kube import (
    GKW_LAST_CHECKPOINT_ANNOTATION,
    GKW_STATE_ANNOTATION,
    PODS,
    SNAPSHOTS,
    TRIGGERS,
    WORKSPACE_LABEL,
    WORKSPACES,
    KubeError,
    condition,
)
from .pod import OwnPod, checked
from .results import ReleaseResult, SnapshotResult
from .snapshots import snapshot_failure, trigger_failure

log = logging.getLogger(__name__)

# Set by a "stop" on a Workspace the add-on manages: the Workspace's own
# podsnapshot.gke.kubeflow.org/enabled before the stop opted it out ("" when it had none), put
# back at the next start.
STOP_OPT_OUT_ANNOTATION = "jupyter-pause.io/snapshot-opt-out"


def intercepted(out: dict) -> bool:
    """The add-on's Workspace webhook answered the pause itself: paused held at false and
    checkpoint-state Checkpointing in the very response."""
    return ((out.get("metadata") or {}).get("annotations") or {}).get(
        GKW_STATE_ANNOTATION) == "Checkpointing" and not (out.get("spec") or {}).get("paused")


# A pod of a Workspace the add-on manages that its pod webhook did not set up: it was created
# while the Workspace was opted out (a stop) or while the webhook was down (failurePolicy:
# Ignore), so it runs without gVisor, which a pod snapshot needs, and without the add-on's
# readiness gate, its mark (webhook.go mutatePod adds both at CREATE).
NOT_SET_UP = ("this pod was started without GKE Workspaces' snapshot setup (no gVisor "
              "sandbox, no readiness gate), so GKE cannot snapshot it")


def _state_of(obj: dict | None) -> str | None:
    """The add-on's checkpoint-state of a Workspace (None without one)."""
    return ((obj or {}).get("metadata", {}).get("annotations") or {}).get(GKW_STATE_ANNOTATION)


def opt_in_patch(obj: dict) -> dict | None:
    """The merge patch that undoes a stop's opt-out of the Workspace, or None."""
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    if STOP_OPT_OUT_ANNOTATION not in ann:
        return None
    return {"metadata": {"annotations": {GKW_ENABLED_ANNOTATION: ann[STOP_OPT_OUT_ANNOTATION]
                                         or None, STOP_OPT_OUT_ANNOTATION: None}}}


class Workspaces:
    """The own pod's Kubeflow Workspace: find it, pause it, follow GKE Workspaces' checkpoint."""

    # Seconds between reads of the add-on's trigger and PodSnapshot while it checkpoints.
    failure_poll = 1.0
    # Seconds a dropped readiness condition waits for the add-on's checkpoint-state.
    state_wait = 10.0

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

    async def stop(self, ws: str, ns: str) -> ReleaseResult:
        """`spec.paused=true` without a pod snapshot. The add-on intercepts every paused
        false->true of a Workspace it manages (webhook.go), so the Workspace is opted out first
        (its own setting noted, put back by the next start), then paused."""
        obj = await checked(self.pod.kube.get(WORKSPACES, ws, ns))
        opted_out = False
        if await self.addon_manages(obj):
            ann = obj["metadata"].get("annotations") or {}
            body: dict[str, Any] = {
                GKW_ENABLED_ANNOTATION: "false",
                STOP_OPT_OUT_ANNOTATION: ann.get(GKW_ENABLED_ANNOTATION, "")}
            if _state_of(obj) == "Checkpointing":
                # a checkpoint the add-on holds (of a pod it cannot snapshot) ends here: an
                # opted-out Workspace is not reconciled, so nothing else would clear it
                body.update({GKW_STATE_ANNOTATION: None, GKW_STARTED_ANNOTATION: None})
            await checked(self.pod.kube.patch(WORKSPACES, ws, {"metadata": {
                "annotations": body}}, ns))
            opted_out = True
        out = await self.set_paused(ws, ns) or {}
        if intercepted(out):
            raise BackendError(
                f"GKE Workspaces took a pod snapshot of {ws} although it was opted out for "
                "this stop", reason="snapshot_not_wanted",
                hint="the pod is frozen and uploaded; the kernels come back live on resume")
        return ReleaseResult(released=True, stopped_via="workspace", owner=ws,
                             snapshot_opt_out=opted_out)

    async def undo_stop_opt_out(self) -> bool:
        """Put back the Workspace's own snapshot setting after a stop (True when it did)."""
        ws, ns, obj = await self.of_pod()
        body = opt_in_patch(obj)
        if body is None:
            return False
        await checked(self.pod.kube.patch(WORKSPACES, ws, body, ns))
        return True

    async def watch_platform_pause(self, start_pause: Callable[[str], Awaitable[Any]], *,
                                   window: float = 3600.0) -> None:
        """Start a pause here when GKE Workspaces begins one that this server did not ask for.

        A pause asked through Kubeflow (the dashboard, `activityRules` culling) only sets
        spec.paused; the add-on's webhook then takes the pod out of its Service at once (the
        readiness condition podsnapshot.gke.kubeflow.org/active=False) and freezes it about 3 s
        later for the snapshot (webhook.go, reconcile.go). Seeing the condition drop, the pause
        path runs as if asked here: the application checkpoint first, then it follows the
        add-on's checkpoint. During a pause of our own, `start_pause` joins it.
        """
        armed = True
        while True:
            try:
                try:
                    pod = await self.pod.get()
                except BackendError as e:  # not in a pod, or it is gone: nothing to watch
                    log.debug("jupyter-pause: no platform pauses to watch: %s", e)
                    return
                ws = (pod["metadata"].get("labels") or {}).get(WORKSPACE_LABEL)
                if not ws:
                    return  # not a Workspace's pod
                # (a pod without the add-on's gate is watched too: the add-on writes the
                # condition on any pod of a Workspace it manages, and such a pause is then
                # ended as one GKE cannot snapshot, see release())
                name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]

                def flipped(p: dict | None, want_false: bool) -> Any:
                    c = condition(p or {}, GKW_READINESS_GATE)
                    if p is None:
                        return "gone"
                    if c is None:
                        return None
                    return (c.get("status") == "False") is want_false

                if not armed:  # after a pause: wait until the pod is back in its Service
                    await self.pod.kube.wait_for(PODS, name, ns,
                                                 lambda p: flipped(p, False), timeout=window)
                    armed = True
                    continue
                got = await self.pod.kube.wait_for(PODS, name, ns, lambda p: flipped(p, True),
                                                   timeout=window)
                if got == "gone":
                    return
                # The webhook writes the pod's condition before it answers, and the API server
                # stores the Workspace (Checkpointing) only after: the state can land a moment
                # after the condition dropped.
                try:
                    state = await self.pod.kube.wait_for(
                        WORKSPACES, ws, ns, lambda w: "gone" if w is None else (
                            _state_of(w) == "Checkpointing" and "Checkpointing"),
                        timeout=self.state_wait)
                except TimeoutError:  # (a Restoring or Ready left from before is not a pause)
                    state = None  # out of the Service for another reason: no add-on pause
                armed = False
                if state == "Checkpointing":
                    await start_pause("gke-workspaces")
            except TimeoutError:
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a watcher must never stop the server
                log.warning("jupyter-pause: watching for GKE Workspaces' pauses: %s", e)
                await asyncio.sleep(30)

    async def snapshot(self, ctx: PauseContext) -> SnapshotResult:
        """Before the pause: who we are (after a restore this process wakes up inside release()),
        and whether the add-on will snapshot the pod when the Workspace is paused."""
        ws, _, obj = await self.of_pod()
        self.pod.remember(await self.pod.get(), ws)
        # The pod snapshot (if any) is GKE Workspaces' job, started by release() setting paused.
        # The add-on stops the pod after it (postCheckpoint: stop, reconcile.go): from then on
        # the pause writes nothing to the pod's volumes (the lifecycle's hold_writes).
        managed = await self.addon_manages(obj)
        unset = managed and not has_gate(await self.pod.get())
        # "kubeflow" whichever backend asked: the pause goes through the Kubeflow Workspace.
        return SnapshotResult(skipped=True, workspace=ws, backend="kubeflow",
                              gke_workspaces=managed and not unset,
                              hold_writes=managed and not unset,
                              reason=NOT_SET_UP if unset else None)

    async def release(self, ctx: PauseContext, *, timeout: float) -> ReleaseResult:
        """Pause the Workspace; with the add-on, follow its pod snapshot for `timeout` s."""
        ws, ns, obj = await self.of_pod()
        if ctx.mode == "stop":
            ctx.progress(f"Stopping workspace {ws} without a pod snapshot")
            return await self.stop(ws, ns)
        ctx.progress(f"Pausing workspace {ws}")
        managed = await self.addon_manages(obj)
        if managed and not has_gate(await self.pod.get()):
            # The add-on would hold the pause and trigger a snapshot GKE cannot take: paused
            # like a stop (opted out for it, opted back in by the resume, whose new pod gets
            # the add-on's setup); the kernels come back from the checkpoint.
            ctx.progress(f"Pausing workspace {ws} without a pod snapshot: {NOT_SET_UP}")
            stopped = await self.stop(ws, ns)
            return dataclasses.replace(stopped, reason=NOT_SET_UP)
        before = await self._triggers_of_pod(ns)  # the add-on's trigger is the one made after
        # When the add-on holds a pause already (Kubeflow began it: watch_platform_pause), it is
        # followed, not asked for again: the webhook holds every paused false->true but the one
        # at Ready, so a second one would re-stamp its checkpoint, and a trigger made already
        # would be deleted and made anew, a second pod snapshot (webhook.go mutateWorkspace,
        # reconcile.go reconcileCheckpointing).
        held = _state_of(obj) == "Checkpointing"
        out = obj if held else (await self.set_paused(ws, ns) or {})
        # The add-on's answer to the pause in the very response is proof, whatever we read.
        if not (managed or intercepted(out)):
            return ReleaseResult(released=True, stopped_via="workspace", owner=ws)
        # GKE Workspaces: the webhook turns paused back to false and checkpoints first. The pod
        # (this process) is frozen while it uploads and stopped after, so a release that returns
        # by itself either saw Ready, or wakes up in the pod restored from that snapshot.
        # A pause that Kubeflow began (watch_platform_pause) comes here after the add-on may
        # have made its trigger: what it made since it started checkpointing is this pause's.
        # (never a stamp the Workspace kept from an earlier pause: `out` is the answer to this
        # pause, or the Workspace as the add-on holds it)
        since = ((out.get("metadata") or {}).get("annotations") or {}).get(
            GKW_STARTED_ANNOTATION)
        return await self.follow_checkpoint(ctx, ws, ns, timeout=timeout, before=before,
                                            since=since)

    async def _triggers_of_pod(self, ns: str) -> dict[str, dict] | None:
        """The PodSnapshotManualTriggers aimed at the own pod, by uid (None: not readable)."""
        try:
            name = (await self.pod.get())["metadata"]["name"]
            items = (await self.pod.kube.list(TRIGGERS, ns)).get("items") or []
        except (BackendError, KubeError):
            return None
        return {t["metadata"]["uid"]: t for t in items
                if (t.get("spec") or {}).get("targetPod") == name}

    async def _addon_failure(self, ns: str, before: dict[str, dict],
                             since: str | None = None) -> tuple[dict, str]:
        """Wait until the trigger the add-on made for this pause, or its PodSnapshot, failed:
        (trigger, GKE's reason). Never returns while they are fine or unreadable.

        The add-on stamps its trigger with the Workspace's checkpoint-started-at (`since`) and
        discards one stamped otherwise (reconcile.go), so a stamped trigger is this pause's
        exactly when the stamps match. An unstamped one is this pause's when it is not in
        `before` (the triggers of the pod before the pause) or was made at or after `since`."""
        while True:
            for uid, t in (await self._triggers_of_pod(ns) or {}).items():
                stamp = (t["metadata"].get("annotations") or {}).get(GKW_STARTED_ANNOTATION)
                if stamp is not None and since is not None:
                    if stamp != since:
                        continue
                else:
                    made = t["metadata"].get("creationTimestamp") or ""
                    if uid in before and not (since and made >= since):
                        continue
                failed = trigger_failure(t)
                if failed:
                    return t, failed
                snap = ((t.get("status") or {}).get("snapshotCreated") or {}).get("name")
                if snap:
                    try:
                        obj = await self.pod.kube.get_or_none(SNAPSHOTS, snap, ns)
                    except KubeError:
                        obj = None
                    failed = snapshot_failure(snap, obj) if obj is not None else None
                    if failed:
                        return t, failed
            await asyncio.sleep(self.failure_poll)

    async def _end_failed_checkpoint(self, ws: str, ns: str) -> str | None:
        """Undo what the add-on left behind, so the Workspace is an ordinary running one
        again: clear its checkpoint state (the add-on's reconcileActive then puts the pod back
        in its Service). The failed trigger stays. Deleting it would wake the add-on at once
        (the trigger is owned by the Workspace), and a reconcile that still reads Checkpointing,
        from its cache, creates a new trigger for a missing one (reconcileCheckpointing): GKE
        would snapshot and stop the pod after all. Left alone it is harmless: the next pause
        stamps a new checkpoint-started-at, and the add-on replaces a trigger stamped otherwise
        (reconcile.go). Returns what could not be undone, if anything."""
        try:
            await self.pod.kube.patch(WORKSPACES, ws, {"metadata": {"annotations": {
                GKW_STATE_ANNOTATION: None, GKW_STARTED_ANNOTATION: None}}}, ns)
        except KubeError as e:
            return f"checkpoint-state was not cleared ({e})"
        return None

    async def follow_checkpoint(self, ctx: PauseContext, ws: str, ns: str, *,
                                timeout: float, before: dict[str, dict] | None = None,
                                since: str | None = None) -> ReleaseResult:
        """Follow the add-on's checkpoint-state to Ready; with `before` (the triggers of this
        pod that existed before the pause), end it early when the add-on's trigger or
        PodSnapshot fails."""
        if before is None:
            return await self._follow_state(ctx, ws, ns, timeout=timeout)
        follow = asyncio.ensure_future(self._follow_state(ctx, ws, ns, timeout=timeout))
        failure = asyncio.ensure_future(self._addon_failure(ns, before, since))
        try:
            await asyncio.wait({follow, failure}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (follow, failure):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        if not failure.done() or failure.cancelled() or failure.exception() is not None:
            return follow.result()
        trigger, why = failure.result()
        left = await self._end_failed_checkpoint(ws, ns)
        ctx.report("gke_workspaces_checkpoint_failed", workspace=ws, reason=why,
                   trigger=trigger["metadata"]["name"], left_behind=left)
        raise BackendError(
            f"GKE Workspaces' pod snapshot of {ws} failed ({why}); "
            + (f"the workspace may stay unreachable: {left}" if left else
               "its checkpoint was ended and the workspace keeps running"),
            reason="snapshot_failed",
            hint="the application checkpoint was written; check the snapshot storage "
            "(IAM, bucket) and the gke-workspaces add-on logs")

    async def _follow_state(self, ctx: PauseContext, ws: str, ns: str, *,
                            timeout: float) -> ReleaseResult:
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
        return ReleaseResult(released=True, stopped_via="workspace", owner=ws, snapshot=detail,
                             checkpoint_state=seen[-1] if seen else None)

    def _woke(self, ws: str) -> ReleaseResult:
        # Never pause again: the restored pod is the resumed workspace.
        self.pod.paused_as["woke_up"] = True
        return ReleaseResult(released=False, woke_up=True, stopped_via="workspace", owner=ws,
                             reason="this pod was restored from the pod snapshot")
