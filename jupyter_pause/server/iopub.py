"""Reading a kernel's IOPub on a client of our own (``kernelclient.client_of``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from queue import Empty
from typing import Any

import zmq

from ..kernelclient import SUBSCRIPTION_PREFIX, client_of

log = logging.getLogger(__name__)

# How long to wait for the IOPub subscription to be confirmed before sending (ipykernel >= 7).
SUBSCRIBE_WAIT = 0.5


class IOPubReader:
    """Reads one client's IOPub in a task of its own: the only reader of that socket."""

    def __init__(self, client: Any, on_msg: Callable[[dict[str, Any]], None], *,
                 handshake: bool = True) -> None:
        self.client = client
        self.on_msg = on_msg
        self.subscribed = asyncio.Event()  # any message at all proves the subscription is live
        # The kernel's XPUB (ipykernel >= 7) reports only a topic's FIRST subscriber, and the
        # server's own IOPub stream already subscribed to everything (b""): our b"" brings no
        # welcome. A topic of our own does, to us alone, and comes after our b"" on the same
        # connection, so its welcome proves that b"" is active too. (jupyter_server counts a
        # welcome as kernel activity: only for calls inside not_activity, see watch_iopub.)
        if handshake:
            topic = f"{SUBSCRIPTION_PREFIX}{uuid.uuid4().hex}".encode()
            with contextlib.suppress(Exception):
                client.iopub_channel.socket.setsockopt(zmq.SUBSCRIBE, topic)
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        channel = self.client.iopub_channel
        while True:
            try:
                msg = await channel.get_msg(timeout=1.0)
            except Empty:
                continue
            except Exception:  # a closed socket, or a message we cannot read (consumed)
                if channel.socket is None:
                    return
                log.debug("jupyter_pause: unreadable IOPub message", exc_info=True)
                continue
            self.subscribed.set()
            try:
                self.on_msg(msg)
            except Exception:
                log.debug("jupyter_pause: IOPub hook failed", exc_info=True)

    async def wait_subscribed(self, timeout: float) -> bool:
        """True once the subscription is known to be live (False after ``timeout``)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.subscribed.wait(), timeout)
        return self.subscribed.is_set()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task


@contextlib.asynccontextmanager
async def watch_iopub(kernel: Any, on_msg: Callable[[dict[str, Any]], None], *,
                      handshake: bool = True) -> AsyncIterator[None]:
    """Call ``on_msg`` for every IOPub message of ``kernel`` (a ``KernelManager``) meanwhile.

    A client of its own (:func:`client_of`), IOPub only. With ``handshake`` it waits (bounded)
    for the subscription to be confirmed before the block runs, so what the block does is seen;
    the kernel's welcome then counts as activity for jupyter_server, so handshake only where
    :func:`~jupyter_pause.server.activity.not_activity` puts the timestamps back.
    """
    client = client_of(kernel)
    client.start_channels(shell=False, iopub=True, stdin=False, hb=False, control=False)
    reader = None
    try:
        reader = IOPubReader(client, on_msg, handshake=handshake)
        if handshake:
            await reader.wait_subscribed(SUBSCRIBE_WAIT)
        yield
    finally:
        if reader is not None:
            await reader.stop()
        with contextlib.suppress(Exception):
            client.stop_channels()
