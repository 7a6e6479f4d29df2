"""Driving the server's kernels: who runs, which notebook each serves, and bridge calls into them.

The bridge functions run inside each kernel through silent execution (no history, no output in the
notebook); ``jupyter_pause.kernel.client.call_bridge`` does the messaging. This module only opens a
client on the server's kernel, hands it over and closes it again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from jupyter_core.utils import ensure_async

from ..cluster.base import KernelRecord
from ..policy.activity import not_activity


class BridgeError(Exception):
    """A bridge call could not run (kernel gone, timeout); ``str()`` is one line."""


async def running_kernels(serverapp: Any) -> list[KernelRecord]:
    """Every running kernel, with the notebook session it serves (if any)."""
    km = serverapp.kernel_manager
    by_kernel: dict[str, dict] = {}
    for model in await serverapp.session_manager.list_sessions():
        kernel = model.get("kernel") or {}
        if kernel.get("id"):
            by_kernel.setdefault(kernel["id"], model)
    records = []
    for kid in list(km.list_kernel_ids()):
        kernel = km.get_kernel(kid)
        session = by_kernel.get(kid)
        path = session.get("path") if session else None
        records.append(KernelRecord(
            kernel_id=kid,
            kernel_name=kernel.kernel_name,
            path=path,
            session_id=session.get("id") if session else None,
            session_name=session.get("name") if session else None,
            session_type=session.get("type") if session else None,
            stream=_stream(serverapp, session) if session else f"kernel-{kid}",
        ))
    return records


def _stream(serverapp: Any, session: dict) -> str:
    """The checkpoint lineage of a notebook: the kernel's JPY_SESSION_NAME, computed the way
    jupyter_server computes it, so that server checkpoints and the kernel's %checkpoint,
    %restore and %resume all use the same stream."""
    try:
        env = serverapp.session_manager.get_kernel_env(session.get("path"), session.get("name"))
        return env["JPY_SESSION_NAME"]
    except Exception:  # noqa: BLE001 - fall back to the API path
        return session.get("path") or "default"


def own_client(serverapp: Any, kernel_id: str) -> Any:
    """A client of the server's kernel with a session (and so a ZMQ identity) of its own."""
    from ..kernel.client import own_client as client_of  # see why there

    return client_of(serverapp.kernel_manager.get_kernel(kernel_id))


def execution_state(serverapp: Any, kernel_id: str) -> str:
    try:
        return getattr(serverapp.kernel_manager.get_kernel(kernel_id), "execution_state", "unknown")
    except KeyError:
        return "dead"


async def wait_idle(serverapp: Any, kernel_id: str, timeout: float) -> bool:
    """True once the kernel is not busy; False if it is still busy after timeout.

    "starting" does not count as busy: jupyter_server keeps that state until a client talks to
    the kernel, and a bridge call just queues behind the kernel's start-up anyway.
    """
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        state = execution_state(serverapp, kernel_id)
        if state != "busy":
            return state != "dead"
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.1)


async def interrupt(serverapp: Any, kernel_id: str) -> None:
    await ensure_async(serverapp.kernel_manager.interrupt_kernel(kernel_id))


async def call(
    serverapp: Any,
    kernel_id: str,
    func: str,
    *,
    progress: Callable[[int, int], None] | None = None,
    timeout: float | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ``jupyter_pause.kernel.bridge.<func>(**kwargs)`` in the kernel; return its JSON dict."""
    from ..kernel.client import call_bridge  # kernel-side package; imported late on purpose

    km = serverapp.kernel_manager
    if kernel_id not in km:
        raise BridgeError(f"kernel {kernel_id[:8]} is not running")
    client = own_client(serverapp, kernel_id)
    client.start_channels()
    try:
        # Our checkpoint/restore/liveness calls are not the person's activity: without this,
        # they would keep /api/status's last_activity (Kubeflow's culler, JupyterHub) fresh.
        async with not_activity(serverapp, kernel_id):
            res = await call_bridge(client, func, progress=progress, timeout=timeout, **kwargs)
    except asyncio.TimeoutError as e:
        raise BridgeError(f"the kernel did not answer {func} within {timeout:.0f} s") from e
    finally:
        client.stop_channels()
    if res.get("timeout"):
        raise BridgeError(str(res.get("error") or f"{func} timed out"))
    return res


async def wait_first_execute(serverapp: Any, kernel_id: str, timeout: float) -> bool:
    """True when the kernel broadcasts a user's execute_input (silent bridge calls never do)."""
    km = serverapp.kernel_manager
    if kernel_id not in km:
        return False
    client = own_client(serverapp, kernel_id)
    client.start_channels(shell=False, iopub=True, stdin=False, hb=False, control=False)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if kernel_id not in km:
                return False
            try:
                msg = await client.get_iopub_msg(timeout=1.0)
            except Exception:  # noqa: BLE001, S112 - queue.Empty on timeout
                continue
            if msg.get("msg_type") == "execute_input":
                return True
        return False
    finally:
        client.stop_channels()
