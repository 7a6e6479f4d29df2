"""GKE Pod Snapshots backend (`podsnapshot.gke.io/v1`).

The workspace's manual PodSnapshotPolicy is set up when the server starts (describe()), so that a
policy selects the pod before anything is paused. Pause, after the server wrote the application
checkpoint: create a PodSnapshotManualTrigger for the own pod, watch it to Triggered=True/Complete
(or False/Failed|Error), wait for the PodSnapshot to be Ready, and only then stop the pod through its
owner (Kubeflow Workspace `spec.paused`, StatefulSet replicas 0, or the policy's
`postCheckpoint: stop`). A pod with a PersistentVolumeClaim always uses `stop` (GKE's rule), and
then nothing is written after the trigger; a StatefulSet's pod with one leaves its StatefulSet
before the trigger, which is scaled to 0 (statefulset.py): the StatefulSet would re-create the
stopped pod and GKE restore it at once, the accelerator never freed. A pod the GKE Workspaces add-on manages gets no policy or
trigger of ours: the pause goes through the Workspace and the add-on. A failed or timed-out snapshot
raises BackendError: the lifecycle records it and the checkpoint stays the way back.

A pod-snapshot restore revives this very process in the middle of snapshot()/release() (the
snapshot was taken while it waited). It notices (the pod by its recorded name is gone or has a new
uid, or the hostname changed) and then never stops the restored pod.

In the resumed pod, restored_live() reads the own pod's PodRestored condition (whose message must
name the snapshot this pause made) and GKE's Warning event when it fell back to a cold start; the
reason given (another GPU model, a changed pod spec) also comes from what this backend recorded on
the trigger at pause time.
"""

from __future__ import annotations

from typing import Any, ClassVar

from traitlets import Bool, Enum, Float, Unicode, validate

from .. import configcheck as cc
from . import statefulset
from .base import BackendError, PauseContext
from .gkw import gkw_manages_pod, gkw_policy_name
from .kube import (
    PS_NAME_ANNOTATION,
    SNAPSHOT_GROUP,
    SNAPSHOT_KINDS,
    SNAPSHOT_VERSION,
    STATEFULSETS,
    WORKSPACE_LABEL,
    WORKSPACE_SELECTOR_LABEL,
    KubeError,
)
from .pod import has_pvc, owner_mode, pod_owner, workspace_key
from .podbackend import PodBackend
from .results import ReleaseResult, RestoreVerdict, SnapshotResult
from .snapshots import default_policy_name


class GKEBackend(PodBackend):
    """Pause with GKE Pod Snapshots; resume checks PodRestored and falls back to the checkpoint."""

    name = "gke"

    storage_config = Unicode("jupyter-pause-snapshots", help="PodSnapshotStorageConfig name the "
                             "policy uses (cluster-scoped; set up by an admin).").tag(config=True)
    retention = Unicode("7d", help="Policy retentionConfig.lastAccessTimeout ('' = keep until "
                        "deleted); units y, mo, d, h, min.").tag(config=True)
    stop_via = Enum(["auto", "workspace", "statefulset", "policy", "none"], "auto",
                    help="How release() stops the pod: through its owner, or the policy's "
                    "postCheckpoint: stop (bare pods).").tag(config=True)
    trigger_timeout = Float(1200.0, help="Seconds until the trigger must be Triggered (a "
                            "64.7 GiB capture froze its pod for 13 min 52 s, llm-d PR 2489)."
                            ).tag(config=True)
    snapshot_timeout = Float(1800.0, help="Seconds until the PodSnapshot must be Ready (an 8 GiB "
                             "GPU snapshot takes about 2 minutes, 70 GiB about 13).").tag(config=True)
    discard_wait = Float(60.0, help="Seconds a failed pause waits for its pod snapshot's "
                         "finalizer before it leaves the trigger for gc().").tag(config=True)
    setup_policy = Bool(True, help="Create the workspace's PodSnapshotPolicy when the server "
                        "starts, not at the first pause: GKE restores a pod only when a policy "
                        "selects it, and an admin may want to see or adjust it first.").tag(
        config=True)

    _own_checks: ClassVar[dict[str, cc.Check]] = {"retention": cc.gke_duration, "trigger_timeout": cc.seconds(positive=True),
                   "snapshot_timeout": cc.seconds(positive=True), "discard_wait": cc.seconds()}
    config_checks: ClassVar[dict[str, cc.Check]] = {**PodBackend.config_checks, **_own_checks}

    @validate(*_own_checks)
    def _validate_gke_config(self, proposal: Any) -> Any:
        return self._checked(proposal)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.policy_setup: dict[str, Any] | None = None  # what ensure_policy() found at start

    async def why_not(self) -> str | None:
        why = await self.feature_missing(
            SNAPSHOT_GROUP, SNAPSHOT_VERSION, SNAPSHOT_KINDS,
            not_installed="GKE Pod Snapshots are not installed in this cluster "
            "(podsnapshot.gke.io/v1 is not served)",
            incomplete="GKE Pod Snapshots incomplete: {} not served")
        if why:
            return why
        if not all(self.pod.identity()):
            return "not running in a pod (set POD_NAME/POD_NAMESPACE with the downward API)"
        if self.setup_policy and self.policy_setup is None:
            try:  # describe() runs at server start: the workspace's setup
                self.policy_setup = await self.ensure_policy()
            except (BackendError, KubeError) as e:
                self.log.warning("jupyter-pause: pod snapshot policy not set up yet: %s", e)
        return None

    async def ensure_policy(self) -> dict[str, Any]:
        """Make sure a policy selects this pod: {"policy": name, "managed_by": ...}."""
        pod = await self.pod.get()
        if await gkw_manages_pod(self.kube, pod):
            ws = pod["metadata"]["labels"][WORKSPACE_LABEL]
            return {"policy": gkw_policy_name(ws), "managed_by": "gke-workspaces"}
        key = workspace_key(pod)
        if key is None:
            raise BackendError("the pod has no stable label for a snapshot policy",
                               reason="no_selector")
        name = await self._ensure_policy(pod, key)
        return {"policy": name, "managed_by": None}

    async def _ensure_policy(self, pod: dict, key: tuple[str, str]) -> str:
        return await self.snapshots.ensure_policy(
            pod["metadata"]["namespace"], key,
            name=self.policy_name or default_policy_name(key[1]),
            storage_config=self.storage_config, retention=self.retention,
            postcheckpoint="stop" if self._post_stop(pod) else "resume")

    async def snapshot(self, ctx: PauseContext) -> SnapshotResult:
        pod = await self.pod.get()
        if ctx.mode != "stop" and await gkw_manages_pod(self.kube, pod):
            ctx.progress("GKE Workspaces manages this pod's snapshots; pausing through it")
            out = await self.workspaces.snapshot(ctx)
            self.pod.paused_as["through_workspace"] = True  # release() follows the add-on
            return out
        key = workspace_key(pod)
        if key is None:
            raise BackendError(
                "the pod has no stable label for a snapshot policy",
                reason="no_selector",
                hint=f"label the pod template with {WORKSPACE_SELECTOR_LABEL}=<workspace name>")
        ns, workspace = pod["metadata"]["namespace"], key[1]
        self.pod.remember(pod, workspace)
        stop = self._stop_mode(pod)
        post_stop = self._post_stop(pod)
        policy = await self._ensure_policy(pod, key)
        if self._detaches(pod):
            # GKE stops this pod after the snapshot and the StatefulSet would re-create it
            # (GKE restoring it at once): leave the StatefulSet first (statefulset.py).
            owner = pod_owner(pod)
            ctx.progress(f"Taking the pod out of StatefulSet {owner[1] if owner else '?'} and "
                         "scaling it to 0 (its volume stays)")
            self.pod.paused_as["detached"] = await statefulset.detach(
                self.kube, pod, owner[1] if owner else "", key[0])
        ctx.progress("Asking GKE to snapshot the pod")
        try:
            tname = (await self.snapshots.create_trigger(ctx, ns, pod, workspace)
                     )["metadata"]["name"]
        except (BackendError, KubeError):
            await self._reattach(pod)
            raise
        self.pod.paused_as["trigger"] = tname
        # postCheckpoint: stop: from here GKE may snapshot the pod at any moment and then stop
        # it; nothing may be written to its volumes after that (writes_held()).
        self.pod.paused_as["hold_writes"] = post_stop
        try:
            snap = await self.snapshots.wait_trigger(ns, tname, self.trigger_timeout)
            await self.snapshots.wait_snapshot(ctx, ns, snap, self.snapshot_timeout)
        except BackendError:
            if await self.pod.restored_here():  # the wait broke because this process was restored
                return self._woke_result(tname)
            await self.snapshots.discard(ns, tname, self.discard_wait)
            await self._reattach(pod)
            raise
        if await self.pod.restored_here():
            return self._woke_result(tname, snap)
        self.pod.paused_as["snapshot"] = snap
        # The lifecycle journals snapshot_ready from this result, unless GKE stops this pod after
        # the checkpoint (postCheckpoint: stop): then nothing may be written to the pod's volumes
        # any more (on GKE this process does not even run again here; only a restored copy does).
        return SnapshotResult(snapshot=snap, trigger=tname, policy=policy, backend=self.name,
                              stop_via=stop, gpu_model=await self.pod.gpu(pod),
                              hold_writes=post_stop)

    async def _reattach(self, pod: dict) -> None:
        """A pause that failed before its snapshot puts the pod back into its StatefulSet."""
        record = self.pod.paused_as.pop("detached", None)
        if not record:
            return
        meta = pod["metadata"]
        try:
            await statefulset.reattach(self.kube, meta["name"], meta["namespace"], record)
        except BackendError as e:
            self.log.warning("jupyter-pause: %s; `jupyter pause resume %s` brings it back", e,
                             record["statefulset"])

    def _woke_result(self, trigger: str, snap: str | None = None) -> SnapshotResult:
        self.pod.paused_as["woke_up"] = True
        return SnapshotResult(
            snapshot=snap, trigger=trigger, backend=self.name, woke_up=True,
            reason="this pod was restored from the pod snapshot during the pause")

    async def release(self, ctx: PauseContext) -> ReleaseResult:
        stopping = ctx.mode == "stop"
        if self.pod.paused_as.get("through_workspace") and not stopping:
            return await self.workspaces.release(
                ctx, timeout=self.trigger_timeout + self.snapshot_timeout)
        if stopping:
            self.pod.paused_as = {}  # no snapshot this time: nothing can have restored us
        elif self.pod.paused_as.get("woke_up") or await self.pod.restored_here():
            # Never stop a pod that a snapshot restore just brought back.
            return ReleaseResult(released=False, woke_up=True,
                                 reason="this pod was restored from the pod snapshot")
        detached = None if stopping else self.pod.paused_as.get("detached")
        if detached:
            # Out of its StatefulSet, scaled to 0: GKE stops the pod after the snapshot
            # (postCheckpoint: stop) and nothing re-creates it.
            return ReleaseResult(released=True, stopped_via="statefulset",
                                 owner=detached["statefulset"])
        pod = await self.pod.get()
        mode = self._stop_mode(pod)
        if stopping and mode == "policy":
            # The policy stops the pod only after a snapshot (postCheckpoint: stop), and a stop
            # takes none: only the pod's owner can stop it.
            mode = owner_mode(pod) or ""
            if not mode:
                raise BackendError(
                    "cannot stop this pod without a snapshot: it has no owner to stop it "
                    "(a bare pod is stopped only by the snapshot policy after a pod snapshot)",
                    reason="no_owner",
                    hint="pause instead (it snapshots, then stops the pod), or run the notebook "
                    "under a StatefulSet or a Kubeflow Workspace")
        ns = pod["metadata"]["namespace"]
        owner = pod_owner(pod)
        ctx.progress("Stopping the pod to free the accelerator")
        if mode == "workspace":
            ws = pod["metadata"]["labels"][WORKSPACE_LABEL]
            if stopping:  # under GKE Workspaces a plain paused=true would snapshot the pod
                return await self.workspaces.stop(ws, ns)
            await self.workspaces.set_paused(ws, ns)
            return ReleaseResult(released=True, stopped_via="workspace", owner=ws)
        if mode == "statefulset" and owner:
            try:  # the scale subresource: what the StatefulSet's Role grants, for it alone
                await self.kube.scale(STATEFULSETS, owner[1], ns, 0)
            except KubeError as e:
                raise statefulset.scale_error(e, owner[1]) from None
            return ReleaseResult(released=True, stopped_via="statefulset", owner=owner[1])
        if mode == "policy":
            # GKE turns the pod Completed after the checkpoint (postCheckpoint: stop).
            return ReleaseResult(released=True, stopped_via="policy")
        return ReleaseResult(released=False, stopped_via="none")

    async def restore_verdict(self) -> RestoreVerdict:
        try:
            pod = await self.pod.get()
        except BackendError as e:
            return RestoreVerdict(live=None, reason=str(e))
        key = workspace_key(pod)
        ns = pod["metadata"]["namespace"]
        try:
            pod = await self.pod.await_restored_condition(pod)
            trigger = await self.snapshots.trigger_of(pod, ns, key[1] if key else None)
        except KubeError as e:
            return RestoreVerdict(live=None, reason=str(e))
        snap = ((trigger or {}).get("status") or {}).get("snapshotCreated", {}).get("name")
        expected = ((pod["metadata"].get("annotations")) or {}).get(PS_NAME_ANNOTATION) or snap
        live, why = await self.judge(pod, trigger, expected)
        return RestoreVerdict(live=live, reason=why, snapshot=snap)

    def _stop_mode(self, pod: dict) -> str:
        if self.stop_via != "auto":
            return self.stop_via
        if has_pvc(pod):
            # GKE's Pod snapshot troubleshooting ("Post-checkpoint mutation risks with PVCs"):
            # with a PVC use postCheckpoint: stop; writes after the checkpoint make the restore
            # fail (vfs.CompleteRestore() failed, gke-labs/pod-migration issue 15). A
            # StatefulSet's pod leaves its StatefulSet first (_detaches()).
            return "statefulset" if owner_mode(pod) == "statefulset" else "policy"
        return owner_mode(pod) or "policy"

    def _detaches(self, pod: dict) -> bool:
        """A StatefulSet's pod with a PVC: GKE stops it after the snapshot, and the StatefulSet
        would re-create it at once, so the pause takes it out of the StatefulSet first."""
        return self._stop_mode(pod) == "statefulset" and has_pvc(pod)

    def _post_stop(self, pod: dict) -> bool:
        """Does GKE stop the pod after its snapshot (the policy's postCheckpoint: stop)?"""
        return self._stop_mode(pod) == "policy" or self._detaches(pod)
