"""Backends for the lifecycle tests: the local one with a platform that misbehaves."""

from __future__ import annotations

import asyncio

from jupyter_pause.cluster.base import BackendError
from jupyter_pause.cluster.local import LocalBackend
from jupyter_pause.cluster.results import ReleaseResult, RestoreVerdict, SnapshotResult


class NotConfigured(LocalBackend):
    name = "not-configured"

    async def describe(self):
        return {"name": self.name, "configured": False, "can_pause": False,
                "why_not": "no snapshot storage configured"}


class SnapshotFails(LocalBackend):
    name = "snapshot-fails"

    async def snapshot(self, ctx):
        ctx.progress("Creating the pod snapshot")
        raise BackendError("the pod snapshot failed: Triggered=False (Failed)",
                           reason="snapshot_failed", hint="The checkpoint is the way back.")


class SlowCapacity(LocalBackend):
    """Resume waits for capacity first, as a GPU node pool scaling up does."""

    name = "slow-capacity"

    async def resume(self, ctx):
        ctx.report("waiting_for_capacity", reason="0/3 nodes are available: 3 Insufficient "
                   "nvidia.com/gpu")
        await asyncio.sleep(0.5)
        await ctx.report("pod_scheduled", node="gpu-node-1")
        return await super().resume(ctx)


class WokeUp(LocalBackend):
    """A pod snapshot restored this process while it was pausing (the live case on GKE)."""

    name = "woke-up"

    async def release(self, ctx):
        return ReleaseResult(released=False, woke_up=True,
                             reason="this pod was restored from the pod snapshot")


class ColdStarted(LocalBackend):
    """The platform says the pod came back cold, and why (as the GKE backend does)."""

    name = "cold-started"
    REASON = ("pod was cold-started: snapshot for another GPU model "
              "(snapshot nvidia-l4, node nvidia-tesla-t4)")

    async def restored_live(self, ctx):
        return RestoreVerdict(live=False, reason=self.REASON)


class ReleaseFails(LocalBackend):
    """The platform cannot stop the workspace (as GKE refuses to stop a bare pod with no owner)."""

    name = "release-fails"

    async def release(self, ctx):
        raise BackendError("cannot stop this pod: it has no owner to stop it",
                           reason="no_owner", hint="Pause instead, which snapshots the pod.")


class HeldThenReleaseFails(LocalBackend):
    """The snapshot is taken and the cluster will stop the pod (GKE postCheckpoint: stop), so
    nothing may be written; then the release fails (as a timeout following the add-on can)."""

    name = "held-then-release-fails"

    async def snapshot(self, ctx):
        return SnapshotResult(snapshot="snap-1", hold_writes=True)

    async def release(self, ctx):
        raise BackendError("timed out waiting for the pod to stop", reason="timeout")


class GatedResume(LocalBackend):
    """A resume held before any kernel starts until the test opens ``gate``, as a resume
    waiting for a GPU node to come up is held."""

    name = "gated-resume"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.entered, self.gate = asyncio.Event(), asyncio.Event()

    async def resume(self, ctx):
        self.entered.set()
        await self.gate.wait()
        return await super().resume(ctx)


class OldContract(LocalBackend):
    """A backend written against the dict results of old: the server says so, in one line."""

    name = "old-contract"

    async def snapshot(self, ctx):
        return {"skipped": True}
