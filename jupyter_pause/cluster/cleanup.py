"""Clean-up of pod snapshots, triggers and the policy, in the only safe order.

GKE's finalizer finds a snapshot's files by following PodSnapshot -> policy -> storage config, so
deleting the policy first orphans the stored files silently. Order: the PodSnapshots of a trigger
(label `gke-pod-snapshot-triggered-by=<trigger>`), wait until they are really gone (a finalizer can
hold them for minutes), then the trigger; the policy only when nothing of the workspace is left.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any

from .kube import (
    POLICIES,
    SNAPSHOTS,
    TRIGGERED_BY_LABEL,
    TRIGGERS,
    WORKSPACE_SELECTOR_LABEL,
    Kube,
    KubeError,
    is_true,
)


def _age_s(obj: dict) -> float:
    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not ts:
        return 0.0
    created = datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
    return (datetime.now(timezone.utc) - created).total_seconds()


async def snapshots_of(kube: Kube, ns: str, trigger: str) -> list[dict]:
    out = await kube.list(SNAPSHOTS, ns, label_selector=f"{TRIGGERED_BY_LABEL}={trigger}")
    return out.get("items") or []


async def collect_garbage(kube: Kube, ns: str, workspace: str, *, keep: int,
                          older_than: float | None = None, dry_run: bool = False,
                          policy: str | None = None, protect: set[str] | None = None,
                          delete_wait: float = 300.0, teardown: bool = False,
                          every_ready: bool = False) -> dict[str, Any]:
    """Delete this workspace's old pod snapshots and their triggers.

    Keeps the `keep` newest triggers that produced a Ready snapshot (`keep=0`: no count limit,
    as for checkpoints), and any trigger younger than `older_than` seconds; `protect` names
    snapshots never to touch (the one a pod runs from). `every_ready` drops the count rule
    (single-use snapshots once used); `teardown` implies it and deletes the policy last once
    nothing is left. Returns what was deleted, what is left, and what is stuck deleting (a
    finalizer that did not finish within `delete_wait`).
    """
    protect = protect or set()
    by_count = not (every_ready or teardown)
    triggers = (await kube.list(TRIGGERS, ns, label_selector=(
        f"{WORKSPACE_SELECTOR_LABEL}={workspace}"))).get("items") or []
    triggers.sort(key=lambda t: t["metadata"].get("creationTimestamp") or "", reverse=True)
    plan: list[tuple[dict, list[dict]]] = []
    kept_ready = 0
    remaining: list[str] = []
    for t in triggers:
        snaps = await snapshots_of(kube, ns, t["metadata"]["name"])
        ready = any(is_true(s, "Ready") for s in snaps)
        pinned = any(s["metadata"]["name"] in protect for s in snaps)
        young = older_than is not None and _age_s(t) < older_than
        running = not t.get("status", {}).get("conditions") and _age_s(t) < 3600
        if pinned or young or running or (
                ready and by_count and (keep == 0 or kept_ready < keep)):
            kept_ready += 1 if ready else 0
            remaining += [t["metadata"]["name"]] + [s["metadata"]["name"] for s in snaps]
            continue
        plan.append((t, snaps))
    deleted: list[str] = []
    stuck: list[str] = []
    if dry_run:
        return {"deleted": [], "would_delete": [n for t, ss in plan for n in
                                                [s["metadata"]["name"] for s in ss]
                                                + [t["metadata"]["name"]]],
                "remaining": remaining, "stuck": [], "dry_run": True}
    for t, snaps in plan:
        tname = t["metadata"]["name"]
        for s in snaps:
            await kube.delete(SNAPSHOTS, s["metadata"]["name"], ns)
        left = await wait_gone(kube, ns, tname, delete_wait)
        if left:
            # Keep the trigger while its snapshots still exist: it is how they are found again.
            stuck += left
            remaining += [*left, tname]
            continue
        deleted += [s["metadata"]["name"] for s in snaps]
        await kube.delete(TRIGGERS, tname, ns)
        deleted.append(tname)
    if teardown and policy and not remaining:
        try:
            if await kube.delete(POLICIES, policy, ns) is not None:
                deleted.append(policy)
        except KubeError as e:
            stuck.append(f"{policy} ({e})")
    elif policy:
        remaining.append(policy)
    return {"deleted": deleted, "remaining": remaining, "stuck": stuck}


async def wait_gone(kube: Kube, ns: str, trigger: str, timeout: float) -> list[str]:
    """Names of the trigger's snapshots still present after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        left = [s["metadata"]["name"] for s in await snapshots_of(kube, ns, trigger)]
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 5.0)
