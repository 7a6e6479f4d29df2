"""Every place where jupyter_pause reaches past jupyter_server's extension API, in one module.

jupyter_server's hooks carry most of the extension: ``ExtensionApp.current_activity`` (asked by
the idle shutdown, ``shutdown_no_activity_timeout``), ``stop_extension`` (awaited by
``ServerApp._cleanup`` before ``cleanup_kernels``: the shutdown checkpoint runs there, with the
kernels still up), routes tried ahead of the server's own, and the event bus. What has no hook is
done here, each with the jupyter_server code it depends on (2.13 to 2.x, the range pinned in
pyproject.toml). :data:`PINNED` names that code with a hash of its source; the seam test fails
when any of it changes: re-read the function it names, re-check what the comment of its seam
below says, and add the new hash to its entry.

1. **Guarded managers** (:func:`mix_into`): no hook vetoes a kernel start or runs after a
   session's kernel started, so the server's kernel and session managers get a subclass of their
   own class (:mod:`.kernelguard`). Not ``ServerApp.kernel_manager_class`` /
   ``session_manager_class``: their defaults read ``ServerApp.gateway_config``, which
   ``init_configurables`` assigns only after the extensions are linked, and every later link
   pushes the configuration back onto the ServerApp
   (``ExtensionApp._link_jupyter_server_extension``), so a class set from here would replace a
   user's or a gateway's manager, or be replaced by it.
2. **SIGINT without a terminal** (:class:`SigintStop`): ``ServerApp.init_signal`` handles SIGINT
   only when stdin is a tty; otherwise Python's KeyboardInterrupt ends ``start_ioloop``, which
   logs it and returns without ``_cleanup``: no ``stop_extension``, no shutdown checkpoint.
3. **How the server was asked to stop** (:class:`StopTrigger`): ``ServerApp.stop`` sets
   ``_stopping`` (its signal handlers and the idle shutdown call it); the shutdown API
   (``ShutdownHandler.post``) awaits ``_cleanup`` directly. The idle shutdown asks every
   extension's ``current_activity`` and calls ``stop()`` in the same callback.
4. **Our kernel calls are not the person's activity** (:func:`keep_own_out`, with
   :func:`put_back_activity` where it cannot be installed): every IOPub message of any request
   moves ``kernel.last_activity`` and ``last_kernel_activity``
   (``MappingKernelManager.start_watching_activity``), which ``GET /api/status`` and the idle
   shutdown read; nothing lets an extension's own requests go uncounted.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from datetime import datetime
from typing import Any

from ..kernelclient import OWN_SESSION_PREFIX, SUBSCRIPTION_PREFIX

# jupyter_server code each seam depends on: "module:qualname" -> its seam, and per jupyter_server
# version checked the first 16 hex digits of the sha256 of its source, each line's trailing space
# removed (tests/server/test_jupyter_seams.py). A version whose code still fits what the seam's
# comment says adds its own hash.
PINNED: dict[str, dict[str, Any]] = {
    # 1. guarded managers
    "jupyter_server.serverapp:ServerApp._default_kernel_manager_class": {
        "seam": "mix_into", "sha256": {"2.21.1": "c240c41564ebca52"}},
    "jupyter_server.serverapp:ServerApp._default_session_manager_class": {
        "seam": "mix_into", "sha256": {"2.21.1": "84e0c31a2c4b2dc8"}},
    "jupyter_server.services.sessions.sessionmanager:SessionManager.create_session": {
        "seam": "mix_into", "sha256": {"2.21.1": "fbe826ae670f374d"}},
    "jupyter_server.services.sessions.sessionmanager:SessionManager.start_kernel_for_session": {
        "seam": "mix_into", "sha256": {"2.21.1": "a8464bdf959579c6"}},
    # 2. SIGINT
    "jupyter_server.serverapp:ServerApp.init_signal": {
        "seam": "SigintStop", "sha256": {"2.21.1": "06e002f717be832d"}},
    "jupyter_server.serverapp:ServerApp.start_ioloop": {
        "seam": "SigintStop", "sha256": {"2.21.1": "d7086cb366b533b5"}},
    # 3. the stop's trigger, and the order the shutdown checkpoint relies on
    "jupyter_server.serverapp:ServerApp.stop": {
        "seam": "StopTrigger", "sha256": {"2.21.1": "a23c354c500d8d0a"}},
    "jupyter_server.serverapp:ServerApp.shutdown_no_activity": {
        "seam": "StopTrigger", "sha256": {"2.21.1": "a63be0c6a7736626"}},
    "jupyter_server.extension.manager:ExtensionManager.any_activity": {
        "seam": "StopTrigger", "sha256": {"2.21.1": "12ac5b66d2e2bc18"}},
    "jupyter_server.services.shutdown:ShutdownHandler.post": {
        "seam": "StopTrigger", "sha256": {"2.21.1": "01ea92d98bd80267"}},
    "jupyter_server.serverapp:ServerApp._cleanup": {
        "seam": "StopTrigger", "sha256": {"2.21.1": "d10f0e680f5b6176"}},
    # 4. activity
    "jupyter_server.services.kernels.kernelmanager:MappingKernelManager.start_watching_activity": {
        "seam": "keep_own_out", "sha256": {"2.21.1": "5eb953c6918a07e0"}},
    "jupyter_server.serverapp:ServerWebApplication.last_activity": {
        "seam": "put_back_activity", "sha256": {"2.21.1": "ca05820bde5df3b7"}},
}


# ---------------------------------------------------------------------- 1. guarded managers


def mix_into(obj: Any, mixin: type, **attrs: Any) -> None:
    """Give ``obj`` (a manager the server built) a subclass of its own class with ``mixin``
    first, once, and set ``attrs`` on it. Its class stays what the server was configured with
    (a user's manager, a gateway's), so only the mixin's methods change.

    Depends on: the server building its managers in ``ServerApp.init_configurables``, before any
    extension loads, from ``kernel_manager_class`` / ``session_manager_class`` (defaults
    ``_default_kernel_manager_class`` / ``_default_session_manager_class``, gateway-dependent);
    every kernel start going through the kernel manager's ``start_kernel`` and every session's
    kernel through ``SessionManager.start_kernel_for_session`` (called by ``create_session``).
    """
    cls = type(obj)
    if not issubclass(cls, mixin):
        obj.__class__ = type(f"JupyterPause{cls.__name__}", (mixin, cls), {})
    for name, value in attrs.items():
        setattr(obj, name, value)


# ---------------------------------------------------------------------- 2. SIGINT


class SigintStop:
    """Routes SIGINT to the server's stop when jupyter_server left it to Python (no terminal),
    as JupyterHub does for its single-user servers; :meth:`restore` puts Python's back.

    Depends on: ``ServerApp.init_signal`` (SIGINT handled only with a tty) and
    ``ServerApp.start_ioloop`` (a KeyboardInterrupt ends the loop with no ``_cleanup``).
    """

    def __init__(self) -> None:
        self._installed = False

    def install(self, serverapp: Any) -> None:
        if not (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            return  # jupyter_server's own (a terminal), a hub's, or SIGINT ignored

        def on_sigint(sig: int, frame: Any) -> None:
            serverapp.log.critical("received signal %s, stopping", sig)
            serverapp.stop(from_signal=True)

        signal.signal(signal.SIGINT, on_sigint)
        self._installed = True

    def restore(self) -> None:
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._installed = False


# ---------------------------------------------------------------------- 3. the stop's trigger


def _stopping(serverapp: Any) -> bool:
    return bool(getattr(serverapp, "_stopping", False))


class StopTrigger:
    """How the server was asked to stop, read when the extension stops: ``"idle"`` (the idle
    shutdown), ``"signal"`` (SIGTERM, SIGINT) or ``"api"`` (``POST /api/shutdown``, which
    ``jupyter server stop`` sends).

    Depends on: ``ServerApp.stop`` setting ``_stopping`` (its signal handlers and
    ``shutdown_no_activity`` call it; ``ShutdownHandler.post`` awaits ``_cleanup`` instead), and
    ``shutdown_no_activity`` asking ``ExtensionManager.any_activity`` (each extension's
    ``current_activity``) and calling ``stop()`` in the same callback, with no await between.
    Another caller of ``ServerApp.stop()`` reads as a signal: jupyter_server keeps no record of
    who called it.
    """

    def __init__(self, serverapp: Any):
        self.serverapp = serverapp
        self.idle = False

    def idle_check(self) -> None:
        """``current_activity`` found nothing to wait for: if the idle shutdown asked, its
        ``stop()`` has run when the callback after this one runs."""
        if self.idle or _stopping(self.serverapp):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # asked outside the event loop: not the idle shutdown
            return
        loop.call_soon(self._after_idle_check)

    def _after_idle_check(self) -> None:
        if _stopping(self.serverapp):
            self.idle = True

    def trigger(self) -> str:
        if self.idle:
            return "idle"
        return "signal" if _stopping(self.serverapp) else "api"


# ---------------------------------------------------------------------- 4. activity


def put_back_activity(km: Any, kernel_id: str, kernel: Any, before_kernel: datetime | None,
                      before_km: datetime | None) -> None:
    """Put a kernel's ``last_activity`` and the manager's ``last_kernel_activity`` back to what
    they were before a call of ours (other kernels' activity meanwhile still counts).

    Depends on: ``MappingKernelManager.start_watching_activity`` (both set on each IOPub
    message) and ``ServerWebApplication.last_activity`` (what ``GET /api/status`` and
    ``shutdown_no_activity`` read).
    """
    if before_kernel is not None:
        kernel.last_activity = before_kernel
    if before_km is not None:
        others = []
        for kid in list(km.list_kernel_ids()):
            other = km.get_kernel(kid) if kid != kernel_id and kid in km else None
            at = getattr(other, "last_activity", None)
            if at:
                others.append(at)
        km.last_kernel_activity = max([before_km, *others])


_DELIM = b"<IDS|MSG>"
_OWN = OWN_SESSION_PREFIX.encode()
_WELCOME = b"iopub_welcome"


def keep_own_out(km: Any, kernel: Any) -> bool:
    """From now on, the IOPub messages of our own requests (their parent's session is one of
    ours: :func:`..kernelclient.client_of`) up to that request's trailing idle, and the welcome
    of our own IOPub subscriptions, leave ``kernel.last_activity`` and ``last_kernel_activity``
    as they were, however late jupyter_server reads them; its ``execution_state`` is kept as it
    reads it. After that idle a message with our parent is the person's: ipykernel gives output
    from the person's threads the latest request's parent, which may be ours. Once per activity
    stream (a restart makes a new one); False when the kernel has none to wrap.

    Depends on: ``MappingKernelManager.start_watching_activity`` (``kernel._activity_stream``, a
    ``ZMQStream`` whose one receive callback sets both timestamps, synchronously) and pyzmq's
    ``ZMQStream.on_recv`` (replaces that callback; ``_recv_callback`` holds it).
    """
    stream = getattr(kernel, "_activity_stream", None)
    record = getattr(stream, "_recv_callback", None)
    try:
        if stream is None or record is None or stream.closed():
            return False  # no watch (yet), or one a restart or shutdown is replacing
    except Exception:  # noqa: BLE001 - not a stream we know: the caller falls back
        return False
    if _wraps_ours(record):
        return True
    unpack = kernel.session.unpack
    ended: dict[str, None] = {}  # our requests whose trailing idle was read, newest last

    def filtered(msg_list: list[Any]) -> None:
        before = (getattr(kernel, "last_activity", None), getattr(km, "last_kernel_activity", None))
        record(msg_list)
        if _is_own(msg_list, unpack, ended):
            if before[0] is not None:
                kernel.last_activity = before[0]
            if before[1] is not None:
                km.last_kernel_activity = before[1]

    filtered._jupyter_pause_own_out = True  # type: ignore[attr-defined]
    filtered.__wrapped__ = record  # type: ignore[attr-defined]
    try:
        stream.on_recv(filtered)
    except Exception:  # noqa: BLE001 - closed meanwhile: the caller falls back
        return False
    return True


ENDED_KEPT = 256  # our ended requests remembered per kernel (thread output names the latest)


def _wraps_ours(callback: Any) -> bool:
    """Whether ``callback`` is our filter, or wraps it (``__wrapped__``, as functools does)."""
    for _ in range(64):
        if callback is None:
            return False
        if getattr(callback, "_jupyter_pause_own_out", False):
            return True
        callback = getattr(callback, "__wrapped__", None)
    return False


def _is_own(msg_list: list[Any], unpack: Any, ended: dict[str, None]) -> bool:
    """A message of a request of ours up to its trailing idle, or the welcome of a
    subscription of ours. Records in ``ended`` the requests whose idle this is."""
    try:
        parts = [p if isinstance(p, bytes) else bytes(getattr(p, "bytes", p)) for p in msg_list]
        i = parts.index(_DELIM)
        header, parent = parts[i + 2], parts[i + 3]
        if _OWN in parent:  # cheap test first: most messages are the person's
            ph = unpack(parent)
            msg_id = str(ph.get("msg_id", ""))
            if not str(ph.get("session", "")).startswith(OWN_SESSION_PREFIX) or msg_id in ended:
                return False
            if b"status" in header:
                h = unpack(header)
                if h.get("msg_type") == "status" and \
                        unpack(parts[i + 5]).get("execution_state") == "idle":
                    ended[msg_id] = None
                    while len(ended) > ENDED_KEPT:
                        del ended[next(iter(ended))]
            return True
        if _WELCOME in header and unpack(header).get("msg_type") == "iopub_welcome":
            # our subscriptions' topics (iopub.IOPubReader); the server's own b"" gets none
            return str(unpack(parts[i + 5]).get("subscription", "")).startswith(SUBSCRIPTION_PREFIX)
    except Exception:  # noqa: BLE001 - not ours to judge: it counts, as jupyter_server decided
        return False
    return False
