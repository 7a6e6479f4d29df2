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
