"""GKE Pod Snapshots (`podsnapshot.gke.io/v1`) as the backends drive them.

The workspace's manual PodSnapshotPolicy, a PodSnapshotManualTrigger for the own pod, the waits
for Triggered=True/Complete (or False/Failed|Error) and for the PodSnapshot to be Ready, the
discard of a failed snapshot, and which trigger a restored pod came from. `PodSnapshots` is the
component the gke backend pauses with and both cluster backends verify a restore with.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from .base import BackendError, PauseContext
from .cleanup import snapshots_of, wait_gone
from .kube import (
    FLIGHT_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    POLICIES,
    PS_NAME_ANNOTATION,
    SNAPSHOTS,
    SPEC_HASH_ANNOTATION,
    TRIGGERED_BY_LABEL,
    TRIGGERS,
    WORKSPACE_SELECTOR_LABEL,
    KubeError,
    Res,
    condition,
    is_true,
)
from .pod import OwnPod, backend_error, checked, distilled_spec_hash

WAY_BACK = "the application checkpoint is still the way back"


def dns_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label from parts, cut to `limit` characters (names of triggers, policies)."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(p for p in parts if p).lower()).strip("-")
    return name[:limit].rstrip("-") or "x"


def default_policy_name(workspace: str) -> str:
    """The policy the gke backend keeps for a workspace: `jp-<workspace>`."""
    return dns_name("jp", workspace)


def trigger_name(workspace: str) -> str:
    """`jp-<workspace>-<YYYYmmdd-HHMMSS>-<8hex>`: unique, sortable and within 63 characters."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{dns_name('jp', workspace, limit=38)}-{stamp}-{secrets.token_hex(4)}"


def _workspace_selector(workspace: str) -> str:
    return f"{WORKSPACE_SELECTOR_LABEL}={workspace}"


def _trigger_done(name: str) -> Callable[[dict | None], Any]:
    def done(t: dict | None) -> Any:
        if t is None:
            return ("deleted", f"trigger {name} was deleted before the snapshot was taken")
        c = condition(t, "Triggered")
        if c is None:
            return None
        if c.get("status") == "True":
            snap = ((t.get("status") or {}).get("snapshotCreated") or {}).get("name")
            return ("ok", snap) if snap else None
        if c.get("reason") in ("Failed", "Error") or c.get("status") == "False":
            detail = f"{c.get('reason') or 'Failed'}: {c.get('message') or ''}"
            return ("failed", f"pod snapshot failed: {detail.rstrip(': ')}")
        return None

    return done


def _snapshot_done(name: str) -> Callable[[dict | None], Any]:
    def done(s: dict | None) -> Any:
        if s is None:
            return ("deleted", f"pod snapshot {name} was deleted before it was Ready")
        if is_true(s, "Ready"):
            return ("ok", name)
        for ctype in ("Checkpoint", "Ready"):
            c = condition(s, ctype)
            if c and c.get("reason") in ("Failed", "Error"):
                detail = c.get("message") or c.get("reason")
                return ("failed", f"pod snapshot {name} failed: {detail}")
        return None

    return done


def trigger_failure(trigger: dict) -> str | None:
    """GKE's reason a PodSnapshotManualTrigger failed, or None while it has not."""
    out = _trigger_done(trigger["metadata"]["name"])(trigger)
    return out[1] if out and out[0] == "failed" else None


def snapshot_failure(name: str, snapshot: dict) -> str | None:
    """GKE's reason a PodSnapshot failed, or None while it has not."""
    out = _snapshot_done(name)(snapshot)
    return out[1] if out and out[0] == "failed" else None


class PodSnapshots:
    """The pod snapshots of the own pod's workspace: policy, trigger, waits, discard, lookup."""

    def __init__(self, pod: OwnPod) -> None:
        self.pod = pod

    async def ensure_policy(self, ns: str, key: tuple[str, str], *, name: str,
                            storage_config: str, retention: str, postcheckpoint: str) -> str:
        """Create the workspace's manual policy selecting `key`, or check the one there."""
        kube = self.pod.kube
        want: dict[str, Any] = {
            "selector": {"matchLabels": {key[0]: key[1]}},
            "storageConfigName": storage_config,
            "triggerConfig": {"type": "manual", "postCheckpoint": postcheckpoint},
        }
        if retention:
            want["retentionConfig"] = {"lastAccessTimeout": retention}
        cur = await checked(kube.get_or_none(POLICIES, name, ns))
        if cur is None:
            body = POLICIES.manifest(name, labels={WORKSPACE_SELECTOR_LABEL: key[1]}, spec=want)
            try:
                await kube.create(POLICIES, body, ns)
            except KubeError as e:
                if e.status != 409:  # created concurrently: fine, checked below next time
                    raise backend_error(e) from None
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

    async def create_trigger(self, ctx: PauseContext, ns: str, pod: dict, workspace: str) -> dict:
        """A trigger for the pod, recording what a restore is checked against; a trigger for
        it that is still running (a double click, a retried flight, the GKE Workspaces add-on)
        is joined rather than snapshotting the pod twice."""
        kube = self.pod.kube
        pname = pod["metadata"]["name"]
        gpu = await self.pod.gpu(pod)
        running = await checked(kube.list(TRIGGERS, ns, label_selector=_workspace_selector(
            workspace)))
        for t in running.get("items") or []:
            if (t.get("spec") or {}).get("targetPod") == pname and condition(t, "Triggered") is None \
                    and not t["metadata"].get("deletionTimestamp"):
                return t
        for _ in range(3):
            body = TRIGGERS.manifest(
                trigger_name(workspace), labels={WORKSPACE_SELECTOR_LABEL: workspace},
                annotations={SPEC_HASH_ANNOTATION: distilled_spec_hash(pod),
                             **({GPU_MODEL_ANNOTATION: gpu} if gpu else {}),
                             **({FLIGHT_ANNOTATION: ctx.flight_id} if ctx.flight_id else {})},
                spec={"targetPod": pname})
            try:
                return await kube.create(TRIGGERS, body, ns)
            except KubeError as e:
                if e.status != 409:
                    raise backend_error(e) from None
                existing = await checked(kube.get_or_none(TRIGGERS, body["metadata"]["name"], ns))
                if existing and (existing.get("spec") or {}).get("targetPod") == pname and \
                        condition(existing, "Triggered") is None:
                    return existing
        raise BackendError("could not create a PodSnapshotManualTrigger (name taken)",
                           reason="trigger_conflict")

    async def wait_trigger(self, ns: str, name: str, timeout: float) -> str:
        """The name of the PodSnapshot the trigger created."""
        return await self._wait(TRIGGERS, name, ns, _trigger_done(name), timeout=timeout,
                                timed_out=BackendError(
                                    f"pod snapshot not triggered within {timeout:.0f} s "
                                    f"(trigger {name})", reason="snapshot_timeout",
                                    hint="check the policy's storage config and the GKE snapshot "
                                    "agent; the checkpoint is the way back"))

    async def wait_snapshot(self, ctx: PauseContext, ns: str, name: str, timeout: float) -> None:
        ctx.progress(f"Waiting for pod snapshot {name} to be stored")

        def seen(s: dict | None) -> None:
            c = condition(s, "Ready")
            if c and c.get("reason"):
                ctx.progress(f"Pod snapshot {name}: {c['reason']}")

        await self._wait(SNAPSHOTS, name, ns, _snapshot_done(name), timeout=timeout,
                         on_change=seen, timed_out=BackendError(
                             f"pod snapshot {name} not Ready after {timeout:.0f} s",
                             reason="snapshot_timeout", hint=WAY_BACK))

    async def _wait(self, res: Res, name: str, ns: str, done: Callable[[dict | None], Any], *,
                    timeout: float, timed_out: BackendError,
                    on_change: Callable[[dict | None], None] | None = None) -> Any:
        """Follow the object until `done` says ("ok", value) and return value; "deleted" and
        "failed" (with their message) fail the snapshot."""
        kube = self.pod.kube
        try:
            kind, detail = await kube.wait_for(res, name, ns, done, on_change=on_change,
                                               timeout=timeout)
        except TimeoutError:
            # A long capture ends right at the deadline, or the watch missed its last event:
            # look once more before giving up.
            try:
                again = done(await kube.get_or_none(res, name, ns))
            except KubeError:
                again = None
            if not again:
                raise timed_out from None
            kind, detail = again
        except KubeError as e:
            raise backend_error(e) from None
        if kind == "ok":
            return detail
        raise BackendError(detail, reason="snapshot_failed",
                           hint=WAY_BACK if kind == "failed" else None)

    async def discard(self, ns: str, trigger: str, wait: float) -> None:
        """After a failed snapshot: delete its PodSnapshots, then the trigger (best effort).

        A snapshot that is Ready is never deleted (it completed after all; gc() handles it).
        The trigger goes only once its snapshots are gone: a finalizer can hold a snapshot for
        minutes, and the trigger is how `jupyter pause snapshots` and gc() find it again."""
        kube, log = self.pod.kube, self.pod.settings.log
        try:
            snaps = await snapshots_of(kube, ns, trigger)
            ready = [s["metadata"]["name"] for s in snaps if is_true(s, "Ready")]
            for s in snaps:
                if s["metadata"]["name"] not in ready:
                    await kube.delete(SNAPSHOTS, s["metadata"]["name"], ns)
            if ready:
                log.warning("jupyter-pause: pod snapshot %s completed after the pause gave up "
                            "on it; kept (jupyter pause gc removes it)", ", ".join(ready))
                return
            left = await wait_gone(kube, ns, trigger, wait)
            if left:
                log.warning("jupyter-pause: pod snapshot %s still deleting after %.0f s; "
                            "trigger %s kept so that it stays listed", ", ".join(left), wait,
                            trigger)
                return
            await kube.delete(TRIGGERS, trigger, ns)
        except KubeError as e:
            log.warning("jupyter-pause: could not clean up trigger %s: %s", trigger, e)

    async def trigger_of(self, pod: dict, ns: str, workspace: str | None) -> dict | None:
        """The trigger whose snapshot this pod was (to be) restored from: the one behind its
        ps-name, else the workspace's newest completed one."""
        kube = self.pod.kube
        snap = ((pod["metadata"].get("annotations")) or {}).get(PS_NAME_ANNOTATION)
        if snap:
            s = await kube.get_or_none(SNAPSHOTS, snap, ns)
            tname = (((s or {}).get("metadata") or {}).get("labels") or {}).get(TRIGGERED_BY_LABEL)
            if tname:
                return await kube.get_or_none(TRIGGERS, tname, ns)
        if workspace is None:
            return None
        items = (await kube.list(TRIGGERS, ns, label_selector=_workspace_selector(workspace))
                 ).get("items") or []
        done = [t for t in items if is_true(t, "Triggered")]
        done.sort(key=lambda t: t["metadata"].get("creationTimestamp") or "", reverse=True)
        return done[0] if done else None

    async def holds_writes(self) -> str | None:
        """Why the pause's own trigger forbids writes now: it was made with postCheckpoint: stop
        and neither failed (Triggered=False, the agent-sandbox client's rule) nor is gone."""
        p = self.pod.paused_as
        if not p.get("hold_writes") or await self.pod.restored_here():
            return None
        trig: dict | None = {}
        try:
            trig = await self.pod.kube.get_or_none(TRIGGERS, p["trigger"], p["namespace"])
        except KubeError:
            pass  # unknown: the pause's own record holds
        c = condition(trig, "Triggered") if trig else None
        if trig is not None and not (c is not None and c.get("status") == "False"):
            return (f"this pod's pod snapshot (trigger {p['trigger']}) was taken with "
                    "postCheckpoint: stop, and GKE stops the pod after it")
        return None
