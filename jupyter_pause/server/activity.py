"""The person's activity in the kernels, as jupyter_server records it, and our calls kept out of it.

jupyter_server counts every IOPub message of an ``execute_request`` (silent or not) as kernel
activity: it moves ``kernel.last_activity`` and ``kernel_manager.last_kernel_activity``, which feed
``GET /api/status``'s ``last_activity`` (what Kubeflow's ``activityProbe`` and the Notebooks v1
culler read) and JupyterHub's activity. A checkpoint, restore or liveness probe run by this
extension is not the person's activity. :func:`not_activity` (every bridge call runs inside it,
:func:`.bridge.call`) makes sure jupyter_server's activity watch leaves the timestamps as they
were for each message of ours as it reads it (:func:`.jupyter_seams.keep_own_out`: our clients'
session ids say which), however late it reads them. Where that watch cannot be wrapped, it puts
them back after the call instead, unless the person ran a cell meanwhile (an ``execute_input``
broadcast, which silent bridge calls never produce; :func:`.jupyter_seams.put_back_activity`).
jupyter_server has no way to leave a request uncounted: both are seams.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from ..kernelclient import msg_type
from .iopub import watch_iopub
from .jupyter_seams import keep_own_out, put_back_activity


def _kernel(km: Any, kernel_id: str) -> Any | None:
    # jupyter_server's get_kernel raises a 404 for a kernel that is gone
    return km.get_kernel(kernel_id) if kernel_id in km else None


async def _settle(kernel: Any, timeout: float) -> None:
    """Wait for the trailing ``status: idle`` of our request (it moves last_activity too)."""
    deadline = time.monotonic() + timeout
    # jupyter_server sets a plain attribute: there is no event to wait on
    while getattr(kernel, "execution_state", "idle") == "busy" and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def not_activity(serverapp: Any, kernel_id: str, *, settle: float = 2.0
                       ) -> AsyncIterator[None]:
    """What the block makes the kernel do does not count as the person's activity."""
    km = serverapp.kernel_manager
    kernel = _kernel(km, kernel_id)
    if kernel is None:
        yield
        return
    if keep_own_out(km, kernel):
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
            # a client of its own, never the manager's session: see iopub.client_of
            await stack.enter_async_context(watch_iopub(kernel, on_msg))
        except Exception:  # noqa: BLE001 - no iopub watch: keep whatever happened
            user_ran.set()
        try:
            yield
        finally:
            await _settle(kernel, settle)  # the IOPub watch stays open until our idle is in
            if not user_ran.is_set():
                put_back_activity(km, kernel_id, kernel, before_kernel, before_km)


async def wait_first_execute(serverapp: Any, kernel_id: str, timeout: float) -> bool:
    """True when the kernel broadcasts a person's execute_input (silent bridge calls never do)."""
    km = serverapp.kernel_manager
    if kernel_id not in km:
        return False
    seen = asyncio.Event()

    def on_msg(msg: dict[str, Any]) -> None:
        if msg_type(msg) == "execute_input":
            seen.set()

    deadline = time.monotonic() + timeout
    # No handshake: this runs outside not_activity, and its welcome would look like activity.
    async with watch_iopub(km.get_kernel(kernel_id), on_msg, handshake=False):
        while not seen.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or kernel_id not in km:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(seen.wait(), min(1.0, left))
        return True


def kernel_activity(serverapp: Any) -> dict[str, Any]:
    """The kernels' activity now: how many, how many busy, connections, last activity."""
    km = serverapp.kernel_manager
    ids = list(km.list_kernel_ids())
    busy = 0
    for kid in ids:
        kernel = _kernel(km, kid)
        busy += kernel is not None and getattr(kernel, "execution_state", None) == "busy"
    # jupyter_server keeps the open websocket count per kernel only in this mapping
    connections = sum(getattr(km, "_kernel_connections", {}).get(k, 0) for k in ids)
    return {"kernels": len(ids), "busy_kernels": busy, "connections": connections,
            "last": getattr(km, "last_kernel_activity", None)}
