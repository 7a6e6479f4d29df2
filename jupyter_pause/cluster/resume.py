"""Resume a paused workspace from outside its pod (the CLI, a portal, a controller).

`resume_workspace()` sets the workspace running again (Kubeflow Workspace `spec.paused=false`,
StatefulSet replicas 1, after deleting the Completed pod a pause took out of it, or a Completed
bare pod re-created with `podsnapshot.gke.io/ps-name`) and follows the pod: waiting for
capacity (with the scheduler's reason) -> scheduled -> running -> restored live or cold-started.
The notebook server in the pod then verifies the kernels and restores from the checkpoint by
itself when the live state did not come back.

Only one resume acts at a time: it holds a lease annotation on the workspace object, taken with a
resourceVersion precondition, so a concurrent resume gets 409 Conflict, sees the lease and joins
(follows the same pod) instead of starting a second restore.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from .kube import (
    GKW_LAST_CHECKPOINT_ANNOTATION,
    GKW_STATE_ANNOTATION,
    LEASE_ANNOTATION,
    PODS,
    PS_NAME_ANNOTATION,
    SNAPSHOTS,
    STATEFULSETS,
    TRIGGERS,
    WORKSPACE_LABEL,
    WORKSPACE_SELECTOR_LABEL,
    WORKSPACES,
    Kube,
    KubeError,
    Res,
    condition,
    is_true,
)
from .pod import workspace_key
from .statefulset import detached_from
from .workspaces import opt_in_patch

FINAL_STATES = {"restored_live", "cold_started", "started", "failed"}
# Waiting states a person should see the reason of; none of them ends the resume by itself.
WAITING_STATES = {"gated", "waiting_for_capacity", "image_pull_failing", "config_error"}


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{time.monotonic_ns() % 10**9}"


async def locate(kube: Kube, ns: str, workspace: str) -> tuple[str, Res, dict]:
    """("workspace" | "statefulset" | "pod", resource, object) for the name, in that order."""
    for kind, res in (("workspace", WORKSPACES), ("statefulset", STATEFULSETS), ("pod", PODS)):
        try:
            obj = await kube.get_or_none(res, workspace, ns)
        except KubeError as e:
            if e.status in (403, 404) and kind == "workspace":  # Kubeflow not installed / allowed
                continue
            raise
        if obj is not None:
            return kind, res, obj
    raise KubeError(f"no Workspace, StatefulSet or Pod named {workspace!r} in namespace {ns}", 404)


async def acquire_lease(kube: Kube, res: Res, ns: str, name: str, holder: str,
                        ttl: float) -> tuple[bool, str | None]:
    """(True, None) when we hold the lease; (False, other holder) when another resume does."""
    for _ in range(10):
        obj = await kube.get(res, name, ns)
        ann = obj["metadata"].get("annotations") or {}
        try:
            cur = json.loads(ann[LEASE_ANNOTATION]) if LEASE_ANNOTATION in ann else None
        except ValueError:
            cur = None
        if cur and cur.get("holder") != holder and float(cur.get("expires", 0)) > time.time():
            return False, cur.get("holder")
        lease = json.dumps({"holder": holder, "expires": round(time.time() + ttl, 3)})
        try:
            await kube.patch(res, name, {"metadata": {
                "resourceVersion": obj["metadata"]["resourceVersion"],
                "annotations": {LEASE_ANNOTATION: lease}}}, ns)
            return True, None
        except KubeError as e:
            if e.status != 409:  # 409: someone changed it meanwhile; look again
                raise
    raise KubeError(f"could not take the resume lease on {name} (too many conflicts)", 409)


async def release_lease(kube: Kube, res: Res, ns: str, name: str, holder: str) -> None:
    for _ in range(5):  # a 409 means the controller wrote the object meanwhile: read again
        try:
            obj = await kube.get_or_none(res, name, ns)
            ann = ((obj or {}).get("metadata") or {}).get("annotations") or {}
            if obj and holder in (ann.get(LEASE_ANNOTATION) or ""):
                await kube.patch(res, name, {"metadata": {
                    "resourceVersion": obj["metadata"]["resourceVersion"],
                    "annotations": {LEASE_ANNOTATION: None}}}, ns)
            return
        except KubeError as e:
            if e.status != 409:
                return  # it expires by itself


async def latest_ready_snapshot(kube: Kube, ns: str, workspace: str) -> str | None:
    triggers = (await kube.list(TRIGGERS, ns, label_selector=(
        f"{WORKSPACE_SELECTOR_LABEL}={workspace}"))).get("items") or []
    triggers.sort(key=lambda t: t["metadata"].get("creationTimestamp") or "", reverse=True)
    for t in triggers:
        name = ((t.get("status") or {}).get("snapshotCreated") or {}).get("name")
        if name:
            snap = await kube.get_or_none(SNAPSHOTS, name, ns)
            if snap and is_true(snap, "Ready") and not snap["metadata"].get("deletionTimestamp"):
                return name
    return None


# Reasons the kubelet puts in `containerStatuses[].state.waiting.reason` (Kubernetes
# pkg/kubelet/container/sync_result.go and pkg/kubelet/images/types.go). A restore that crashes
# (gke-labs/pod-migration issue 15: "OCI runtime restore failed ... vfs.CompleteRestore() failed",
# then a permanent CrashLoopBackOff) shows up as the first group.
START_FAILURES = ("CrashLoopBackOff", "RunContainerError", "CreateContainerError",
                  "PreStartHookError", "PostStartHookError")
IMAGE_FAILURES = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull",
                  "RegistryUnavailable", "SignatureValidationFailed")
CONFIG_FAILURES = ("CreateContainerConfigError",)
# `lastState.terminated.reason` of a container the runtime could not start (containerd's CRI).
START_ERROR = "StartError"


def container_trouble(pod: dict) -> tuple[str, str] | None:
    """("crashed" | "image" | "config", detail) from the kubelet's container statuses, or None."""
    st = pod.get("status") or {}
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        last = (cs.get("lastState") or {}).get("terminated") or {}
        reason = waiting.get("reason") or ""
        # The message of the failed start is on lastState.terminated (the runtime's error);
        # waiting.message only says "back-off 10s restarting failed container".
        detail = last.get("message") or waiting.get("message") or ""
        text = f"{cs.get('name', 'container')}: {reason}" + (f": {detail}" if detail else "")
        if reason in START_FAILURES:
            return "crashed", text
        if reason in IMAGE_FAILURES:
            return "image", text
        if reason in CONFIG_FAILURES:
            return "config", text
        if last.get("reason") == START_ERROR and not (cs.get("state") or {}).get("running"):
            return "crashed", f"{cs.get('name', 'container')}: {START_ERROR}: {detail}"
    return None


def pod_state(pod: dict | None) -> tuple[str, str | None]:
    """What the pod is doing, as (state, reason)."""
    if pod is None:
        return "starting", "waiting for the pod to be created"
    meta, st = pod["metadata"], pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "stopping", "the previous pod is terminating"
    sched = condition(pod, "PodScheduled")
    gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
    # Pod scheduling readiness (KEP-3521): the scheduler reports PodScheduled=False with reason
    # SchedulingGated (core/v1 PodReasonSchedulingGated) until every gate is removed.
    if gates or (sched and sched.get("status") == "False"
                 and sched.get("reason") == "SchedulingGated"):
        return "gated", (f"scheduling gates not yet removed: {', '.join(g for g in gates if g)}"
                         if gates else (sched or {}).get("message") or "scheduling gated")
    if sched and sched.get("status") == "False" and sched.get("reason") == "Unschedulable":
        return "waiting_for_capacity", sched.get("message") or "no node with free capacity"
    phase = st.get("phase")
    if phase == "Failed":
        return "failed", st.get("message") or st.get("reason") or "the pod failed"
    trouble = container_trouble(pod) if phase in ("Pending", "Running") else None
    if trouble is not None:
        kind, detail = trouble
        if kind == "crashed":
            return "crashing", detail
        return ("image_pull_failing" if kind == "image" else "config_error"), detail
    if phase == "Running" and is_true(pod, "Ready"):
        restored = condition(pod, "PodRestored")
        if restored is not None and restored.get("status") == "True":
            return "restored_live", restored.get("message") or None
        if restored is not None:
            detail = ": ".join(x for x in (restored.get("reason"), restored.get("message")) if x)
            return "cold_started", f"pod restore failed ({detail})"
        return "running", None
    if (pod.get("spec") or {}).get("nodeName"):
        return "scheduled", (pod.get("spec") or {}).get("nodeName")
    return "pending", None


async def _restore_expected(kube: Kube, ns: str, pod: dict) -> bool:
    """Is GKE supposed to restore this pod: ps-name pinned, or a Ready snapshot of it exists?"""
    if PS_NAME_ANNOTATION in (pod["metadata"].get("annotations") or {}):
        return True
    key = workspace_key(pod)
    try:
        return bool(key and await latest_ready_snapshot(kube, ns, key[1]))
    except KubeError:
        return False


async def _find_pod(kube: Kube, kind: str, ns: str, name: str, obj: dict) -> dict | None:
    if kind == "workspace":
        items = (await kube.list(PODS, ns, label_selector=f"{WORKSPACE_LABEL}={name}")
                 ).get("items") or []
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        return (live or items or [None])[0]
    pod_name = f"{name}-0" if kind == "statefulset" else name
    return await kube.get_or_none(PODS, pod_name, ns)


async def _restoring_snapshot(kube: Kube, ns: str, pod: dict) -> str | None:
    """The snapshot GKE restores this pod from: its ps-name, else the workspace's newest."""
    pinned = (pod["metadata"].get("annotations") or {}).get(PS_NAME_ANNOTATION)
    if pinned:
        return pinned
    key = workspace_key(pod)
    return await latest_ready_snapshot(kube, ns, key[1]) if key else None


async def _cold_restart(kube: Kube, kind: str, ns: str, name: str, pod: dict,
                        say: Callable[[str, str | None], None], *, discard_wait: float) -> None:
    """Delete the snapshot the crashing pod restores from (GKE would pick it again), then the
    pod; a bare pod is re-created without ps-name, an owned one comes back through its owner."""
    snap = await _restoring_snapshot(kube, ns, pod)
    if snap:
        await kube.delete(SNAPSHOTS, snap, ns)
        deadline = time.monotonic() + discard_wait
        delay = 0.1
        # The finalizer removes the stored files first; a snapshot that still exists (even
        # deleting) may still be chosen for the restore, so wait for it to be gone.
        while await kube.get_or_none(SNAPSHOTS, snap, ns) is not None:
            if time.monotonic() >= deadline:
                say("restore_crashed", f"pod snapshot {snap} is still being deleted after "
                    f"{discard_wait:.0f} s; starting the pod anyway")
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
    if kind == "workspace":
        await _unpin_workspace(kube, ns, name)
    pod_name = pod["metadata"]["name"]
    if kind == "pod":
        await _recreate(kube, ns, pod, None, "crashing")
    else:
        await kube.delete(PODS, pod_name, ns, uid=pod["metadata"]["uid"])
    say("resuming", f"pod {pod_name} re-created without the pod snapshot"
        + (f" ({snap} deleted)" if snap else "") + "; it starts cold")


async def _unpin_workspace(kube: Kube, ns: str, name: str) -> None:
    """GKE Workspaces' pod webhook pins every new pod of the Workspace to its
    last-checkpoint-name (ps-name, webhook.go mutatePod), and the add-on clears that annotation
    only once a pod is Ready (reconcile.go reconcileActive): the pod that replaces a crashing
    restore would be pinned to the snapshot just deleted. Clear it before the pod goes."""
    obj = await kube.get_or_none(WORKSPACES, name, ns)
    if GKW_LAST_CHECKPOINT_ANNOTATION in ((obj or {}).get("metadata", {}).get("annotations")
                                          or {}):
        await kube.patch(WORKSPACES, name, {"metadata": {"annotations": {
            GKW_LAST_CHECKPOINT_ANNOTATION: None}}}, ns)


async def _expired_pin(kube: Kube, ns: str, obj: dict) -> str | None:
    """The Workspace's last-checkpoint-name when the PodSnapshot it names is gone or being
    deleted, else None.
    GKE Workspaces' pod webhook copies that name onto every new pod of the Workspace (ps-name)
    without checking that the snapshot exists (webhook.go mutatePod), and its policy lets GKE
    delete a snapshot unused for seven days (retentionConfig lastAccessTimeout: 7d,
    reconcile.go). A snapshot that cannot be read (no permission) counts as there."""
    last = ((obj.get("metadata") or {}).get("annotations") or {}).get(
        GKW_LAST_CHECKPOINT_ANNOTATION)
    if not last:
        return None
    try:
        snap = await kube.get_or_none(SNAPSHOTS, last, ns)
    except KubeError:
        return None
    return last if snap is None or snap["metadata"].get("deletionTimestamp") else None


async def _recreate(kube: Kube, ns: str, pod: dict, snap: str | None, what: str) -> None:
    """Delete exactly this bare pod (uid precondition, never a pod another resume made) and
    create it again, restoring from `snap` when given (ps-name), else cold."""
    meta = pod["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k not in (PS_NAME_ANNOTATION, LEASE_ANNOTATION)}
    if snap:
        annotations[PS_NAME_ANNOTATION] = snap
    body = PODS.manifest(meta["name"], labels=meta.get("labels") or {}, annotations=annotations,
                         spec={k: v for k, v in pod["spec"].items() if k != "nodeName"})
    await kube.delete(PODS, meta["name"], ns, uid=meta["uid"])
    deadline = time.monotonic() + 120
    while await kube.get_or_none(PODS, meta["name"], ns) is not None:
        if time.monotonic() > deadline:
            raise KubeError(f"the {what} pod {meta['name']} is not going away", 0)
        await asyncio.sleep(0.2)
    await kube.create(PODS, body, ns)


async def _drop_detached_pod(kube: Kube, ns: str, name: str,
                             say: Callable[[str, str | None], None]) -> None:
    """A pause took the StatefulSet's pod out of it before GKE stopped it (statefulset.py): the
    Completed pod still holds the name `<name>-0` the StatefulSet creates its pod under, so it
    goes first (exactly that pod: uid precondition). One still running is left alone."""
    pod = await kube.get_or_none(PODS, f"{name}-0", ns)
    record = detached_from(pod)
    if pod is None or record is None or record.get("statefulset") != name:
        return
    if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
        raise KubeError(f"pod {name}-0 was taken out of StatefulSet {name} by a pause and is "
                        "still running; it is not deleted", 409)
    await kube.delete(PODS, f"{name}-0", ns, uid=pod["metadata"]["uid"])
    deadline = time.monotonic() + 120
    while await kube.get_or_none(PODS, f"{name}-0", ns) is not None:
        if time.monotonic() > deadline:
            raise KubeError(f"the stopped pod {name}-0 is not going away", 0)
        await asyncio.sleep(0.2)
    say("resuming", f"stopped pod {name}-0 deleted (its volume stays)")


async def _start(kube: Kube, kind: str, res: Res, ns: str, name: str, obj: dict,
                 say: Callable[[str, str | None], None]) -> str | None:
    """Set the workspace running; returns the snapshot pinned (bare pods) if any."""
    if kind == "workspace":
        if (obj.get("spec") or {}).get("paused"):
            # a stop opted the Workspace out of GKE Workspaces' snapshots: opt it back in
            # before its pod is created (the add-on's pod webhook acts on CREATE)
            annotations = ((opt_in_patch(obj) or {}).get("metadata") or {}).get(
                "annotations") or {}
            expired = await _expired_pin(kube, ns, obj)
            if expired:
                # the pod webhook would pin the new pod to a snapshot that is gone
                annotations = {**annotations, GKW_LAST_CHECKPOINT_ANNOTATION: None,
                               GKW_STATE_ANNOTATION: None}
                say("resuming", f"pod snapshot {expired} is gone (GKE deletes a snapshot "
                    "unused for its retention period): the pod starts cold")
            body: dict[str, Any] = {"spec": {"paused": False}}
            if annotations:
                body["metadata"] = {"annotations": annotations}
            await kube.patch(res, name, body, ns)
            say("resuming", "workspace set to running (spec.paused=false)")
        return None
    if kind == "statefulset":
        if not (obj.get("spec") or {}).get("replicas"):
            await _drop_detached_pod(kube, ns, name, say)
            await kube.patch(res, name, {"spec": {"replicas": 1}}, ns)
            say("resuming", "StatefulSet scaled to 1")
        return None
    phase = (obj.get("status") or {}).get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None  # running or starting already: follow it
    ws = (obj["metadata"].get("labels") or {}).get(WORKSPACE_SELECTOR_LABEL) or name
    snap = await latest_ready_snapshot(kube, ns, ws)
    await _recreate(kube, ns, obj, snap, "stopped")
    say("resuming", f"pod re-created from snapshot {snap}" if snap else
        "pod re-created (no Ready pod snapshot: it starts cold)")
    return snap


async def resume_workspace(kube: Kube, namespace: str, workspace: str, *,
                           on_update: Callable[[dict], None] | None = None,
                           timeout: float = 3600.0, poll: float = 1.0,
                           restored_condition_wait: float = 30.0, lease_ttl: float = 900.0,
                           holder: str | None = None,
                           discard_wait: float = 120.0) -> dict[str, Any]:
    """Bring the workspace back and follow its pod until it is restored live or cold-started.

    Returns {"state", "reason", "pod", "node", "joined", "kind"}; `state` is one of
    restored_live | cold_started | started | failed, or "timeout" when `timeout` ran out (the
    resume goes on in the cluster). A pod whose restore crashes (CrashLoopBackOff and the like)
    is recreated once without its pod snapshot: it starts cold and the server in it restores
    from the application checkpoint.
    """
    holder = holder or _holder()
    last: tuple[str, str | None] | None = None
    info: dict[str, Any] = {"pod": None, "node": None}

    def say(state: str, reason: str | None) -> None:
        nonlocal last
        if (state, reason) != last:
            last = (state, reason)
            if on_update:
                on_update({"state": state, "reason": reason, **info})

    kind, res, obj = await locate(kube, namespace, workspace)
    owned = False
    joined_holder = None
    if kind != "pod":
        owned, joined_holder = await acquire_lease(kube, res, namespace, workspace, holder,
                                                   lease_ttl)
    try:
        if kind == "pod" or owned:
            try:
                await _start(kube, kind, res, namespace, workspace,
                             await kube.get(res, workspace, namespace), say)
            except KubeError as e:
                if e.status not in (404, 409):  # 404/409: another resume re-created it first
                    raise
                joined_holder = "another resume"
        else:
            say("joined", f"another resume is in progress ({joined_holder}); following it")
        deadline = time.monotonic() + timeout
        ready_since: float | None = None
        expected: bool | None = None
        fell_back: str | None = None  # why the pod was recreated cold, once
        while True:
            pod = await _find_pod(kube, kind, namespace, workspace, obj)
            state, reason = pod_state(pod)
            info["pod"] = (pod or {}).get("metadata", {}).get("name")
            info["node"] = ((pod or {}).get("spec") or {}).get("nodeName")
            if state == "crashing" and pod is not None:
                if fell_back is None and (kind == "pod" or owned) and \
                        await _restore_expected(kube, namespace, pod):
                    # GKE has no cold-start fallback when the restore itself crashes
                    # (gke-labs/pod-migration issue 15): drop the snapshot, start cold.
                    say("restore_crashed", reason)
                    fell_back = reason or "the restore crashed"
                    await _cold_restart(kube, kind, namespace, workspace, pod, say,
                                        discard_wait=discard_wait)
                    ready_since, expected = None, False
                    await asyncio.sleep(poll)
                    continue
                state, reason = "failed", f"the pod does not start: {reason}"
            if state == "running" and fell_back is not None:
                state, reason = "cold_started", (f"the restore crashed ({fell_back}); the pod "
                                                 "was started without the pod snapshot and the "
                                                 "server restores from the checkpoint")
            if state == "running":
                # PodRestored can come a little after Ready; give it a moment when a restore
                # was asked for (ps-name) or a Ready snapshot of this workspace exists.
                if expected is None and pod is not None:  # "running" is never pod None
                    expected = await _restore_expected(kube, namespace, pod)
                ready_since = ready_since or time.monotonic()
                if not expected or time.monotonic() - ready_since >= restored_condition_wait:
                    if expected:
                        state, reason = "cold_started", ("no PodRestored condition: GKE started "
                                                         "the pod cold; the server restores "
                                                         "from the checkpoint")
                    else:
                        state, reason = "started", ("the pod started without a pod snapshot; "
                                                    "the server restores from the checkpoint")
            say(state, reason)
            if state in FINAL_STATES:
                return {"state": state, "reason": reason, **info, "kind": kind,
                        "joined": (not owned and kind != "pod") or joined_holder is not None}
            if time.monotonic() >= deadline:
                return {"state": "timeout", "reason": f"still {state}: {reason}", **info,
                        "kind": kind, "joined": not owned}
            await asyncio.sleep(poll)
    finally:
        if owned:
            await release_lease(kube, res, namespace, workspace, holder)
