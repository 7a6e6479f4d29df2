"""Was the pod restored live from this pause's pod snapshot, and if not, why not.

The pod's PodRestored condition decides (its message must name the snapshot this pause made);
without it, GKE's Warning event when it fell back to a cold start and what the pause recorded on
its trigger (the GPU model, the distilled pod-spec hash) give the reason.
"""

from __future__ import annotations

import re

from . import accelerator
from .kube import GPU_MODEL_ANNOTATION, SPEC_HASH_ANNOTATION, condition
from .pod import distilled_spec_hash


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
