"""The server's bridge into its kernels: which kernels run, and the one place that sends a bridge
call and waits for it.

The protocol's code string, result and progress lines are :mod:`.protocol` (the kernel's side is
:mod:`jupyter_pause.kernel.bridge`); clients and IOPub are :mod:`.iopub`.

Why a call ends on the shell reply, never on IOPub: every call uses a fresh client, and a ZMQ SUB
socket only receives what the kernel publishes after its subscription has reached the kernel (the
"slow joiner"). A fresh client that sends at once can miss its request's ``status: idle`` (and
early progress lines) although the kernel answered on the shell channel.
``execute_interactive`` waits for that idle before it even reads the reply, so a missed idle
cost the whole timeout. Here the ``execute_reply`` matched by its parent ``msg_id`` decides;
IOPub only feeds progress, and is drained for a short bounded grace after the reply to pick up
trailing progress lines, never required. A subscription handshake (ipykernel >= 7 sends
``iopub_welcome`` for a new subscription) closes the window in which progress and idle are lost;
it is bounded (:data:`.iopub.SUBSCRIBE_WAIT`), since older kernels send nothing.

While a call waits, it checks that its kernel is still the process it was sent to: a kernel
whose process ended, or that jupyter_server restarted empty, can never answer, so the call ends
at once (:class:`KernelDied`) instead of waiting out its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from queue import Empty
from typing import Any

from jupyter_core.utils import ensure_async

from ..cluster.base import KernelRecord
from ..kernelclient import client_of, msg_type, parent_id
from . import kernelside
from .activity import not_activity
from .bridgeresults import CheckpointResult, LivenessResult, RestoreResult
from .iopub import SUBSCRIBE_WAIT, IOPubReader
from .protocol import (
    PROBE,
    LineSplitter,
    ProgressCallback,
    bridge_code,
    parse_reply,
    parse_side,
    user_expressions,
)

log = logging.getLogger(__name__)

# Bridge functions that may run twice without harm (they only read); only these are retried.
# checkpoint / restore / recompute change state: a lost reply may still mean they ran.
IDEMPOTENT = frozenset({"liveness", PROBE})
# After the reply: how long to keep reading IOPub for our trailing output and ``status: idle``.
IOPUB_GRACE = 1.0
# How often a waiting call checks that its kernel is still the same process.
_CHECK_EVERY = 0.5
# How long one heartbeat of a silent kernel may take to come back.
HEARTBEAT_WAIT = 5.0


class BridgeError(Exception):
    """A bridge call could not run (kernel gone, timeout); ``str()`` is one line."""


class KernelStalled(BridgeError):
    """The kernel made no progress and answered no heartbeat for ``silent_s`` seconds (a
    stopped or frozen process): it may still be there, with its memory, but cannot answer."""

    def __init__(self, message: str, silent_s: float):
        super().__init__(message)
        self.silent_s = silent_s


class KernelDied(BridgeError):
    """The kernel's process ended (or a restart replaced it) while a call ran; ``why`` says how."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


def own_client(serverapp: Any, kernel_id: str) -> Any:
    """A client of the server's kernel with a session (and so a ZMQ identity) of its own."""
    return client_of(serverapp.kernel_manager.get_kernel(kernel_id))


async def run_bridge(
    client: Any,
    func: str,
    *,
    progress: ProgressCallback | None = None,
    timeout: float | None = None,
    gone: Callable[[], Awaitable[str | None]] | None = None,
    stalled: Callable[[], Awaitable[str | None]] | None = None,
    python: str | None = None,
    on_side: Callable[[dict[str, Any]], None] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ``jupyter_pause.kernel.bridge.<func>(**kwargs)`` on a started client; its result dict.

    ``client`` is an ``AsyncKernelClient`` of our own (:func:`.iopub.client_of`) with its shell
    and IOPub channels started; this call is the only reader of both while it runs. ``timeout``
    bounds the whole call (including waiting behind a busy kernel); on timeout the result is
    ``{"ok": False, "error": ..., "timeout": True}`` and the kernel may still be working on the
    request. ``await gone()``, checked while waiting, returns a reason when the kernel process
    is no longer there (the result is then ``{"ok": False, "error": reason, "gone": True}``);
    ``await stalled()`` likewise when it makes no progress at all (``"stalled": True``).
    Never raises for kernel-side failures: they come back as ``{"ok": False, "error": "..."}``;
    a kernel without the package, or with another protocol, as ``"error_kind": "kernel_side"``
    with the command that fixes it (``python``: the interpreter it names where the kernel did
    not say). ``on_side(side)`` gets what the reply says the kernel side is
    (:func:`.protocol.parse_side`).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    splitter = LineSplitter(progress)
    msg_id: str | None = None
    idle = asyncio.Event()

    def on_iopub(msg: dict[str, Any]) -> None:
        if msg_id is None or parent_id(msg) != msg_id:
            return  # another request's output, or the subscription's welcome
        kind, content = msg_type(msg), msg.get("content") or {}
        if kind == "stream" and content.get("name") == "stdout":
            splitter.feed(content.get("text", ""))
        elif kind == "status" and content.get("execution_state") == "idle":
            idle.set()

    reader = IOPubReader(client, on_iopub)
    try:
        subscribed = await reader.wait_subscribed(
            SUBSCRIBE_WAIT if deadline is None else min(SUBSCRIBE_WAIT, timeout or 0))
        msg_id = await ensure_async(client.execute(
            bridge_code(func, **kwargs), silent=True, store_history=False,
            user_expressions=user_expressions(func), allow_stdin=False,
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
                reason = await gone() if gone is not None else None
                if reason:
                    return {"ok": False, "gone": True, "error": reason}
                reason = await stalled() if stalled is not None else None
                if reason:
                    return {"ok": False, "stalled": True, "error": reason}
                continue
            if parent_id(msg) == msg_id:
                reply = msg  # a stale reply of an earlier request on this client is skipped
        # The answer is in. Output published before the reply may still be in flight on IOPub:
        # read until our idle, briefly (long only when the subscription is known to be live).
        grace = IOPUB_GRACE if (subscribed or reader.subscribed.is_set()) else 0.2
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(idle.wait(), grace)
        side = parse_side(reply)
        if side is not None and on_side is not None:
            on_side(side)
        return parse_reply(reply, python, func)
    finally:
        await reader.stop()
        splitter.feed("\n")
        if splitter.pending:
            await asyncio.gather(*splitter.pending, return_exceptions=True)


# ---------------------------------------------------------------------- is it still there


def _kernel(serverapp: Any, kernel_id: str) -> Any | None:
    """The kernel's manager, None once it is gone (jupyter_server's get_kernel raises 404)."""
    km = serverapp.kernel_manager
    return km.get_kernel(kernel_id) if kernel_id in km else None


def kernel_pid(serverapp: Any, kernel_id: str) -> int | None:
    """The kernel's process id (None where it is gone or the provisioner does not tell)."""
    kernel = _kernel(serverapp, kernel_id)
    pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
    return pid if isinstance(pid, int) else None


async def why_gone(serverapp: Any, kernel_id: str, pid: int | None, *,
                   strict: bool = True) -> str | None:
    """Why the kernel that ran as ``pid`` can no longer answer, or None while it can.

    Without ``strict`` only a kernel shut down or already restarted counts: a new pid is set
    once the new process is launched, so its ports are known and a retry's new client reaches
    it (a restart with new ports is what jupyter_server does for a kernel that died at
    start-up, e.g. one of its ports was taken meanwhile). ``strict`` also counts a process that
    ended and is not replaced yet.
    """
    kernel = _kernel(serverapp, kernel_id)
    if kernel is None:
        return "the kernel was shut down"
    now = kernel_pid(serverapp, kernel_id)
    if pid is not None and now is not None and now != pid:
        return "its process ended and jupyter_server restarted it empty"
    if not strict:
        return None
    if getattr(kernel, "execution_state", None) in ("dead", "restarting"):
        return "its process ended"
    try:
        alive = await ensure_async(kernel.is_alive())
    except Exception:  # noqa: BLE001 - a provisioner that cannot tell: assume alive
        alive = True
    return None if alive else "its process ended"


async def heartbeat(serverapp: Any, kernel_id: str, timeout: float) -> bool:
    """True when the kernel's heartbeat answers within ``timeout``. ipykernel echoes it from a
    thread of its own, even while the main thread is busy in one long step (a big variable
    being pickled): only a stopped or frozen process leaves it unanswered."""
    import zmq
    import zmq.asyncio

    kernel = _kernel(serverapp, kernel_id)
    if kernel is None:
        return False
    info = kernel.get_connection_info()
    sep = ":" if info.get("transport", "tcp") == "tcp" else "-"
    sock = zmq.asyncio.Context.instance().socket(zmq.REQ)
    sock.linger = 0
    try:
        sock.connect(f"{info.get('transport', 'tcp')}://{info['ip']}{sep}{info['hb_port']}")
        await sock.send(b"ping")
        return bool(await sock.poll(max(0.1, timeout) * 1000))
    finally:
        sock.close()


# ---------------------------------------------------------------------- calls


async def _call_once(serverapp: Any, kernel_id: str, func: str, pid: int | None, *,
                     strict: bool, progress: Any, timeout: float | None,
                     silence: float | None = None, **kwargs: Any) -> dict[str, Any]:
    heard = time.monotonic()  # the last sign of life: a progress line or a heartbeat

    def on_progress(*args: Any) -> None:
        nonlocal heard
        heard = time.monotonic()
        if progress is not None:
            progress(*args)

    async def stalled() -> str | None:
        nonlocal heard
        if not silence or time.monotonic() - heard < silence:
            return None
        if await heartbeat(serverapp, kernel_id, min(silence, HEARTBEAT_WAIT)):
            heard = time.monotonic()  # alive, in one long step: wait on
            return None
        return (f"the kernel {kernel_id[:8]} made no progress for {silence:g} s and does not "
                "answer its heartbeat (its process is stopped or frozen)")

    async def gone() -> str | None:
        try:
            why = await why_gone(serverapp, kernel_id, pid, strict=strict)
        except Exception:  # noqa: BLE001 - a check that cannot tell must not fail the call
            return None
        return f"the kernel {kernel_id[:8]} stopped during {func} ({why})" if why else None

    # Our checkpoint/restore/liveness calls are not the person's activity: without this,
    # they would keep /api/status's last_activity (Kubeflow's culler, JupyterHub) fresh.
    kernel = serverapp.kernel_manager.get_kernel(kernel_id)

    def on_side(side: dict[str, Any]) -> None:
        kernelside.record(kernel, pid, side)

    async with not_activity(serverapp, kernel_id):
        client = own_client(serverapp, kernel_id)
        # Shell + IOPub only: no stdin (allow_stdin=False), no heartbeat thread per call.
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        try:
            return await run_bridge(client, func, progress=on_progress, timeout=timeout,
                                    gone=gone, stalled=stalled if silence else None,
                                    python=kernelside.spec_python(kernel), on_side=on_side,
                                    **kwargs)
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
    silence: float | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ``jupyter_pause.kernel.bridge.<func>(**kwargs)`` in a server kernel; its JSON dict.

    Each attempt uses a fresh client. ``retries`` re-sends an unanswered call on a new
    connection, only for read-only functions (:data:`IDEMPOTENT`): a checkpoint or restore whose
    reply was lost may still have run, so it is never sent twice. Raises :class:`KernelDied`
    when the kernel is not there, or its process ends or is restarted meanwhile (at once, not
    at the timeout), :class:`KernelStalled` when it sent no progress and answered no heartbeat
    for ``silence`` seconds (None or 0: no such limit), and :class:`BridgeError` when no
    attempt got an answer.
    """
    if retries and func not in IDEMPOTENT:
        raise ValueError(f"{func} changes the kernel's state; it is never retried")
    km = serverapp.kernel_manager
    if kernel_id in km:
        side = kernelside.kernel_side_of(km.get_kernel(kernel_id))
        if side.language != "python":  # our code would not even parse there
            return {"ok": False, "error": side.why, "error_kind": "kernel_side"}
    for attempt in range(retries + 1):
        if kernel_id not in km:
            raise KernelDied(f"kernel {kernel_id[:8]} is not running", "the kernel is not running")
        pid = kernel_pid(serverapp, kernel_id)
        try:
            # A call asked again waits for a restarted process (see why_gone); one that is not
            # ends as soon as its process does.
            res = await _call_once(serverapp, kernel_id, func, pid, strict=not retries,
                                   progress=progress, timeout=timeout, silence=silence,
                                   **kwargs)
        except Exception as e:
            # A call that failed because the kernel went away says so.
            why = await why_gone(serverapp, kernel_id, pid)
            if why:
                raise KernelDied(f"the kernel {kernel_id[:8]} stopped during {func} ({why})",
                                 why) from e
            raise
        if res.get("stalled"):
            raise KernelStalled(str(res["error"]), float(silence or 0))
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
        why = await why_gone(serverapp, kernel_id, pid) or "its process ended"
        raise KernelDied(str(res["error"]), why)
    tries = "" if not retries else f" ({retries + 1} attempts, each on a new connection)"
    raise BridgeError(f"the kernel did not answer {func} within {timeout or 0:.0f} s{tries}")


async def checkpoint(serverapp: Any, kernel_id: str, **kwargs: Any) -> CheckpointResult:
    """:func:`call` of ``checkpoint``, its result typed (the same exceptions)."""
    return CheckpointResult.from_json(await call(serverapp, kernel_id, "checkpoint", **kwargs))


async def restore(serverapp: Any, kernel_id: str, **kwargs: Any) -> RestoreResult:
    """:func:`call` of ``restore``, its result typed (the same exceptions)."""
    return RestoreResult.from_json(await call(serverapp, kernel_id, "restore", **kwargs))


async def liveness(serverapp: Any, kernel_id: str, **kwargs: Any) -> LivenessResult:
    """:func:`call` of ``liveness``, its result typed (the same exceptions)."""
    return LivenessResult.from_json(await call(serverapp, kernel_id, "liveness", **kwargs))


# ---------------------------------------------------------------------- the server's kernels


async def cells_run(serverapp: Any, kernel_id: str, timeout: float) -> bool:
    """Whether the person ran a cell in this kernel process. Unknown (no answer, an older
    kernel side) counts as yes: the callers then save work that may exist rather than drop
    it. A process that ended while asked counts as no: its work went with it, and the one the
    restarter puts in its place has run nothing (saving that would shadow a good checkpoint
    with an empty one)."""
    try:
        res = await call(serverapp, kernel_id, "liveness", timeout=max(1.0, timeout))
    except KernelDied:
        return False
    except Exception:  # noqa: BLE001 - no answer: treated as used
        return True
    cells = res.get("cells_run") if res.get("ok") is not False else None
    return not isinstance(cells, int) or cells > 0


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
    """The kernel's execution state as jupyter_server knows it ("dead" once it is gone)."""
    kernel = _kernel(serverapp, kernel_id)
    return "dead" if kernel is None else getattr(kernel, "execution_state", "unknown")


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
    """Interrupt the kernel's running cell."""
    await ensure_async(serverapp.kernel_manager.interrupt_kernel(kernel_id))
