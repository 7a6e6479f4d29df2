"""The server's bridge into kernels: the one place that sends a bridge call and waits for it.

The protocol itself (the code string, the result in ``user_expressions``, progress lines) is
documented and parsed in :mod:`jupyter_pause.kernel.bridge` / :mod:`jupyter_pause.kernel.client`;
this module does the messaging.

Why a call ends on the shell reply, never on IOPub: every call uses a fresh client, and a ZMQ SUB
socket only receives what the kernel publishes after its subscription has reached the kernel (the
"slow joiner"). A fresh client that sends at once can miss its request's ``status: idle`` (and
early progress lines) although the kernel answered on the shell channel.
``execute_interactive`` waits for that idle before it even reads the reply, so a missed idle
cost the whole timeout. Here the ``execute_reply`` matched by its parent ``msg_id`` decides;
IOPub only feeds progress, and is drained for a short bounded grace after the reply to pick up
trailing progress lines, never required. A subscription handshake (ipykernel >= 7 sends
``iopub_welcome`` for a new subscription) closes the window in which progress and idle are lost;
it is bounded (:data:`SUBSCRIBE_WAIT`), since older kernels send nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from queue import Empty
from typing import Any

import zmq
from jupyter_core.utils import ensure_async

from ..kernel.client import (
    EXPR_NAME,
    RESULT_EXPRESSION,
    ProgressCallback,
    _LineSplitter,
    bridge_code,
    parse_reply,
)
from ..policy.activity import not_activity

log = logging.getLogger(__name__)

# Bridge functions that may run twice without harm (they only read); only these are retried.
# checkpoint / restore / recompute change state: a lost reply may still mean they ran.
IDEMPOTENT = frozenset({"liveness"})
# How long to wait for the IOPub subscription to be confirmed before sending (ipykernel >= 7).
SUBSCRIBE_WAIT = 0.5
# After the reply: how long to keep reading IOPub for our trailing output and ``status: idle``.
IOPUB_GRACE = 1.0
# How often a waiting call checks that its kernel is still the same process.
_CHECK_EVERY = 0.5


class BridgeError(Exception):
    """A bridge call could not run (kernel gone, timeout); ``str()`` is one line."""


def client_of(kernel_manager: Any) -> Any:
    """A client of one kernel (its ``KernelManager``) with a session of its own.

    ``kernel_manager.client()`` hands every client the manager's session, whose id is also the
    ZMQ identity of the client's shell socket: with two such clients open, the kernel's replies
    go to whichever socket connected last and the other one waits forever.
    """
    session = kernel_manager.session.clone()
    session.session = uuid.uuid4().hex  # also resets bsession, the socket identity
    return kernel_manager.client(session=session)


def own_client(serverapp: Any, kernel_id: str) -> Any:
    """A client of the server's kernel with a session (and so a ZMQ identity) of its own."""
    return client_of(serverapp.kernel_manager.get_kernel(kernel_id))


def _msg_type(msg: dict[str, Any]) -> str:
    return msg.get("msg_type") or (msg.get("header") or {}).get("msg_type", "")


def _parent_id(msg: dict[str, Any]) -> str | None:
    return (msg.get("parent_header") or {}).get("msg_id")


class _IOPubReader:
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
            topic = f"jupyter_pause.{uuid.uuid4().hex}".encode()
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
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.subscribed.wait(), timeout)
        return self.subscribed.is_set()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task


async def run_bridge(
    client: Any,
    func: str,
    *,
    progress: ProgressCallback | None = None,
    timeout: float | None = None,
    gone: Callable[[], str | None] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ``jupyter_pause.kernel.bridge.<func>(**kwargs)`` on a started client; its result dict.

    ``client`` is an ``AsyncKernelClient`` of our own (:func:`client_of`) with its shell and
    IOPub channels started; this call is the only reader of both while it runs. ``timeout``
    bounds the whole call (including waiting behind a busy kernel); on timeout the result is
    ``{"ok": False, "error": ..., "timeout": True}`` and the kernel may still be working on the
    request. ``gone()``, checked while waiting, returns a reason when the kernel process is no
    longer there (the result is then ``{"ok": False, "error": reason, "gone": True}``).
    Never raises for kernel-side failures: they come back as ``{"ok": False, "error": "..."}``.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    splitter = _LineSplitter(progress)
    msg_id: str | None = None
    idle = asyncio.Event()

    def on_iopub(msg: dict[str, Any]) -> None:
        if msg_id is None or _parent_id(msg) != msg_id:
            return  # another request's output, or the subscription's welcome
        kind, content = _msg_type(msg), msg.get("content") or {}
        if kind == "stream" and content.get("name") == "stdout":
            splitter.feed(content.get("text", ""))
        elif kind == "status" and content.get("execution_state") == "idle":
            idle.set()

    reader = _IOPubReader(client, on_iopub)
    try:
        subscribed = await reader.wait_subscribed(
            SUBSCRIBE_WAIT if deadline is None else min(SUBSCRIBE_WAIT, timeout or 0))
        msg_id = await ensure_async(client.execute(
            bridge_code(func, **kwargs), silent=True, store_history=False,
            user_expressions={EXPR_NAME: RESULT_EXPRESSION}, allow_stdin=False,
            stop_on_error=False))
        reply = None
        while reply is None:
            wait = _CHECK_EVERY
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return {"ok": False, "timeout": True,
                            "error": f"the kernel did not answer {func} within {timeout:g} s"}
            try:
                msg = await client.shell_channel.get_msg(timeout=wait)
            except Empty:  # nothing yet
                reason = gone() if gone is not None else None
                if reason:
                    return {"ok": False, "gone": True, "error": reason}
                continue
            if _parent_id(msg) == msg_id:
                reply = msg  # a stale reply of an earlier request on this client is skipped
        # The answer is in. Output published before the reply may still be in flight on IOPub:
        # read until our idle, briefly (long only when the subscription is known to be live).
        grace = IOPUB_GRACE if (subscribed or reader.subscribed.is_set()) else 0.2
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(idle.wait(), grace)
        return parse_reply(reply)
    finally:
        await reader.stop()
        splitter.feed("\n")
        if splitter.pending:
            await asyncio.gather(*splitter.pending, return_exceptions=True)


def _pid(serverapp: Any, kernel_id: str) -> int | None:
    """The kernel's process id (None where the provisioner does not tell)."""
    try:
        kernel = serverapp.kernel_manager.get_kernel(kernel_id)
    except KeyError:
        return None
    pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
    return pid if isinstance(pid, int) else None


async def _call_once(serverapp: Any, kernel_id: str, func: str, *, progress: Any,
                     timeout: float | None, **kwargs: Any) -> dict[str, Any]:
    km = serverapp.kernel_manager
    pid = _pid(serverapp, kernel_id)

    def gone() -> str | None:
        if kernel_id not in km:
            return f"the kernel {kernel_id[:8]} stopped during {func}"
        now = _pid(serverapp, kernel_id)
        # A new pid is only set once the new process is launched, so its ports are known: a
        # retry's new client reaches it. (A restart with new ports is what jupyter_server does
        # for a kernel that died at start-up, e.g. one of its ports was taken meanwhile.)
        if pid is not None and now is not None and now != pid:
            return f"the kernel {kernel_id[:8]} restarted during {func} (its memory is gone)"
        return None

    # Our checkpoint/restore/liveness calls are not the person's activity: without this,
    # they would keep /api/status's last_activity (Kubeflow's culler, JupyterHub) fresh.
    async with not_activity(serverapp, kernel_id):
        client = own_client(serverapp, kernel_id)
        # Shell + IOPub only: no stdin (allow_stdin=False), no heartbeat thread per call.
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        try:
            return await run_bridge(client, func, progress=progress, timeout=timeout,
                                    gone=gone, **kwargs)
        finally:
            client.stop_channels()


async def call(
    serverapp: Any,
    kernel_id: str,
    func: str,
    *,
    progress: Callable[[int, int], None] | None = None,
    timeout: float | None = None,
    retries: int = 0,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ``jupyter_pause.kernel.bridge.<func>(**kwargs)`` in a server kernel; its JSON dict.

    Each attempt uses a fresh client. ``retries`` re-sends an unanswered call on a new
    connection, only for read-only functions (:data:`IDEMPOTENT`): a checkpoint or restore whose
    reply was lost may still have run, so it is never sent twice. Raises :class:`BridgeError`
    when the kernel is not there, stops or restarts meanwhile, or no attempt got an answer.
    """
    if retries and func not in IDEMPOTENT:
        raise ValueError(f"{func} changes the kernel's state; it is never retried")
    km = serverapp.kernel_manager
    for attempt in range(retries + 1):
        if kernel_id not in km:
            raise BridgeError(f"kernel {kernel_id[:8]} is not running")
        res = await _call_once(serverapp, kernel_id, func, progress=progress, timeout=timeout,
                               **kwargs)
        if not res.get("gone") and not res.get("timeout"):
            return res
        # A kernel that jupyter_server restarted meanwhile (e.g. it died at start-up because
        # another process took one of its ports) listens on new ports: a read-only call asked
        # again on a new connection gets the new process's truth.
        if attempt == retries or (res.get("gone") and kernel_id not in km):
            break
        log.warning("jupyter_pause: kernel %s: %s (attempt %d of %d); retrying on a new "
                    "connection", kernel_id[:8], res.get("error"), attempt + 1, retries + 1)
    if res.get("gone"):
        raise BridgeError(str(res["error"]))
    tries = "" if not retries else f" ({retries + 1} attempts, each on a new connection)"
    raise BridgeError(f"the kernel did not answer {func} within {timeout or 0:.0f} s{tries}")


@contextlib.asynccontextmanager
async def watch_iopub(kernel: Any, on_msg: Callable[[dict[str, Any]], None], *,
                      handshake: bool = True) -> AsyncIterator[None]:
    """Call ``on_msg`` for every IOPub message of ``kernel`` (a ``KernelManager``) meanwhile.

    A client of its own (:func:`client_of`), IOPub only. With ``handshake`` it waits (bounded)
    for the subscription to be confirmed before the block runs, so what the block does is seen;
    the kernel's welcome then counts as activity for jupyter_server, so handshake only where
    :func:`~jupyter_pause.policy.activity.not_activity` puts the timestamps back.
    """
    client = client_of(kernel)
    client.start_channels(shell=False, iopub=True, stdin=False, hb=False, control=False)
    reader = None
    try:
        reader = _IOPubReader(client, on_msg, handshake=handshake)
        if handshake:
            await reader.wait_subscribed(SUBSCRIBE_WAIT)
        yield
    finally:
        if reader is not None:
            await reader.stop()
        with contextlib.suppress(Exception):
            client.stop_channels()


async def wait_first_execute(serverapp: Any, kernel_id: str, timeout: float) -> bool:
    """True when the kernel broadcasts a user's execute_input (silent bridge calls never do)."""
    km = serverapp.kernel_manager
    if kernel_id not in km:
        return False
    seen = asyncio.Event()

    def on_msg(msg: dict[str, Any]) -> None:
        if _msg_type(msg) == "execute_input":
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
