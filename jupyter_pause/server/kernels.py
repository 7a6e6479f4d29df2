"""Driving the server's kernels: who runs, which notebook each serves, and bridge calls into them.

The bridge calls themselves (client, send, reply, IOPub) are :mod:`jupyter_pause.server.bridge`;
``call``, ``own_client``, ``wait_first_execute`` and ``BridgeError`` are re-exported here for the
existing callers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from jupyter_core.utils import ensure_async

from ..cluster.base import KernelRecord
from .bridge import BridgeError, call, own_client, wait_first_execute

__all__ = ["BridgeError", "call", "execution_state", "interrupt", "own_client",
           "running_kernels", "wait_first_execute", "wait_idle"]


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
