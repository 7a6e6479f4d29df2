"""Clients of our own for a server's kernels, and asking whether a kernel answers.

Shared by ``server`` and ``cluster`` (both run in the Jupyter server, and neither imports the
other's internals). Why a session of its own: ``kernel_manager.client()`` hands every client the
manager's session, whose id is also the ZMQ identity of the client's shell socket; with two such
clients open, the kernel's replies go to whichever socket connected last and the other one waits
forever.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from queue import Empty
from typing import Any

# Every client of ours has a session id with this prefix, so that jupyter_server's activity
# watch can tell our requests' IOPub messages from the person's (jupyter_seams.keep_own_out).
OWN_SESSION_PREFIX = "jupyter-pause-"
# ... and the IOPub topics our readers subscribe to, to learn that their subscription is live
SUBSCRIPTION_PREFIX = "jupyter_pause."

# How often an unanswered kernel_info_request is sent again: one sent to a process that has
# since died (a restart on the same ports) is never answered.
RESEND_EVERY = 1.0


def client_of(kernel_manager: Any) -> Any:
    """A client of one kernel (its ``KernelManager``) with a session of its own."""
    session = kernel_manager.session.clone()
    session.session = OWN_SESSION_PREFIX + uuid.uuid4().hex  # also resets bsession (identity)
    return kernel_manager.client(session=session)


def msg_type(msg: dict[str, Any]) -> str:
    """A message's type, from the message or its header."""
    return msg.get("msg_type") or (msg.get("header") or {}).get("msg_type", "")


def parent_id(msg: dict[str, Any]) -> str | None:
    """The ``msg_id`` of the request a message answers."""
    return (msg.get("parent_header") or {}).get("msg_id")


async def kernel_info_answer(kernel_manager: Any, timeout: float, *,
                             gone: Callable[[], str | None] | None = None) -> str:
    """An empty string once the kernel answers a ``kernel_info_request``; else why not.

    A kernel_info request is not counted as activity by jupyter_server, so asking changes no
    idle clock. ``gone`` is asked before every (re)send and ends the wait with its reason (the
    kernel was removed, or restarted under us).
    """
    client = client_of(kernel_manager)
    client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    asked: set[str] = set()  # a late answer to an earlier ask is an answer all the same
    try:
        while (left := deadline - loop.time()) > 0:
            if gone is not None and (why := gone()):
                return why
            asked.add(client.kernel_info())
            resend = loop.time() + min(RESEND_EVERY, left)
            while (wait := resend - loop.time()) > 0:
                try:
                    reply = await client.get_shell_msg(timeout=wait)
                except Empty:
                    break
                if parent_id(reply) in asked:
                    return ""
        return f"did not answer within {timeout:.0f} s"
    finally:
        client.stop_channels()
