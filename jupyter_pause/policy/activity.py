"""Keep our own kernel calls out of the server's activity record.

jupyter_server counts every IOPub message of an ``execute_request`` (silent or not) as kernel
activity: it moves ``kernel.last_activity`` and ``kernel_manager.last_kernel_activity``, which feed
``GET /api/status``'s ``last_activity`` (what Kubeflow's ``activityProbe`` and the Notebooks v1
culler read) and JupyterHub's activity. A checkpoint, restore or liveness probe run by this
extension is not the person's activity, so :func:`not_activity` puts those timestamps back to
what they were, unless the person ran a cell meanwhile (an ``execute_input`` broadcast, which
silent bridge calls never produce).

Usage (server side, around each bridge call)::

    async with not_activity(serverapp, kernel_id):
        result = await run_bridge(client, "checkpoint", ...)

The IOPub watch itself is :func:`jupyter_pause.server.bridge.watch_iopub` (one messaging module).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any


def _kernel(km: Any, kernel_id: str) -> Any | None:
    try:
        return km.get_kernel(kernel_id)
    except KeyError:
        return None


async def _settle(kernel: Any, timeout: float) -> None:
    """Wait for the trailing ``status: idle`` of our request (it moves last_activity too)."""
    deadline = time.monotonic() + timeout
    while getattr(kernel, "execution_state", "idle") == "busy" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def not_activity(serverapp: Any, kernel_id: str, *, settle: float = 2.0
                       ) -> AsyncIterator[None]:
    km = serverapp.kernel_manager
    kernel = _kernel(km, kernel_id)
    if kernel is None:
        yield
        return
    before_kernel = getattr(kernel, "last_activity", None)
    before_km = getattr(km, "last_kernel_activity", None)
    user_ran = asyncio.Event()

    def on_msg(msg: dict[str, Any]) -> None:
        if msg.get("msg_type") == "execute_input":
            user_ran.set()

    async with contextlib.AsyncExitStack() as stack:
        try:
            from ..server.bridge import watch_iopub  # server side; imported late on purpose

            # a client of its own, never the manager's session: see server.bridge.client_of
            await stack.enter_async_context(watch_iopub(kernel, on_msg))
        except Exception:  # noqa: BLE001 - no iopub watch: keep whatever happened
            user_ran.set()
        try:
            yield
        finally:
            await _settle(kernel, settle)  # the IOPub watch stays open until our idle is in
            if not user_ran.is_set():
                if before_kernel is not None:
                    kernel.last_activity = before_kernel
                if before_km is not None:
                    # other kernels' own activity meanwhile still counts
                    others = [getattr(_kernel(km, k), "last_activity", None)
                              for k in list(km.list_kernel_ids()) if k != kernel_id]
                    km.last_kernel_activity = max([before_km, *(t for t in others if t)])
