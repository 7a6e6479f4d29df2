"""What the gke and kubeflow backends share: the settings of a backend that runs in a pod, and the
components they pause and verify with.

Each backend holds an `OwnPod` (the pod it runs in), `PodSnapshots` (GKE Pod Snapshots) and
`Workspaces` (Kubeflow Workspaces and GKE Workspaces' add-on); the backends differ only in how
they pause, which the subclasses say. The kernels come back the way the local backend brings them
back: after a live restore they are still running, after a cold start they are started anew.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from traitlets import Any as AnyTrait
from traitlets import Bool, Float, Int, Unicode, validate

from .. import configcheck as cc
from .base import BackendError, ResumeContext
from .cleanup import collect_garbage
from .gkw import CHECKPOINTING, READY, checkpoint_state
from .kube import PS_NAME_ANNOTATION, WORKSPACE_LABEL, Kube, KubeError
from .local import LocalBackend
from .pod import OwnPod, unreachable, workspace_key
from .results import RestoreVerdict, ResumeResult
from .snapshots import PodSnapshots, default_policy_name
from .verdict import restore_reason
from .workspaces import Workspaces


class PodBackend(LocalBackend):
    """Base of the backends that run in a Kubernetes pod (configured as their own class)."""

    resume_on_start: ClassVar[bool] = True

    kubeconfig = Unicode(None, allow_none=True,
                         help="Kubeconfig file; default: the pod's service account.").tag(config=True)
    namespace = Unicode(None, allow_none=True,
                        help="The pod's namespace; default: POD_NAMESPACE or the service account's."
                        ).tag(config=True)
    pod_name = Unicode(None, allow_none=True,
                       help="The own pod's name; default: POD_NAME (downward API) or the hostname."
                       ).tag(config=True)
    policy_name = Unicode(None, allow_none=True,
                          help="PodSnapshotPolicy name; default jp-<workspace>.").tag(config=True)
    keep_snapshots = Int(2, help="gc(): pod snapshots kept per workspace (newest first).").tag(
        config=True)
    restored_condition_wait = Float(30.0, help="Seconds after container start to wait for "
                                    "PodRestored (GKE sets it after the process resumed).").tag(
        config=True)
    gpu_model = Unicode(None, allow_none=True, help="GPU model of this pod; default: nvidia-smi, "
                        "then the pod's accelerator node selector.").tag(config=True)
    single_use_snapshots = Bool(True, help="Delete the workspace's pod snapshots once a resume "
                                "is verified, as GKE Workspaces does: a policy that selects the "
                                "pod would otherwise restore the newest snapshot into any later "
                                "pod of the workspace (a crash restart too), bringing stale "
                                "memory back. The application checkpoints stay.").tag(config=True)
    api_client = AnyTrait(None, allow_none=True,
                          help="A kubernetes.client.ApiClient to use (tests, embedding).")

    config_checks: ClassVar[dict[str, cc.Check]] = {**LocalBackend.config_checks, "keep_snapshots": cc.count,
                     "restored_condition_wait": cc.seconds()}
    resume_traits = LocalBackend.resume_traits | {"restored_condition_wait"}

    @validate("keep_snapshots", "restored_condition_wait")
    def _validate_pod_config(self, proposal: Any) -> Any:
        return self._checked(proposal)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pod = OwnPod(self)
        self.snapshots = PodSnapshots(self.pod)
        self.workspaces = Workspaces(self.pod)
        self._described: tuple[float, dict] | None = None
        self.snapshot_cleanup: asyncio.Task | None = None  # attach()'s single-use clean-up

    @property
    def kube(self) -> Kube:
        return self.pod.kube

    async def why_not(self) -> str | None:
        """Why this backend cannot pause here, or None; subclasses say."""
        raise NotImplementedError

    async def feature_missing(self, group: str, version: str, kinds: set[str] | frozenset[str],
                              *, not_installed: str, incomplete: str) -> str | None:
        """Why the cluster lacks a feature: `not_installed` when it does not serve group/version
        (403, 404), `incomplete` (formatted with the missing kinds) when it serves only part of
        `kinds`, or why it could not be asked; None when all is served."""
        try:
            served = {r.get("kind") for r in await self.kube.api_resources(group, version)}
        except KubeError as e:
            return not_installed if e.status in (403, 404) else unreachable(e)
        missing = kinds - served
        return incomplete.format(", ".join(sorted(missing))) if missing else None

    # -- Backend --
    async def describe(self) -> dict[str, Any]:
        # The server asks often (status): once a minute is enough.
        if self._described and time.monotonic() - self._described[0] < 60:
            return self._described[1]
        why = await self.why_not()
        out = {"name": self.name, "configured": why is None, "can_pause": why is None,
               "why_not": why}
        self._described = (time.monotonic(), out)
        return out

    async def resume(self, ctx: ResumeContext) -> ResumeResult:
        # The pod is back already (this server runs in it); bring the kernels back like local does.
        self.pod.paused_as = {}
        # a stop, or a pause of a pod the add-on had not set up, may have opted it out
        await self._undo_stop_opt_out()
        return await super().resume(ctx)

    async def watch_platform_pause(self, start_pause: Callable[[str], Awaitable[Any]]) -> None:
        """Run for the server's life: a pause GKE Workspaces begins by itself (Kubeflow's
        dashboard or culler) starts the pause path here first (workspaces.py)."""
        await self.workspaces.watch_platform_pause(start_pause)

    async def _undo_stop_opt_out(self) -> None:
        """A stop opted the Workspace out of GKE Workspaces' snapshots; a resume through the
        Kubeflow dashboard does not know to opt it back in."""
        try:
            if await self.workspaces.undo_stop_opt_out():
                self.log.info("jupyter-pause: GKE Workspaces snapshots re-enabled after a stop")
        except BackendError as e:
            if e.reason != "not_workspace":
                self.log.warning("jupyter-pause: could not re-enable GKE Workspaces snapshots "
                                 "after a stop: %s", e)

    async def attach(self, ctx: ResumeContext) -> None:
        await super().attach(ctx)
        if self.single_use_snapshots:
            # In the background: a snapshot's finalizer can take minutes, "ready" must not wait.
            self.snapshot_cleanup = asyncio.create_task(self._drop_used_snapshots())

    async def _drop_used_snapshots(self) -> dict[str, Any]:
        try:
            res = await self.gc(older_than=None, dry_run=False, protect_pinned=False,
                                every_ready=True)
            self.log.info("jupyter-pause: used pod snapshots deleted: %s", res.get("deleted"))
            return res
        except (BackendError, KubeError) as e:
            self.log.warning("jupyter-pause: could not delete used pod snapshots: %s", e)
            return {"error": str(e)}

    async def restored_live(self, ctx: ResumeContext | None = None) -> RestoreVerdict:
        verdict = await self.restore_verdict()
        if ctx is not None and verdict.restore_reason:
            ctx.progress(verdict.restore_reason)
        return verdict

    async def restore_verdict(self) -> RestoreVerdict:
        """What the platform says about the own pod's restore; subclasses say."""
        raise NotImplementedError

    async def judge(self, pod: dict, trigger: dict | None,
                    expected: str | None) -> tuple[bool, str]:
        """(restored live?, why) for the own pod (verdict.restore_reason)."""
        return restore_reason(pod, trigger, await self.pod.gpu(pod), await self.pod.events(pod),
                              expected)

    async def writes_held(self) -> str | None:
        """A pod snapshot of this pod was taken (or is under way) and the pod is stopped after
        it: our own pause with postCheckpoint: stop (its trigger neither failed nor gone), or
        GKE Workspaces' checkpoint (the Workspace's checkpoint-state annotation Checkpointing or
        Ready; gke-labs/workspaces snapshot.go AnnotationCheckpointState, reconcile.go, where
        Ready stays until the restored pod is Ready). GKE's Pod snapshot troubleshooting: writes
        to a PVC after the snapshot make the restore fail (gke-labs/pod-migration issue 15)."""
        held = await self.snapshots.holds_writes()
        if held:
            return held
        try:
            try:
                pod = await self.pod.get()
            except BackendError:
                # a stopped pod may be gone already; its Workspace label is all that is needed
                if self.pod.seen is None:
                    raise
                pod = self.pod.seen
            state = await checkpoint_state(self.kube, pod)
        except (BackendError, KubeError) as e:
            self.log.debug("jupyter-pause: GKE Workspaces' checkpoint-state not read: %s", e)
            return None
        if state in (CHECKPOINTING, READY):
            ws = pod["metadata"]["labels"][WORKSPACE_LABEL]
            return (f"GKE Workspaces snapshotted this pod (Workspace {ws} checkpoint-state "
                    f"{state}) and stops it after the snapshot")
        return None

    async def gc(self, *, keep: int | None = None, older_than: float | None = None,
                 dry_run: bool = False, protect_pinned: bool = True,
                 every_ready: bool = False) -> dict[str, Any]:
        """Delete this workspace's old pod snapshots (then their triggers); the policy stays.

        `keep` Ready snapshots (default keep_snapshots; 0: no count limit) and those younger
        than `older_than` seconds are kept, and so is the one this pod was restored from
        (`protect_pinned`); `every_ready` deletes Ready ones whatever their count."""
        pod = await self.pod.get()
        key = workspace_key(pod)
        if key is None:
            return {"deleted": [], "remaining": [], "stuck": []}
        pinned = (pod["metadata"].get("annotations") or {}).get(PS_NAME_ANNOTATION)
        pinned = pinned if protect_pinned else None
        return await collect_garbage(
            self.kube, pod["metadata"]["namespace"], key[1],
            keep=self.keep_snapshots if keep is None else keep, older_than=older_than,
            dry_run=dry_run, policy=self.policy_name or default_policy_name(key[1]),
            every_ready=every_ready,
            protect={pinned} if pinned else set())
