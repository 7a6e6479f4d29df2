"""Call the bridge the way the server does: an AsyncKernelClient of our own + bridge.run_bridge."""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_client.asynchronous import AsyncKernelClient

from jupyter_pause.server.bridge import run_bridge as call_bridge


def bridge(
    kernel: Any, func: str, progress: list | None = None, timeout: float = 30, **kwargs: Any
) -> dict:
    async def go() -> dict:
        kc = AsyncKernelClient()
        kc.load_connection_info(kernel.km.get_connection_info())
        kc.start_channels(hb=False)
        try:
            await kc.wait_for_ready(timeout=30)
            cb = (lambda d, t: progress.append((d, t))) if progress is not None else None
            return await call_bridge(kc, func, progress=cb, timeout=timeout, **kwargs)
        finally:
            kc.stop_channels()

    return asyncio.run(go())
