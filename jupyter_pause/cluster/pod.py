"""The pod a cluster backend runs in: what its spec says, and the pod itself read through the API.

The pure functions answer questions about a pod object (its owner, its volumes, its stable
workspace label, the spec fields GKE matches a snapshot on). `OwnPod` is the component the
backends hold for the own pod: the API client, the pod's identity and GPU model, its events, and
who it was when a pause began, which is how a process restored from a pod snapshot in the middle
of a pause notices that it now runs in another pod.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
from collections.abc import Awaitable
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

from . import accelerator
from .base import BackendError
from .kube import (
    EVENTS,
    PODS,
    PS_NAME_ANNOTATION,
    WORKSPACE_LABEL,
    WORKSPACE_SELECTOR_LABEL,
    Kube,
    KubeError,
    condition,
    is_true,
    load_api_client,
    own_pod_identity,
)

STS_POD_LABEL = "statefulset.kubernetes.io/pod-name"
ACCELERATOR_SELECTOR = "cloud.google.com/gke-accelerator"
SA_TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"

T = TypeVar("T")


def backend_error(e: KubeError) -> BackendError:
    """A failed API call as a backend failure, with the RBAC hint when it was refused."""
    hint = ("apply examples/kubernetes/rbac.yaml to the notebook's service account"
            if e.status == 403 else None)
    return BackendError(str(e), reason="rbac" if e.status == 403 else "kubernetes", hint=hint)


async def checked(aw: Awaitable[T]) -> T:
    """Await a Kube call; its KubeError becomes a BackendError (`backend_error`)."""
    try:
        return await aw
    except KubeError as e:
        raise backend_error(e) from None


def unreachable(e: KubeError) -> str:
    """Why the cluster could not be asked, in one line."""
    text = str(e)
    return text if text.startswith("no Kubernetes access") else f"cannot reach the cluster: {text}"


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
    """(kind, name) of the pod's controller (or only owner), None for a bare pod."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs:
        if ref.get("controller") or len(refs) == 1:
            return ref.get("kind", ""), ref.get("name", "")
    return None


def owner_mode(pod: dict) -> str | None:
    """How the pod's owner stops it ("workspace", "statefulset"); None for a bare pod."""
    if ((pod.get("metadata") or {}).get("labels") or {}).get(WORKSPACE_LABEL):
        return "workspace"
    owner = pod_owner(pod)
    if owner and owner[0] == "StatefulSet":
        return "statefulset"
    return None


class PodSettings(Protocol):
    """The backend settings `OwnPod` reads at each use (a person or a test may change them)."""

    kubeconfig: str | None
    namespace: str | None
    pod_name: str | None
    gpu_model: str | None
    restored_condition_wait: float
    api_client: Any
    log: logging.Logger | logging.LoggerAdapter


class OwnPod:
    """The pod this server runs in, read through the API, and who it was when a pause began."""

    def __init__(self, settings: PodSettings) -> None:
        self.settings = settings
        self._kube: Kube | None = None
        self._gpu_found: str | None = None
        self.seen: dict | None = None  # the own pod as last read (it may be gone at a stop)
        # Who we were when the pause began (pod, uid, hostname, namespace, workspace, and what
        # the pause adds); {} outside a pause.
        self.paused_as: dict[str, Any] = {}

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            s = self.settings
            self._kube = Kube(s.api_client or (lambda: load_api_client(s.kubeconfig)))
        return self._kube

    def identity(self) -> tuple[str | None, str | None]:
        name, ns = own_pod_identity()
        return self.settings.pod_name or name, self.settings.namespace or ns

    async def get(self) -> dict:
        name, ns = self.identity()
        if not name or not ns:
            raise BackendError("not running in a Kubernetes pod (no POD_NAME/POD_NAMESPACE and no "
                               "service-account namespace)", reason="not_in_pod",
                               hint="set POD_NAME and POD_NAMESPACE with the downward API")
        pod = await checked(self.kube.get(PODS, name, ns))
        self.seen = pod
        return pod

    async def gpu(self, pod: dict | None) -> str | None:
        """The GPU model of this process, found once (nvidia-smi runs in a thread). A process
        only ever sees one GPU model: a live restore needs the same one."""
        if self.settings.gpu_model:
            return self.settings.gpu_model
        if self._gpu_found is None:
            self._gpu_found = (await asyncio.to_thread(detect_gpu_model, pod)) or ""
        return self._gpu_found or None

    async def events(self, pod: dict) -> list[dict]:
        """Events about this very pod (best effort: reading events may not be granted)."""
        meta = pod["metadata"]
        try:
            out = await self.kube.list(EVENTS, meta["namespace"], field_selector=(
                f"involvedObject.name={meta['name']},involvedObject.uid={meta['uid']}"))
        except KubeError as e:
            self.settings.log.debug("jupyter-pause: cannot read the pod's events: %s", e)
            return []
        return out.get("items") or []

    async def await_restored_condition(self, pod: dict) -> dict:
        """PodRestored can come some seconds after the container started: wait for it a little
        while a restore is expected (ps-name set) and the container is young."""
        if condition(pod, "PodRestored") is not None:
            return pod
        expected = PS_NAME_ANNOTATION in ((pod["metadata"].get("annotations")) or {})
        start = (pod.get("status") or {}).get("startTime")
        wait = self.settings.restored_condition_wait
        if not expected or not start or wait <= 0:
            return pod
        started = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        left = wait - (datetime.now(timezone.utc) - started).total_seconds()
        if left <= 0:
            return pod
        try:
            return await self.kube.wait_for(
                PODS, pod["metadata"]["name"], pod["metadata"]["namespace"],
                lambda p: p if p and condition(p, "PodRestored") is not None else None,
                timeout=left)
        except TimeoutError:
            return pod

    def remember(self, pod: dict, workspace: str) -> None:
        """Record who we are as a pause begins: a restore must find this very pod (uid) again,
        unless this process was restored into another one."""
        meta = pod["metadata"]
        self.paused_as = {"pod": meta["name"], "uid": meta["uid"],
                          "hostname": socket.gethostname(), "namespace": meta["namespace"],
                          "workspace": workspace}

    async def restored_here(self) -> bool:
        """True when this process runs in a pod restored from the snapshot, not the paused one."""
        p = self.paused_as
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
