"""The default backend, no cluster: pause shuts the kernels down, resume starts them again.

Shutting a kernel down is what frees its GPU memory on a workstation; the checkpoint written
before is the only way back, so release() runs only after every kernel's checkpoint succeeded.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, ClassVar

from traitlets import Bool, Float, validate

from .. import configcheck as cc
from ..kernelclient import kernel_info_answer
from ..launch import provisioner as zygote
from .base import Backend, BackendError, KernelRecord, PauseContext, ResumeContext
from .results import ReleaseResult, ResumeResult, SnapshotResult


class LocalBackend(Backend):
    """No cluster: a pause checkpoints and stops the kernels, a resume restores them."""

    name = "local"

    stop_kernels = Bool(
        True,
        help="Shut the kernels down at pause. False keeps them running (the process 'comes back "
        "live' on resume, which is how the liveness check is exercised without a cluster).",
    ).tag(config=True)

    kernel_start_timeout = Float(120.0, help="Seconds to wait for a kernel to start on resume.").tag(
        config=True
    )

    config_checks: ClassVar[dict[str, cc.Check]] = {"kernel_start_timeout": cc.seconds(positive=True)}
    resume_traits = frozenset({"kernel_start_timeout"})

    @validate(*config_checks)
    def _validate_config(self, proposal: Any) -> Any:
        return self._checked(proposal)

    async def snapshot(self, ctx: PauseContext) -> SnapshotResult:
        # No process snapshot on a workstation: the application checkpoint is the way back.
        return SnapshotResult(skipped=True)

    async def release(self, ctx: PauseContext) -> ReleaseResult:
        if not self.stop_kernels:
            return ReleaseResult(released=False)
        km = ctx.kernel_manager
        stopped = []
        for rec in ctx.kernels:
            if rec.kernel_id in km:
                ctx.progress(f"Stopping the kernel of {rec.label}")
                await km.shutdown_kernel(rec.kernel_id)
                stopped.append(rec.kernel_id)
        # The zygote (fast_kernel_start) holds ipykernel, numpy and pandas in memory: with no
        # kernel left it goes too, and the resume starts it anew.
        zygote.stop_idle()
        return ReleaseResult(released=True, stopped_kernels=tuple(stopped))

    async def resume(self, ctx: ResumeContext) -> ResumeResult:
        # All kernels start together: a start is mostly the new process importing, so eight
        # notebooks take about what the cores allow, not eight times one. (Kernels on TCP may
        # still collide on a port; _start_ready replaces such a kernel. IPC has no ports.)
        async def one(rec: KernelRecord) -> str | None:
            kid = await self._kernel_for(ctx, rec)
            new = kid is None
            if kid is None:
                ctx.progress(f"Starting a kernel for {rec.label}")
                kid = await self._start_ready(ctx, rec)
            ctx.kernel_map[rec.kernel_id] = kid
            return kid if new else None

        results = await asyncio.gather(*(one(rec) for rec in ctx.kernels), return_exceptions=True)
        for r in results:  # the kernels that did start are in kernel_map (a retry reuses them)
            if isinstance(r, BaseException):
                raise r
        started = [r for r in results if isinstance(r, str)]
        ctx.other_kernels = await _other_kernels(ctx)
        for k in ctx.other_kernels:
            self.log.warning("jupyter_pause: kernel %s (%s) %s", k["kernel_id"][:8],
                             k["path"] or "no session", k["reason"])
        return ResumeResult(started_kernels=tuple(started))

    async def attach(self, ctx: ResumeContext) -> None:
        """Point each recorded session at its kernel, so JupyterLab reconnects (after restore)."""
        sm = ctx.session_manager
        for rec in ctx.kernels:
            if not rec.path or rec.kernel_id not in ctx.kernel_map:
                continue
            kid = ctx.kernel_map[rec.kernel_id]
            # The paused session itself when it is still there (at the path it was given since,
            # by a PATCH), else the notebook's session now (its kernel is in other_kernels).
            current = (await _session_by_id(sm, rec.session_id)
                       or await _session_for_path(sm, rec.path))
            if current is not None:
                changes: dict[str, Any] = {}
                if current["kernel"]["id"] != kid:
                    changes["kernel_id"] = kid
                if current.get("path") != rec.path:  # renamed by the contents API meanwhile
                    changes["path"] = rec.path
                if changes:
                    await sm.update_session(current["id"], **changes)
                continue
            sid = rec.session_id or str(uuid.uuid4())
            if await _session_exists(sm, sid):
                sid = str(uuid.uuid4())
            # The same session id lets an open JupyterLab pick the new kernel up on its next poll;
            # a reloaded page POSTs /api/sessions for the path and gets this session back.
            await sm.save_session(
                sid, path=rec.path, name=rec.session_name or rec.path,
                type=rec.session_type or "notebook", kernel_id=kid,
            )

    async def _kernel_for(self, ctx: ResumeContext, rec: KernelRecord) -> str | None:
        """The paused kernel when it is still there, or the kernel of the paused session
        (re-created by an earlier attempt of this resume). Never a kernel another session
        started for the notebook: restoring into it would merge the checkpoint over work done
        there (it is reported in ``other_kernels`` instead)."""
        km = ctx.kernel_manager
        if rec.kernel_id in km:
            return rec.kernel_id
        own = await _session_by_id(ctx.session_manager, rec.session_id)
        if own is not None and own["kernel"]["id"] in km:
            return own["kernel"]["id"]
        return None

    async def _start_ready(self, ctx: ResumeContext, rec: KernelRecord) -> str:
        """Start a kernel and wait until it answers; again with a new kernel if it died.

        A kernel dies at start when another process bound one of its ports between
        jupyter_client choosing the port and the kernel binding it (ipykernel itself binds an
        extra, OS-chosen port, so two kernels starting together can collide; jupyter_client
        #487). Its restarter then reuses the same cached ports, so every restart fails the
        same way and the kernel is finally removed. A new kernel gets new ports. With the IPC
        transport (``KernelManager.transport = "ipc"``) there are no ports to collide on.
        """
        km = ctx.kernel_manager
        why = ""
        for _ in range(3):
            kid = await asyncio.wait_for(self._start(ctx, rec), self.kernel_start_timeout)
            why = await _answers(km, kid, self.kernel_start_timeout)
            if not why:
                return kid
            self.log.warning("jupyter_pause: the kernel for %s %s; starting a new one",
                             rec.label, why)
            if kid in km:
                try:
                    await _discard(km, kid, self.kernel_start_timeout)
                except Exception as e:  # noqa: BLE001 - the resume goes on with a new kernel
                    self.log.warning(
                        "jupyter_pause: could not shut down kernel %s, which failed to start for "
                        "%s (%s); if it is still listed, shut it down from the Running panel",
                        kid[:8], rec.label, e or type(e).__name__)
        raise BackendError(f"could not start a kernel for {rec.label}: it {why}",
                           reason="kernel_start")

    async def _start(self, ctx: ResumeContext, rec: KernelRecord) -> str:
        sm = ctx.session_manager
        try:
            if rec.path:
                return await sm.start_kernel_for_session(
                    rec.session_id or str(uuid.uuid4()), rec.path,
                    rec.session_name or rec.path, rec.session_type or "notebook", rec.kernel_name,
                )
            return await ctx.kernel_manager.start_kernel(kernel_name=rec.kernel_name)
        except Exception as e:  # a missing kernelspec, a crash at start
            raise BackendError(
                f"could not start a {rec.kernel_name!r} kernel for {rec.label}: {e}",
                reason="kernel_start",
            ) from e


_stopping: set[asyncio.Future[Any]] = set()


def _stopped(f: asyncio.Future[Any]) -> None:
    _stopping.discard(f)
    if not f.cancelled():
        f.exception()  # read, so a failure after we stopped waiting is not logged as unread


async def _discard(km: Any, kid: str, timeout: float) -> None:
    """Shut down a kernel that failed to start, after any restart of its own in flight.

    jupyter_client's restarter restarts a kernel that died (``restart_kernel``: a shutdown, then
    a start, each replacing ``KernelManager.ready``). A shutdown of ours in between finds
    ``ready`` pending and raises InvalidStateError (``MultiKernelManager._async_shutdown_kernel``
    asks ``ready.exception()``), which leaves the kernel in the map and the restarted process
    running, owned by nobody. So the restarter is stopped first; its poll runs without
    suspending up to the restart's first await (a local provisioner's ``poll`` is plain
    ``Popen.poll``), so once it is stopped a done ``ready`` means no restart is in flight.
    The shutdown is never cancelled (a cancelled one leaves ``ready`` pending for good, the
    same state again): past the deadline it goes on without us.
    """
    kernel = km.get_kernel(kid)
    kernel.stop_restarter()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (ready := kernel.ready).done():  # a restart replaces it once, mid-way
        if (left := deadline - loop.time()) <= 0:
            raise TimeoutError(f"its restart did not end within {timeout:.0f} s")
        await asyncio.wait({asyncio.wrap_future(ready)}, timeout=left)
    stop = asyncio.ensure_future(km.shutdown_kernel(kid, now=True))
    _stopping.add(stop)  # the loop holds tasks weakly; one that outlives us is still read
    stop.add_done_callback(_stopped)
    await asyncio.wait({stop}, timeout=max(deadline - loop.time(), 10.0))
    if not stop.done():
        raise TimeoutError("its shutdown is still under way")
    stop.result()


def _pid(km: Any, kid: str) -> int | None:
    try:
        pid = getattr(km.get_kernel(kid).provisioner, "pid", None)
    except KeyError:
        return None
    return pid if isinstance(pid, int) else None


async def _answers(km: Any, kid: str, timeout: float) -> str:
    """An empty string once the kernel answers kernel_info; else why not (it died or was
    restarted while starting)."""
    if kid not in km:
        return "died while starting"
    first = _pid(km, kid)

    def gone() -> str | None:
        if kid not in km:
            return "died while starting"
        now = _pid(km, kid)
        if first is not None and now is not None and now != first:
            return "died while starting and was restarted on the same ports"
        return None

    return await kernel_info_answer(km.get_kernel(kid), timeout, gone=gone)


async def _session_for_path(sm: Any, path: str) -> dict | None:
    for model in await sm.list_sessions():
        if model.get("path") == path and model.get("kernel"):
            return model
    return None


async def _session_by_id(sm: Any, session_id: str | None) -> dict | None:
    if not session_id:
        return None
    for model in await sm.list_sessions():
        if model.get("id") == session_id and model.get("kernel"):
            return model
    return None


async def _other_kernels(ctx: ResumeContext) -> list[dict[str, Any]]:
    """The running kernels no paused session owned (started since, by another session, or
    outside any): left as they are, nothing restored into them, named in the report."""
    ours = set(ctx.kernel_map.values())
    resumed = {rec.path: ctx.kernel_map.get(rec.kernel_id) for rec in ctx.kernels if rec.path}
    paths = {m["kernel"]["id"]: m.get("path") for m in await ctx.session_manager.list_sessions()
             if m.get("kernel")}
    out = []
    for kid in ctx.kernel_manager.list_kernel_ids():
        if kid in ours:
            continue
        path = paths.get(kid)
        if path in resumed:
            reason = (f"started for {path} after the pause: the notebook's session now uses "
                      f"the resumed kernel {str(resumed[path])[:8]}; this kernel keeps running "
                      "with its own work and nothing was restored into it")
        else:
            reason = "not part of the pause: left as it is, nothing restored into it"
        out.append({"kernel_id": kid, "path": path, "reason": reason})
    return out


async def _session_exists(sm: Any, session_id: str) -> bool:
    try:
        await sm.get_session(session_id=session_id)
        return True
    except Exception:  # noqa: BLE001 - 404 or gone: absent either way
        return False
