"""Asking a real kernel whether it answers (``kernelclient.kernel_info_answer``), as the server
does after a restart and the local backend does for a kernel it started."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

import pytest
from jupyter_client.manager import AsyncKernelManager

from jupyter_pause.kernelclient import kernel_info_answer

pytestmark = pytest.mark.timeout(120)


@contextlib.asynccontextmanager
async def kernel() -> AsyncIterator[AsyncKernelManager]:
    manager = AsyncKernelManager(kernel_name="python3")
    await manager.start_kernel()
    try:
        yield manager
    finally:
        pid = manager.provisioner.pid if manager.provisioner else None
        if pid:  # a stopped kernel cannot shut down until it runs again
            os.kill(pid, signal.SIGCONT)
        await manager.shutdown_kernel(now=True)


async def test_a_live_kernel_answers() -> None:
    async with kernel() as km:
        assert await kernel_info_answer(km, 60) == ""


async def test_the_callers_reason_ends_the_wait() -> None:
    async with kernel() as km:
        asked = []

        def gone() -> str | None:
            asked.append(1)
            return "removed" if len(asked) > 1 else None

        os.kill(km.provisioner.pid, signal.SIGSTOP)  # asked, but it cannot answer
        assert await kernel_info_answer(km, 60, gone=gone) == "removed"
        assert len(asked) == 2  # asked once, then again a second later: ended by the reason


async def test_a_silent_kernel_is_reported_after_the_deadline() -> None:
    async with kernel() as km:
        os.kill(km.provisioner.pid, signal.SIGSTOP)
        assert await kernel_info_answer(km, 3) == "did not answer within 3 s"


async def test_a_kernel_that_answers_late_is_heard() -> None:
    """A kernel that cannot answer for several asks is heard once it runs again."""
    async with kernel() as km:
        pid = km.provisioner.pid
        os.kill(pid, signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        loop.call_later(2.5, os.kill, pid, signal.SIGCONT)
        assert await kernel_info_answer(km, 60) == ""


def test_no_client_of_ours_starts_a_heartbeat_channel() -> None:
    """Every ``start_channels`` call in the package, its tests, benches and examples passes
    ``hb=False``. jupyter_client's ``HBChannel`` (8.x, ``channels.py``) sets ``_running = True``
    when its thread first runs: a ``stop_channels`` that comes before that (a client started
    and stopped at once, as a quick request does on a busy machine) is undone, and the thread
    loops without waiting, making a new REQ socket (linger 1 s) each turn until the context
    has no slot left (``ZMQError: Too many open files``, about 2,000 descriptors in the
    process meanwhile; the caller's event loop is blocked in ``join`` all that time). The
    kernel's liveness is asked by other means (``kernelclient.kernel_info_answer``, the
    process, ``bridge.heartbeat``)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for folder in ("jupyter_pause", "tests", "bench", "examples"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == "start_channels":
                    found.append((path, node))
                    hb = [k.value for k in node.keywords if k.arg == "hb"]
                    assert hb and isinstance(hb[0], ast.Constant) and hb[0].value is False, \
                        f"{path.relative_to(root)}:{node.lineno}: start_channels without hb=False"
    assert len(found) > 10  # the scan sees the calls it is meant to check
