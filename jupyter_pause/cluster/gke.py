"""GKE Pod Snapshots backend (`podsnapshot.gke.io/v1`).

The workspace's manual PodSnapshotPolicy is set up when the server starts (describe()), so that a
policy selects the pod before anything is paused. Pause, after the server wrote the application
checkpoint: create a PodSnapshotManualTrigger for the own pod, watch it to Triggered=True/Complete
(or False/Failed|Error), wait for the PodSnapshot to be Ready, and only then stop the pod through its
owner (Kubeflow Workspace `spec.paused`, StatefulSet replicas 0, or the policy's
`postCheckpoint: stop`). A pod with a PersistentVolumeClaim always uses `stop` (GKE's rule), and
then nothing is written after the trigger. A pod the GKE Workspaces add-on manages gets no policy or
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

import asyncio
import hashlib
import json
import re
import secrets
import socket
import time
from datetime import datetime, timezone
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Bool, Enum, Float, Int, Unicode

from . import accelerator
from .base import BackendError, PauseContext, ResumeContext
from .cleanup import collect_garbage, snapshots_of
from .cleanup import wait_gone as wait_snapshots_gone
from .gkw import (  # noqa: F401 (GKW_READINESS_GATE: kept importable from here)
    CHECKPOINTING,
    GKW_READINESS_GATE,
    READY,
    checkpoint_state,
    gkw_manages,
    gkw_policy_name,
    has_gate,
)
from .kube import (
    EVENTS,
    FLIGHT_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    PODS,
    POLICIES,
    PS_NAME_ANNOTATION,
    SNAPSHOT_GROUP,
    SNAPSHOT_VERSION,
    SNAPSHOTS,
    SPEC_HASH_ANNOTATION,
    STATEFULSETS,
    TRIGGERED_BY_LABEL,
    TRIGGERS,
    WORKSPACE_LABEL,
    WORKSPACE_SELECTOR_LABEL,
    WORKSPACES,
    Kube,
    KubeError,
    condition,
    is_true,
    load_api_client,
    own_pod_identity,
)
from .local import LocalBackend

SNAPSHOT_KINDS = {"PodSnapshot", "PodSnapshotPolicy", "PodSnapshotManualTrigger",
                  "PodSnapshotStorageConfig"}
STS_POD_LABEL = "statefulset.kubernetes.io/pod-name"
ACCELERATOR_SELECTOR = "cloud.google.com/gke-accelerator"


def dns_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label from parts, cut to `limit` characters (names of triggers, policies)."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(p for p in parts if p).lower()).strip("-")
    return name[:limit].rstrip("-") or "x"


def trigger_name(workspace: str) -> str:
    """`jp-<workspace>-<YYYYmmdd-HHMMSS>-<8hex>`: unique, sortable and within 63 characters."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{dns_name('jp', workspace, limit=38)}-{stamp}-{secrets.token_hex(4)}"


SA_TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def _is_sa_token_volume(v: dict) -> bool:
    """The per-pod `kube-api-access-<random>` volume the ServiceAccount admission plugin adds
    (kubernetes plugin/pkg/admission/serviceaccount/admission.go): random per pod."""
    sources = ((v.get("projected") or {}).get("sources")) or []
    return str(v.get("name", "")).startswith("kube-api-access-") or any(
        "serviceAccountToken" in src for src in sources)


def distilled_spec_hash(pod: dict) -> str:
    """A hash of the pod-spec fields GKE matches a snapshot on (CONCEPT "Snapshot matching"):
    a change here means a cold start. Env values and scheduling fields are left out, as GKE does,
    and so is the service-account token volume: its name differs in every pod."""
    spec = pod.get("spec") or {}
    token_vols = {v.get("name") for v in spec.get("volumes") or [] if _is_sa_token_volume(v)}
    keep = ("image", "command", "args", "workingDir", "ports", "securityContext")
    containers = [{**{k: c.get(k) for k in keep},
                   "volumeMounts": [m for m in c.get("volumeMounts") or []
                                    if m.get("name") not in token_vols
                                    and m.get("mountPath") != SA_TOKEN_MOUNT] or None}
                  for c in spec.get("containers") or []]
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") not in token_vols] or None
    annotations = {k: v for k, v in ((pod.get("metadata") or {}).get("annotations") or {}).items()
                   if k.startswith("dev.gvisor.")}
    data = {"containers": containers, "volumes": volumes,
            "securityContext": spec.get("securityContext"),
            "runtimeClassName": spec.get("runtimeClassName"), "annotations": annotations}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def cold_start_event(events: list[dict]) -> dict | None:
    """GKE's Warning event that it skipped the restore. gke-labs/pod-migration issue 13 quotes
    reason `GKEPodSnapshotting` and a message containing "falling back to a cold start of pod";
    GKE documents neither, so any Warning whose reason names pod snapshots and whose message
    says "cold start" counts."""
    for e in sorted(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime")
                                              or ""), reverse=True):
        reason, msg = str(e.get("reason") or ""), str(e.get("message") or "")
        if e.get("type") == "Warning" and "snapshot" in reason.lower() and \
                re.search(r"cold[ -]?start", msg, re.IGNORECASE):
            return e
    return None


def has_pvc(pod: dict) -> bool:
    """Does the pod mount a PersistentVolumeClaim (or a generic ephemeral volume, which is one)?"""
    return any("persistentVolumeClaim" in v or "ephemeral" in v
               for v in (pod.get("spec") or {}).get("volumes") or [])


def detect_gpu_model(pod: dict | None = None) -> str | None:
    """The GPU model this process sees (the driver's, as an accelerator type like "nvidia-l4"),
    else the pod's accelerator node selector."""
    return accelerator.detected_gpu_model() or (
        ((pod or {}).get("spec") or {}).get("nodeSelector", {}).get(ACCELERATOR_SELECTOR))


def workspace_key(pod: dict) -> tuple[str, str] | None:
    """The stable per-workspace label (key, value) a policy can select this pod by.

    Ours first, then Kubeflow's workspace label, then the StatefulSet pod name (stable: `<sts>-0`).
    """
    labels = (pod.get("metadata") or {}).get("labels") or {}
    for key in (WORKSPACE_SELECTOR_LABEL, WORKSPACE_LABEL, STS_POD_LABEL):
        if labels.get(key):
            return key, labels[key]
    return None


def pod_owner(pod: dict) -> tuple[str, str] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") or len((pod.get("metadata") or {}).get("ownerReferences")) == 1:
            return ref.get("kind", ""), ref.get("name", "")
    return None


def restore_reason(pod: dict, trigger: dict | None, gpu_model: str | None,
                   events: list[dict] | None = None,
                   expected: str | None = None) -> tuple[bool, str]:
    """(restored live?, why) from the pod's PodRestored condition, GKE's Warning event and what
    the pause recorded. `expected` is the snapshot this pause made: PodRestored's message names
    the snapshot it restored (agent-sandbox `check_pod_restored_from_snapshot`), and memory from
    another (older) snapshot is not this pause's state."""
    c = condition(pod, "PodRestored")
    if c is not None:
        if c.get("status") == "True":
            msg = c.get("message") or ""
            if expected and expected not in msg:
                return False, (f"pod was restored from another pod snapshot than the one this "
                               f"pause made ({expected}): {msg or 'PodRestored=True'}")
            return True, msg or "restored from a pod snapshot"
        detail = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
        return False, f"pod restore failed ({detail or 'PodRestored=' + str(c.get('status'))})"
    ev = cold_start_event(events or [])
    gke_says = f"GKE: {ev.get('message')}" if ev is not None else ""
    ann = ((trigger or {}).get("metadata") or {}).get("annotations") or {}
    snap_gpu, snap_hash = ann.get(GPU_MODEL_ANNOTATION), ann.get(SPEC_HASH_ANNOTATION)
    why = ""
    if snap_gpu and gpu_model and accelerator.gpu_model_key(snap_gpu) != \
            accelerator.gpu_model_key(gpu_model):
        why = (f"snapshot for another GPU model (snapshot taken on {snap_gpu}, this pod has "
               f"{gpu_model})")
    elif snap_hash and snap_hash != distilled_spec_hash(pod):
        why = "the pod spec changed since the snapshot"
    elif trigger is None and not gke_says:
        why = "no pod snapshot of this workspace was found"
    if why or gke_says:
        return False, "pod was cold-started: " + "; ".join(x for x in (why, gke_says) if x)
    return False, "pod was cold-started: GKE did not restore the pod snapshot (no PodRestored)"


class GKEBackend(LocalBackend):
    """Pause with GKE Pod Snapshots; resume checks PodRestored and falls back to the checkpoint."""

    name = "gke"
    resume_on_start = True

    kubeconfig = Unicode(None, allow_none=True,
                         help="Kubeconfig file; default: the pod's service account.").tag(config=True)
    namespace = Unicode(None, allow_none=True,
                        help="The pod's namespace; default: POD_NAMESPACE or the service account's."
                        ).tag(config=True)
    pod_name = Unicode(None, allow_none=True,
                       help="The own pod's name; default: POD_NAME (downward API) or the hostname."
                       ).tag(config=True)
    storage_config = Unicode("jupyter-pause-snapshots", help="PodSnapshotStorageConfig name the "
                             "policy uses (cluster-scoped; set up by an admin).").tag(config=True)
    policy_name = Unicode(None, allow_none=True,
                          help="PodSnapshotPolicy name; default jp-<workspace>.").tag(config=True)
    retention = Unicode("7d", help="Policy retentionConfig.lastAccessTimeout ('' = keep until "
                        "deleted); units y, mo, d, h, min.").tag(config=True)
    keep_snapshots = Int(2, help="gc(): pod snapshots kept per workspace (newest first).").tag(
        config=True)
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
    setup_policy = Bool(True, help="Create the workspace's PodSnapshotPolicy when the server "
                        "starts, not at the first pause: GKE restores a pod only when a policy "
                        "selects it, and an admin may want to see or adjust it first.").tag(
        config=True)
    api_client = AnyTrait(None, allow_none=True,
                          help="A kubernetes.client.ApiClient to use (tests, embedding).")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._kube: Kube | None = None
        self._described: tuple[float, dict] | None = None
        self._pause: dict[str, Any] = {}
        self.restore_reason: str | None = None  # why restored_live() said what it said
        self._gpu_found: str | None = None
        self._cleanup: asyncio.Task | None = None
        self._gkw_delegate: Any = None  # the Kubeflow backend while GKE Workspaces pauses
        self.policy_setup: dict[str, Any] | None = None  # what ensure_policy() found at start
        self._pod_seen: dict | None = None  # the own pod as last read (it may be gone at a stop)

    # -- plumbing --
    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube(self.api_client or (lambda: load_api_client(self.kubeconfig)))
        return self._kube

    def identity(self) -> tuple[str | None, str | None]:
        name, ns = own_pod_identity()
        return self.pod_name or name, self.namespace or ns

    async def own_pod(self) -> dict:
        name, ns = self.identity()
        if not name or not ns:
            raise BackendError("not running in a Kubernetes pod (no POD_NAME/POD_NAMESPACE and no "
                               "service-account namespace)", reason="not_in_pod",
                               hint="set POD_NAME and POD_NAMESPACE with the downward API")
        pod = await self._k(self.kube.get(PODS, name, ns))
        self._pod_seen = pod
        return pod

    async def _k(self, aw: Any) -> Any:
        """Await a Kube call; turn its error into a BackendError with a hint."""
        try:
            return await aw
        except KubeError as e:
            hint = ("apply examples/kubernetes/rbac.yaml to the notebook's service account"
                    if e.status == 403 else None)
            raise BackendError(str(e), reason="rbac" if e.status == 403 else "kubernetes",
                               hint=hint) from None

    async def _gpu(self, pod: dict | None) -> str | None:
        """The GPU model of this process, found once (nvidia-smi runs in a thread). A process
        only ever sees one GPU model: a live restore needs the same one."""
        if self.gpu_model:
            return self.gpu_model
        if self._gpu_found is None:
            self._gpu_found = (await asyncio.to_thread(detect_gpu_model, pod)) or ""
        return self._gpu_found or None

    # -- Backend --
    async def describe(self) -> dict[str, Any]:
        if self._described and time.monotonic() - self._described[0] < 60:
            return self._described[1]
        why = None
        try:
            kinds = {r.get("kind") for r in await self.kube.api_resources(SNAPSHOT_GROUP,
                                                                          SNAPSHOT_VERSION)}
            missing = SNAPSHOT_KINDS - kinds
            if missing:
                why = f"GKE Pod Snapshots incomplete: {', '.join(sorted(missing))} not served"
        except KubeError as e:
            why = ("GKE Pod Snapshots are not installed in this cluster (podsnapshot.gke.io/v1 "
                   "is not served)" if e.status in (403, 404) else _unreachable(e))
        except Exception as e:  # noqa: BLE001 (no kubeconfig, not in a cluster)
            why = f"no Kubernetes access: {e}".splitlines()[0]
        if why is None and not all(self.identity()):
            why = "not running in a pod (set POD_NAME/POD_NAMESPACE with the downward API)"
        out = {"name": self.name, "configured": why is None, "can_pause": why is None,
               "why_not": why}
        self._described = (time.monotonic(), out)
        if why is None and self.setup_policy and self.policy_setup is None:
            try:  # describe() runs at server start: the workspace's setup
                self.policy_setup = await self.ensure_policy()
            except (BackendError, KubeError) as e:
                self.log.warning("jupyter-pause: pod snapshot policy not set up yet: %s", e)
        return out

    async def ensure_policy(self) -> dict[str, Any]:
        """Make sure a policy selects this pod: {"policy": name, "managed_by": ...}."""
        pod = await self.own_pod()
        ns = pod["metadata"]["namespace"]
        if await self._gkw_managed(pod):
            ws = pod["metadata"]["labels"][WORKSPACE_LABEL]
            return {"policy": gkw_policy_name(ws), "managed_by": "gke-workspaces"}
        key = workspace_key(pod)
        if key is None:
            raise BackendError("the pod has no stable label for a snapshot policy",
                               reason="no_selector")
        stop = self._stop_mode(pod)
        name = await self._ensure_policy(ns, key[1], key, postcheckpoint=(
            "stop" if stop == "policy" else "resume"))
        return {"policy": name, "managed_by": None}

    async def _gkw_managed(self, pod: dict) -> bool:
        """Does the GKE Workspaces add-on snapshot this pod? Then a policy and trigger of ours
        would make two policies select one pod: join the add-on's flow instead. The add-on's own
        rule decides (gkw.gkw_manages: a Workspace opt-out, TPUs, a Workspace or a WorkspaceKind
        opt-in); only when the Workspace is unreadable do its marks on the pod (the readiness
        gate) and in the namespace (its ws-<workspace>-policy) stand in for it."""
        ws = (pod["metadata"].get("labels") or {}).get(WORKSPACE_LABEL)
        if not ws:
            return False
        ns = pod["metadata"]["namespace"]
        try:
            obj = await self.kube.get_or_none(WORKSPACES, ws, ns)
        except KubeError:
            obj = None
        if obj is not None:
            return await gkw_manages(self.kube, obj, pod)
        if has_gate(pod):
            return True
        try:
            pol = await self.kube.get_or_none(POLICIES, gkw_policy_name(ws), ns)
        except KubeError:
            return False
        return pol is not None and ((pol.get("spec") or {}).get("selector") or {}).get(
            "matchLabels", {}).get(WORKSPACE_LABEL) == ws

    def _gkw_backend(self) -> Any:
        """The Kubeflow backend, which pauses through the Workspace and follows the add-on."""
        if self._gkw_delegate is None:
            from .kubeflow import KubeflowBackend

            self._gkw_delegate = KubeflowBackend(
                parent=self.parent, api_client=self.api_client, kubeconfig=self.kubeconfig,
                namespace=self.namespace, pod_name=self.pod_name, gpu_model=self.gpu_model,
                restored_condition_wait=self.restored_condition_wait,
                checkpoint_timeout=self.trigger_timeout + self.snapshot_timeout)
            self._gkw_delegate._kube = self.kube
        return self._gkw_delegate

    async def snapshot(self, ctx: PauseContext) -> dict[str, Any]:
        pod = await self.own_pod()
        if getattr(ctx, "mode", "pause") != "stop" and await self._gkw_managed(pod):
            ctx.progress("GKE Workspaces manages this pod's snapshots; pausing through it")
            return await self._gkw_backend().snapshot(ctx)
        self._gkw_delegate = None
        meta = pod["metadata"]
        ns = meta["namespace"]
        key = workspace_key(pod)
        if key is None:
            raise BackendError(
                "the pod has no stable label for a snapshot policy",
                reason="no_selector",
                hint=f"label the pod template with {WORKSPACE_SELECTOR_LABEL}=<workspace name>")
        workspace = key[1]
        # What a restore must find again: the same pod (uid) unless this process was restored.
        self._pause = {"pod": meta["name"], "uid": meta["uid"], "hostname": socket.gethostname(),
                       "namespace": ns, "workspace": workspace}
        stop = self._stop_mode(pod)
        policy = await self._ensure_policy(ns, workspace, key, postcheckpoint=(
            "stop" if stop == "policy" else "resume"))
        ctx.progress("Asking GKE to snapshot the pod")
        trig = await self._create_trigger(ctx, ns, pod, workspace)
        tname = trig["metadata"]["name"]
        self._pause["trigger"] = tname
        # postCheckpoint: stop: from here GKE may snapshot the pod at any moment and then stop
        # it; nothing may be written to its volumes after that (writes_held()).
        self._pause["hold_writes"] = stop == "policy"
        try:
            snap = await self._wait_trigger(ctx, ns, tname)
            await self._wait_snapshot(ctx, ns, snap)
        except BackendError:
            if await self._restored_here():  # the wait broke because this process was restored
                return self._woke_result(tname)
            await self._discard(ns, tname)
            raise
        if await self._restored_here():
            return self._woke_result(tname, snap)
        self._pause["snapshot"] = snap
        # The lifecycle journals snapshot_ready from this result, unless GKE stops this pod after
        # the checkpoint (postCheckpoint: stop): then nothing may be written to the pod's volumes
        # any more (on GKE this process does not even run again here; only a restored copy does).
        return {"snapshot": snap, "trigger": tname, "policy": policy, "backend": self.name,
                "stop_via": stop, "gpu_model": await self._gpu(pod),
                "hold_writes": stop == "policy"}

    async def release(self, ctx: PauseContext) -> dict[str, Any]:
        stopping = getattr(ctx, "mode", "pause") == "stop"
        if self._gkw_delegate is not None and not stopping:
            return await self._gkw_delegate.release(ctx)
        if stopping:
            self._pause = {}  # no snapshot this time: nothing can have restored this process
        elif self._pause.get("woke_up") or await self._restored_here():
            # Never stop a pod that a snapshot restore just brought back.
            return {"released": False, "woke_up": True,
                    "reason": "this pod was restored from the pod snapshot"}
        pod = await self.own_pod()
        mode = self._stop_mode(pod)
        if stopping and mode == "policy":
            # The policy stops the pod only after a snapshot (postCheckpoint: stop), and a stop
            # takes none: only the pod's owner can stop it.
            mode = self._owner_mode(pod) or ""
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
            await self._k(self.kube.patch(WORKSPACES, ws, {"spec": {"paused": True}}, ns))
            return {"released": True, "stopped_via": "workspace", "owner": ws}
        if mode == "statefulset" and owner:
            await self._k(self.kube.patch(STATEFULSETS, owner[1], {"spec": {"replicas": 0}}, ns))
            return {"released": True, "stopped_via": "statefulset", "owner": owner[1]}
        if mode == "policy":
            # GKE turns the pod Completed after the checkpoint (postCheckpoint: stop).
            return {"released": True, "stopped_via": "policy", "owner": None}
        return {"released": False, "stopped_via": "none", "owner": None}

    async def resume(self, ctx: ResumeContext) -> dict[str, Any]:
        # The pod is back already (this server runs in it); bring the kernels back like local does:
        # after a live restore they are still running, after a cold start they are started anew.
        self._pause = {}
        return await super().resume(ctx)

    async def attach(self, ctx: ResumeContext) -> None:
        await super().attach(ctx)
        if self.single_use_snapshots:
            # In the background: a snapshot's finalizer can take minutes, "ready" must not wait.
            self._cleanup = asyncio.create_task(self._drop_used_snapshots())

    async def _drop_used_snapshots(self) -> dict[str, Any]:
        try:
            res = await self.gc(keep=0, older_than=None, dry_run=False, protect_pinned=False)
            self.log.info("jupyter-pause: used pod snapshots deleted: %s", res.get("deleted"))
            return res
        except (BackendError, KubeError) as e:
            self.log.warning("jupyter-pause: could not delete used pod snapshots: %s", e)
            return {"error": str(e)}

    async def restored_live(self, ctx: ResumeContext | None = None) -> bool | None:
        verdict = await self.restore_verdict()
        self.restore_reason = verdict["reason"]
        if ctx is not None and verdict["reason"] and verdict["live"] is False:
            ctx.progress(verdict["reason"])
        return verdict["live"]

    async def restore_verdict(self) -> dict[str, Any]:
        """{"live": True|False|None, "reason": str|None, "snapshot": name|None}."""
        try:
            pod = await self.own_pod()
        except BackendError as e:
            return {"live": None, "reason": str(e), "snapshot": None}
        key = workspace_key(pod)
        ns = pod["metadata"]["namespace"]
        try:
            pod = await self._await_restored_condition(pod)
            trigger = await self._snapshot_trigger(pod, ns, key[1] if key else None)
        except KubeError as e:
            return {"live": None, "reason": str(e), "snapshot": None}
        snap = ((trigger or {}).get("status") or {}).get("snapshotCreated", {}).get("name")
        expected = ((pod["metadata"].get("annotations")) or {}).get(PS_NAME_ANNOTATION) or snap
        live, why = restore_reason(pod, trigger, await self._gpu(pod),
                                   await self._pod_events(pod), expected)
        return {"live": live, "reason": why, "snapshot": snap}

    async def writes_held(self) -> str | None:
        """A pod snapshot of this pod was taken (or is under way) and the pod is stopped after
        it: our own pause with postCheckpoint: stop (its trigger neither failed nor gone), or
        GKE Workspaces' checkpoint (the Workspace's checkpoint-state annotation Checkpointing or
        Ready; gke-labs/workspaces snapshot.go AnnotationCheckpointState, reconcile.go, where
        Ready stays until the restored pod is Ready). GKE's Pod snapshot troubleshooting: writes
        to a PVC after the snapshot make the restore fail (gke-labs/pod-migration issue 15)."""
        p = self._pause
        if p.get("hold_writes") and not await self._restored_here():
            trig: dict | None = {}
            try:
                trig = await self.kube.get_or_none(TRIGGERS, p["trigger"], p["namespace"])
            except KubeError:
                pass  # unknown: the pause's own record holds
            c = condition(trig, "Triggered") if trig else None
            if trig is not None and not (c is not None and c.get("status") == "False"):
                return (f"this pod's pod snapshot (trigger {p['trigger']}) was taken with "
                        "postCheckpoint: stop, and GKE stops the pod after it")
        try:
            try:
                pod = await self.own_pod()
            except BackendError:
                # a stopped pod may be gone already; its Workspace label is all that is needed
                if self._pod_seen is None:
                    raise
                pod = self._pod_seen
            state = await checkpoint_state(self.kube, pod)
        except (BackendError, KubeError) as e:
            self.log.debug("jupyter-pause: GKE Workspaces' checkpoint-state not read: %s", e)
            return None
        if state in (CHECKPOINTING, READY):
            ws = pod["metadata"]["labels"][WORKSPACE_LABEL]
            return (f"GKE Workspaces snapshotted this pod (Workspace {ws} checkpoint-state "
                    f"{state}) and stops it after the snapshot")
        return None

    async def _pod_events(self, pod: dict) -> list[dict]:
        """Events about this very pod (best effort: reading events may not be granted)."""
        meta = pod["metadata"]
        try:
            out = await self.kube.list(EVENTS, meta["namespace"], field_selector=(
                f"involvedObject.name={meta['name']},involvedObject.uid={meta['uid']}"))
        except KubeError as e:
            self.log.debug("jupyter-pause: cannot read the pod's events: %s", e)
            return []
        return out.get("items") or []

    async def gc(self, *, keep: int | None = None, older_than: float | None = None,
                 dry_run: bool = False, protect_pinned: bool = True) -> dict[str, Any]:
        """Delete this workspace's old pod snapshots (then their triggers); the policy stays.

        `keep` Ready snapshots (default keep_snapshots) and those younger than `older_than`
        seconds are kept, and so is the one this pod was restored from (`protect_pinned`)."""
        pod = await self.own_pod()
        key = workspace_key(pod)
        if key is None:
            return {"deleted": [], "remaining": [], "stuck": []}
        pinned = (pod["metadata"].get("annotations") or {}).get(PS_NAME_ANNOTATION)
        pinned = pinned if protect_pinned else None
        return await collect_garbage(
            self.kube, pod["metadata"]["namespace"], key[1],
            keep=self.keep_snapshots if keep is None else keep, older_than=older_than,
            dry_run=dry_run, policy=self.policy_name or dns_name("jp", key[1]),
            protect={pinned} if pinned else set())

    # -- steps --
    def _stop_mode(self, pod: dict) -> str:
        if self.stop_via != "auto":
            return self.stop_via
        if has_pvc(pod):
            # GKE's Pod snapshot troubleshooting ("Post-checkpoint mutation risks with PVCs"):
            # with a PVC use postCheckpoint: stop; writes after the checkpoint make the restore
            # fail (vfs.CompleteRestore() failed, gke-labs/pod-migration issue 15).
            return "policy"
        return self._owner_mode(pod) or "policy"

    @staticmethod
    def _owner_mode(pod: dict) -> str | None:
        """How the pod's owner stops it ("workspace", "statefulset"); None for a bare pod."""
        labels = pod["metadata"].get("labels") or {}
        if labels.get(WORKSPACE_LABEL):
            return "workspace"
        owner = pod_owner(pod)
        if owner and owner[0] == "StatefulSet":
            return "statefulset"
        return None

    async def _ensure_policy(self, ns: str, workspace: str, key: tuple[str, str],
                             postcheckpoint: str) -> str:
        name = self.policy_name or dns_name("jp", workspace)
        want = {
            "selector": {"matchLabels": {key[0]: key[1]}},
            "storageConfigName": self.storage_config,
            "triggerConfig": {"type": "manual", "postCheckpoint": postcheckpoint},
        }
        if self.retention:
            want["retentionConfig"] = {"lastAccessTimeout": self.retention}
        cur = await self._k(self.kube.get_or_none(POLICIES, name, ns))
        if cur is None:
            body = {"apiVersion": f"{SNAPSHOT_GROUP}/{SNAPSHOT_VERSION}",
                    "kind": "PodSnapshotPolicy",
                    "metadata": {"name": name, "labels": {WORKSPACE_SELECTOR_LABEL: workspace}},
                    "spec": want}
            try:
                await self.kube.create(POLICIES, body, ns)
            except KubeError as e:
                if e.status != 409:  # created concurrently: fine, checked below next time
                    await self._k(_raise(e))
            return name
        spec = cur.get("spec") or {}
        tc = spec.get("triggerConfig") or {}
        if tc.get("type") != "manual" or (spec.get("selector") or {}).get("matchLabels") != \
                want["selector"]["matchLabels"]:
            raise BackendError(
                f"PodSnapshotPolicy {name} exists but is not a manual policy for this workspace",
                reason="policy_mismatch",
                hint="delete it or set c.GKEBackend.policy_name to another name")
        if postcheckpoint == "stop" and tc.get("postCheckpoint", "resume") != "stop":
            # "resume" is the CRD's default; with a PVC the restore would then fail.
            raise BackendError(
                f"PodSnapshotPolicy {name} resumes the pod after the snapshot, but the pod mounts "
                "a PersistentVolumeClaim: writes after the snapshot make its restore fail",
                reason="policy_mismatch",
                hint="set spec.triggerConfig.postCheckpoint: stop in the policy (GKE's rule for "
                "pods with a PVC)")
        return name

    async def _create_trigger(self, ctx: PauseContext, ns: str, pod: dict, workspace: str) -> dict:
        pname = pod["metadata"]["name"]
        gpu = await self._gpu(pod)
        # A trigger for this pod that is still running (a double click, a retried flight, the
        # GKE Workspaces add-on): join it rather than snapshot the pod twice.
        running = await self._k(self.kube.list(
            TRIGGERS, ns, label_selector=f"{WORKSPACE_SELECTOR_LABEL}={workspace}"))
        for t in running.get("items") or []:
            if (t.get("spec") or {}).get("targetPod") == pname and condition(t, "Triggered") is None \
                    and not t["metadata"].get("deletionTimestamp"):
                return t
        for _ in range(3):
            body = {
                "apiVersion": f"{SNAPSHOT_GROUP}/{SNAPSHOT_VERSION}",
                "kind": "PodSnapshotManualTrigger",
                "metadata": {
                    "name": trigger_name(workspace),
                    "labels": {WORKSPACE_SELECTOR_LABEL: workspace},
                    "annotations": {
                        SPEC_HASH_ANNOTATION: distilled_spec_hash(pod),
                        **({GPU_MODEL_ANNOTATION: gpu} if gpu else {}),
                        **({FLIGHT_ANNOTATION: ctx.flight_id} if getattr(ctx, "flight_id", None)
                           else {}),
                    },
                },
                "spec": {"targetPod": pname},
            }
            try:
                return await self.kube.create(TRIGGERS, body, ns)
            except KubeError as e:
                if e.status != 409:
                    await self._k(_raise(e))
                existing = await self._k(self.kube.get_or_none(TRIGGERS, body["metadata"]["name"],
                                                               ns))
                if existing and (existing.get("spec") or {}).get("targetPod") == pname and \
                        condition(existing, "Triggered") is None:
                    return existing
        raise BackendError("could not create a PodSnapshotManualTrigger (name taken)",
                           reason="trigger_conflict")

    async def _wait_trigger(self, ctx: PauseContext, ns: str, name: str) -> str:
        def done(t: dict | None) -> Any:
            if t is None:
                return ("deleted", None)
            c = condition(t, "Triggered")
            if c is None:
                return None
            if c.get("status") == "True":
                snap = ((t.get("status") or {}).get("snapshotCreated") or {}).get("name")
                return ("ok", snap) if snap else None
            if c.get("reason") in ("Failed", "Error") or c.get("status") == "False":
                return ("failed", f"{c.get('reason') or 'Failed'}: {c.get('message') or ''}")
            return None

        try:
            kind, detail = await self.kube.wait_for(TRIGGERS, name, ns, done,
                                                    timeout=self.trigger_timeout)
        except TimeoutError:
            # A long capture ends right at the deadline, or the watch missed its last event:
            # look once more before giving up.
            again = await self._relist(TRIGGERS, name, ns, done)
            if not again:
                raise BackendError(f"pod snapshot not triggered within "
                                   f"{self.trigger_timeout:.0f} s (trigger {name})",
                                   reason="snapshot_timeout",
                                   hint="check the policy's storage config and the GKE snapshot "
                                   "agent; the checkpoint is the way back") from None
            kind, detail = again
        except KubeError as e:
            await self._k(_raise(e))
        if kind == "deleted":
            raise BackendError(f"trigger {name} was deleted before the snapshot was taken",
                               reason="snapshot_failed")
        if kind == "failed":
            raise BackendError(f"pod snapshot failed: {detail.rstrip(': ')}",
                               reason="snapshot_failed",
                               hint="the application checkpoint is still the way back")
        return detail

    async def _wait_snapshot(self, ctx: PauseContext, ns: str, name: str) -> None:
        ctx.progress(f"Waiting for pod snapshot {name} to be stored")

        def done(s: dict | None) -> Any:
            if s is None:
                return ("deleted", "")
            if is_true(s, "Ready"):
                return ("ok", "")
            for ctype in ("Checkpoint", "Ready"):
                c = condition(s, ctype)
                if c and c.get("reason") in ("Failed", "Error"):
                    return ("failed", c.get("message") or c.get("reason"))
            return None

        def seen(s: dict | None) -> None:
            c = condition(s, "Ready")
            if c and c.get("reason"):
                ctx.progress(f"Pod snapshot {name}: {c['reason']}")

        try:
            kind, detail = await self.kube.wait_for(SNAPSHOTS, name, ns, done, on_change=seen,
                                                    timeout=self.snapshot_timeout)
        except TimeoutError:
            again = await self._relist(SNAPSHOTS, name, ns, done)
            if not again:
                raise BackendError(f"pod snapshot {name} not Ready after "
                                   f"{self.snapshot_timeout:.0f} s", reason="snapshot_timeout",
                                   hint="the application checkpoint is still the way back"
                                   ) from None
            kind, detail = again
        except KubeError as e:
            await self._k(_raise(e))
        if kind == "deleted":
            raise BackendError(f"pod snapshot {name} was deleted before it was Ready",
                               reason="snapshot_failed")
        if kind == "failed":
            raise BackendError(f"pod snapshot {name} failed: {detail}", reason="snapshot_failed",
                               hint="the application checkpoint is still the way back")

    async def _restored_here(self) -> bool:
        """True when this process runs in a pod restored from the snapshot, not the paused one."""
        p = self._pause
        if not p.get("uid"):
            return False
        if p.get("woke_up"):
            return True
        if socket.gethostname() != p["hostname"]:
            p["woke_up"] = True
            return True
        try:
            cur = await self.kube.get_or_none(PODS, p["pod"], p["namespace"])
        except KubeError:
            return False
        # A new pod carries our name (StatefulSet) or ours says PodRestored: we are the restored
        # copy. A pod that reads as gone was deleted under us: that is not a restore.
        if cur is not None and (cur["metadata"].get("uid") != p["uid"]
                                or is_true(cur, "PodRestored")):
            p["woke_up"] = True
            return True
        return False

    def _woke_result(self, trigger: str, snap: str | None = None) -> dict[str, Any]:
        self._pause["woke_up"] = True
        return {"snapshot": snap, "trigger": trigger, "backend": self.name, "woke_up": True,
                "reason": "this pod was restored from the pod snapshot during the pause"}

    async def _relist(self, res: Any, name: str, ns: str, done: Any) -> Any:
        """One fresh read after a wait timed out: done(obj) or None."""
        try:
            return done(await self.kube.get_or_none(res, name, ns))
        except KubeError:
            return None

    async def _discard(self, ns: str, trigger: str) -> None:
        """After a failed snapshot: delete its PodSnapshots, then the trigger (best effort).

        A snapshot that is Ready is never deleted (it completed after all; gc() handles it).
        The trigger goes only once its snapshots are gone: a finalizer can hold a snapshot for
        minutes, and the trigger is how `jupyter pause snapshots` and gc() find it again."""
        try:
            snaps = await snapshots_of(self.kube, ns, trigger)
            ready = [s["metadata"]["name"] for s in snaps if is_true(s, "Ready")]
            for s in snaps:
                if s["metadata"]["name"] not in ready:
                    await self.kube.delete(SNAPSHOTS, s["metadata"]["name"], ns)
            if ready:
                self.log.warning("jupyter-pause: pod snapshot %s completed after the pause gave "
                                 "up on it; kept (jupyter pause gc removes it)", ", ".join(ready))
                return
            left = await wait_snapshots_gone(self.kube, ns, trigger, self.discard_wait)
            if left:
                self.log.warning("jupyter-pause: pod snapshot %s still deleting after %.0f s; "
                                 "trigger %s kept so that it stays listed", ", ".join(left),
                                 self.discard_wait, trigger)
                return
            await self.kube.delete(TRIGGERS, trigger, ns)
        except KubeError as e:
            self.log.warning("jupyter-pause: could not clean up trigger %s: %s", trigger, e)

    async def _await_restored_condition(self, pod: dict) -> dict:
        """PodRestored can come some seconds after the container started: wait for it a little
        while a restore is expected (ps-name set) and the container is young."""
        if condition(pod, "PodRestored") is not None:
            return pod
        expected = PS_NAME_ANNOTATION in ((pod["metadata"].get("annotations")) or {})
        start = (pod.get("status") or {}).get("startTime")
        if not expected or not start or self.restored_condition_wait <= 0:
            return pod
        started = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        left = self.restored_condition_wait - (datetime.now(timezone.utc) - started).total_seconds()
        if left <= 0:
            return pod
        try:
            return await self.kube.wait_for(
                PODS, pod["metadata"]["name"], pod["metadata"]["namespace"],
                lambda p: p if p and condition(p, "PodRestored") is not None else None,
                timeout=left)
        except TimeoutError:
            return pod

    async def _snapshot_trigger(self, pod: dict, ns: str, workspace: str | None) -> dict | None:
        """The trigger whose snapshot this pod was (to be) restored from."""
        snap = ((pod["metadata"].get("annotations")) or {}).get(PS_NAME_ANNOTATION)
        if snap:
            s = await self.kube.get_or_none(SNAPSHOTS, snap, ns)
            tname = (((s or {}).get("metadata") or {}).get("labels") or {}).get(TRIGGERED_BY_LABEL)
            if tname:
                return await self.kube.get_or_none(TRIGGERS, tname, ns)
        if workspace is None:
            return None
        items = (await self.kube.list(TRIGGERS, ns, label_selector=(
            f"{WORKSPACE_SELECTOR_LABEL}={workspace}"))).get("items") or []
        done = [t for t in items if is_true(t, "Triggered")]
        done.sort(key=lambda t: t["metadata"].get("creationTimestamp") or "", reverse=True)
        return done[0] if done else None


async def _raise(e: Exception) -> Any:
    raise e


def _unreachable(e: Exception) -> str:
    text = str(e)
    return text if text.startswith("no Kubernetes access") else f"cannot reach the cluster: {text}"
