"""Freeing the accelerator of a StatefulSet's pod that GKE stops after its snapshot.

A pod with a PersistentVolumeClaim is snapshotted with `postCheckpoint: stop` (GKE's rule: a
write to the volume after the snapshot makes the restore fail), so GKE itself stops the pod and
this process never runs again there to scale its StatefulSet down. The StatefulSet controller
deletes and re-creates a Succeeded or Failed pod at once (kubernetes
pkg/controller/statefulset/stateful_set_control.go, `isFailed(replicas[i]) ||
isSucceeded(replicas[i])`), and GKE restores the new pod from the snapshot just taken: the
accelerator is never freed. Scaling to 0 first would delete the pod before the snapshot.

So the pause takes the pod out of its StatefulSet before the trigger: it removes the labels the
StatefulSet selects by (kept: the label the snapshot policy selects by), the controller releases
the pod (it drops its ownerReference, pkg/controller/controller_ref_manager.go ClaimPods: a pod
that no longer matches is released; the upstream docs call this "isolating" a pod), and the
StatefulSet is scaled to 0 through its `scale` subresource; its PVCs stay (scale-down keeps them,
persistentVolumeClaimRetentionPolicy whenScaled: Retain by default). GKE then stops the pod, now
bare, and nothing re-creates it. A resume deletes that Completed pod and scales the StatefulSet
back to 1 (resume.py); GKE restores the new pod. A pause that fails before the snapshot puts the
pod back: replicas first, then the labels, so the controller adopts it instead of deleting it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .base import BackendError
from .kube import PODS, STATEFULSETS, Kube, KubeError

# On the detached pod: {"statefulset": name, "labels": {...removed...}, "replicas": n}
DETACHED_ANNOTATION = "jupyter-pause.io/detached-from"
RBAC_HINT = ("grant the notebook's service account get and patch on statefulsets/scale and "
             "patch on its own pod, for these names only (the Role in "
             "examples/kubernetes/notebook-statefulset.yaml)")

# One term of a label selector's string form (apimachinery labels.Selector String()):
# "k=v", "k==v", "k in (a,b)" and "k" (exists) need the key; "!=", "notin" and "!k" do not.
_TERM = re.compile(r"([^\s=!(),]+)\s*(?:==?\s*[^\s,]*|\s+in\s+\(.*\))?")


def selector_keys(selector: str) -> list[str]:
    """The label keys whose removal takes a pod out of `selector` (a Scale's status.selector)."""
    keys = []
    for term in re.split(r",(?![^()]*\))", selector or ""):
        m = _TERM.fullmatch(term.strip())
        if m:
            keys.append(m.group(1))
    return keys


def owned_by(pod: dict, statefulset: str) -> bool:
    return any(r.get("kind") == "StatefulSet" and r.get("name") == statefulset
               for r in (pod.get("metadata") or {}).get("ownerReferences") or [])


def detached_from(pod: dict | None) -> dict[str, Any] | None:
    """The record a pause left on a pod it took out of its StatefulSet, or None."""
    raw = (((pod or {}).get("metadata") or {}).get("annotations") or {}).get(DETACHED_ANNOTATION)
    try:
        rec = json.loads(raw) if raw else None
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and rec.get("statefulset") else None


def _error(e: KubeError, what: str) -> BackendError:
    if e.status == 403:
        return BackendError(f"{what}: {e}", reason="rbac", hint=RBAC_HINT)
    return BackendError(f"{what}: {e}", reason="kubernetes")


def scale_error(e: KubeError, name: str) -> BackendError:
    """A failed scale of the own StatefulSet, with the Role that grants it when refused."""
    return _error(e, f"cannot scale StatefulSet {name}")


async def detach(kube: Kube, pod: dict, statefulset: str, keep: str | None, *,
                 timeout: float = 60.0) -> dict[str, Any]:
    """Take `pod` out of `statefulset` and scale the StatefulSet to 0; the pod keeps running.
    `keep` is the label the snapshot policy selects by. Returns the record for `reattach()`."""
    meta = pod["metadata"]
    name, ns = meta["name"], meta["namespace"]
    what = f"cannot take pod {name} out of StatefulSet {statefulset}"
    try:
        scale = await kube.get_scale(STATEFULSETS, statefulset, ns)
    except KubeError as e:
        raise _error(e, what) from None
    selector = (scale.get("status") or {}).get("selector") or ""
    labels = meta.get("labels") or {}
    drop = {k: labels[k] for k in selector_keys(selector) if k in labels and k != keep}
    if not drop:
        raise BackendError(
            f"{what}: its selector ({selector or 'none'}) has no label the pod can drop while "
            f"the snapshot policy still selects it by {keep}", reason="no_selector",
            hint="select the StatefulSet's pods by a label of their own (app: <name>), not by "
            "the workspace label the snapshot policy uses")
    record = {"statefulset": statefulset, "labels": drop,
              "replicas": (scale.get("spec") or {}).get("replicas") or 1}
    try:
        await kube.patch(PODS, name, {"metadata": {
            "labels": dict.fromkeys(drop), "annotations": {
                DETACHED_ANNOTATION: json.dumps(record, sort_keys=True)}}}, ns)
    except KubeError as e:
        raise _error(e, what) from None
    try:
        # The controller releases the pod (its ownerReference goes) before the scale-down, or
        # the scale-down would delete it.
        got = await kube.wait_for(PODS, name, ns, lambda p: (p is None and "gone") or (
            p is not None and not owned_by(p, statefulset) and "released"), timeout=timeout)
        if got == "gone":
            raise BackendError(f"{what}: the pod was deleted", reason="kubernetes")
        await kube.scale(STATEFULSETS, statefulset, ns, 0)
    except TimeoutError:
        await _relabel(kube, name, ns, record)
        raise BackendError(f"{what}: the StatefulSet controller did not release the pod in "
                           f"{timeout:.0f} s", reason="kubernetes") from None
    except KubeError as e:
        await _relabel(kube, name, ns, record)
        raise _error(e, what) from None
    return record


async def _relabel(kube: Kube, name: str, ns: str, record: dict[str, Any], *,
                   quiet: bool = True) -> None:
    """Give the pod its StatefulSet's labels back (the controller adopts it again)."""
    try:
        await kube.patch(PODS, name, {"metadata": {"labels": record["labels"], "annotations": {
            DETACHED_ANNOTATION: None}}}, ns)
    except KubeError:
        if not quiet:
            raise


async def reattach(kube: Kube, name: str, ns: str, record: dict[str, Any]) -> None:
    """Undo `detach()` for a pod still running (a pause that failed before its snapshot):
    replicas back first, then the labels, so the controller adopts the pod and keeps it."""
    try:
        await kube.scale(STATEFULSETS, record["statefulset"], ns, int(record.get("replicas") or 1))
        await _relabel(kube, name, ns, record, quiet=False)
    except KubeError as e:
        raise _error(e, f"cannot put pod {name} back into StatefulSet "
                     f"{record['statefulset']}") from None
