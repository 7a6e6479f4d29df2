"""What a pause means to the rest of the server: no kernel starts while the workspace is paused,
being paused or being resumed (the resume's own starts excepted), and a notebook renamed while
paused comes back under its new name.

A kernel started during a pause would be merged at resume: the checkpoint restored over its work
where names collide. The frontend holds its own paths; the server is the guarantee.
jupyter_server has no hook that vetoes a kernel start, so one function (:func:`start_refusal`)
decides and two places ask it:

- **the REST routes that start kernels** (POST /api/sessions for a new session, PATCH
  /api/sessions/{id} that changes the kernel, POST /api/kernels, POST /api/kernels/{id}/restart)
  are served by subclasses of jupyter_server's own handlers, routed by this extension: tornado
  tries an extension's routes before the server's (``Application.add_handlers`` inserts them
  ahead of the default rules). They refuse before jupyter_server's code runs, because that code
  answers any error of the managers with a 500 or 501 (services/sessions/handlers.py ``post`` and
  ``patch``, services/kernels/handlers.py ``restart``), never with the 409 a person can act on.
- **the server's kernel and session managers** get a mixin (:func:`install`) that refuses the
  same starts from any other caller (another extension, a request that raced a pause) and hosts
  the restore after a server stop (:func:`.shutdown.restore_after_stop`).

Renames while paused: jupyter_server announces a contents rename on its event bus
(``contents_service`` ``rename``, emitted by ``ContentsManager.rename`` once the file moved); the
PATCH of a session's path is seen by the session handler above. Either journals ``renamed``, which
moves the paused notebook's recorded path (:func:`.state.apply`), so the resume re-creates its
session where the notebook is now, also after a server restart.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Iterator
from typing import TYPE_CHECKING, Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.services.kernels import handlers as kernel_handlers
from jupyter_server.services.sessions import handlers as session_handlers
from tornado import web

from ..vocabulary import PAUSE_STATES, RESUME_STATES
from . import jupyter_seams
from .httperror import ApiError
from .state import recorded_paths

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

CONTENTS_SERVICE = "https://events.jupyter.org/jupyter_server/contents_service/v1"
PAUSED = "the workspace is paused; resume it first"
PAUSING = "the workspace is being paused; resume it first"
RESUMING = "the workspace is being resumed; start kernels when the resume has finished"

# True in the lifecycle's own flights (set where the resume task is created: tasks inherit it).
_OWN_STARTS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "jupyter_pause_own_starts", default=False)


@contextlib.contextmanager
def own_starts() -> Iterator[None]:
    """Kernel starts made in this context, and in tasks created in it, are the lifecycle's."""
    token = _OWN_STARTS.set(True)
    try:
        yield
    finally:
        _OWN_STARTS.reset(token)


def start_refusal(lc: Lifecycle | None) -> str | None:
    """Why a kernel may not start now (paused, pausing, resuming), or None when it may."""
    if lc is None or _OWN_STARTS.get():
        return None
    flight = lc.flight.kind if lc.flight is not None else None
    state = lc.state.get("state")
    if flight == "resume" or state in RESUME_STATES:
        return RESUMING
    if flight == "pause" or state in PAUSE_STATES:
        return PAUSING
    if state == "paused":
        return PAUSED
    return None


class KernelStartRefused(ApiError):
    """A kernel start refused by :func:`start_refusal`: jupyter_server renders it as a 409
    ``{"message": ...}`` wherever its handlers let it through."""

    def __init__(self, message: str) -> None:
        super().__init__(409, message)


def _check(lc: Lifecycle | None) -> None:
    why = start_refusal(lc)
    if why:
        raise KernelStartRefused(why)


# ---------------------------------------------------------------------- the managers


class _KernelManagerGuard:
    """Mixed into the server's kernel manager: refuses user starts and restarts while paused."""

    jupyter_pause_lifecycle: Lifecycle | None = None

    async def start_kernel(self, *args: Any, **kwargs: Any) -> str:
        _check(self.jupyter_pause_lifecycle)
        return await super().start_kernel(*args, **kwargs)  # type: ignore[misc]

    async def restart_kernel(self, *args: Any, **kwargs: Any) -> None:
        # A restart wipes the memory a kept kernel's liveness check depends on.
        _check(self.jupyter_pause_lifecycle)
        return await super().restart_kernel(*args, **kwargs)  # type: ignore[misc]


class _SessionManagerGuard:
    """Mixed into the server's session manager: after a server stop, restores a saved notebook
    into the kernel started for its session before the session request answers (so no cell runs
    before the restore, and two never race)."""

    jupyter_pause_lifecycle: Lifecycle | None = None

    async def start_kernel_for_session(self, session_id: str, path: str | None,
                                       name: Any, type: str | None, kernel_name: str | None,
                                       *args: Any, **kwargs: Any) -> str:
        from .shutdown import restore_after_stop  # shutdown imports the lifecycle

        kernel_id = await super().start_kernel_for_session(  # type: ignore[misc]
            session_id, path, name, type, kernel_name, *args, **kwargs)
        lc = self.jupyter_pause_lifecycle
        if lc is not None and path and kernel_id:
            try:
                await restore_after_stop(lc, path, kernel_id)
            except Exception:  # never fail the session: the notebook opens, unrestored
                lc.log.exception("jupyter_pause: restore of %s after the stop failed", path)
        return kernel_id


def install(lc: Lifecycle) -> None:
    """Guard the server's kernel and session managers (see the module's docstring).

    The managers the server built are given a subclass of their own class, not replaced, so a
    configured (or gateway) manager keeps working; why not ``ServerApp.kernel_manager_class``:
    :mod:`.jupyter_seams` (seam 1).
    """
    serverapp = lc.serverapp
    jupyter_seams.mix_into(serverapp.kernel_manager, _KernelManagerGuard,
                           jupyter_pause_lifecycle=lc)
    jupyter_seams.mix_into(serverapp.session_manager, _SessionManagerGuard,
                           jupyter_pause_lifecycle=lc)


# ---------------------------------------------------------------------- renames


async def note_rename(lc: Lifecycle | None, old: str | None, new: str | None) -> None:
    """Journal ``renamed`` when ``old`` (a notebook or a folder) holds a recorded notebook."""
    if lc is None or not old or not new:
        return
    old, new = old.strip("/"), new.strip("/")
    if old == new or not recorded_paths(lc.state, old):
        return
    await lc.record("renamed", flight=False, old_path=old, new_path=new)
    lc.log.info("jupyter_pause: %s was renamed to %s; its paused session follows it", old, new)


class RenameWatch:
    """Listens to jupyter_server's contents events for renames (the contents API's PATCH)."""

    def __init__(self, lc: Lifecycle):
        self.lc = lc
        self._logger: Any = None

    def start(self) -> None:
        logger = getattr(self.lc.serverapp, "event_logger", None)
        if logger is None or CONTENTS_SERVICE not in logger.schemas.schema_ids:
            self.lc.log.warning("jupyter_pause: this jupyter_server announces no renames; a "
                                "notebook renamed while paused comes back at its old path")
            return
        logger.add_listener(schema_id=CONTENTS_SERVICE, listener=self._on_event)
        self._logger = logger

    def stop(self) -> None:
        if self._logger is not None:
            self._logger.remove_listener(schema_id=CONTENTS_SERVICE, listener=self._on_event)
            self._logger = None

    async def _on_event(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        if data.get("action") != "rename":
            return
        try:
            await note_rename(self.lc, data.get("source_path"), data.get("path"))
        except Exception:  # the rename itself succeeded; only following it failed
            self.lc.log.exception("jupyter_pause: could not record the rename of %s",
                                  data.get("source_path"))


# ---------------------------------------------------------------------- the REST routes


async def _finish(result: Awaitable[None] | None) -> None:
    """Wait for the base handler's verb: tornado types it as maybe returning an awaitable,
    jupyter_server's are coroutines."""
    if result is not None:
        await result


def _lifecycle(handler: web.RequestHandler) -> Lifecycle | None:
    return handler.settings.get("jupyter_pause_lifecycle")


def _refuse(handler: web.RequestHandler) -> None:
    why = start_refusal(_lifecycle(handler))
    if why:
        raise KernelStartRefused(why)


def _body(handler: web.RequestHandler) -> dict[str, Any]:
    try:
        model = handler.get_json_body()  # type: ignore[attr-defined]
    except web.HTTPError:
        return {}  # jupyter_server's handler answers the bad body with its 400
    return model if isinstance(model, dict) else {}


class SessionRootHandler(session_handlers.SessionRootHandler):
    """POST /api/sessions: refused while paused when it would start a kernel."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        if start_refusal(_lifecycle(self)) and await self._starts_kernel():
            _refuse(self)
        await _finish(super().post())

    async def _starts_kernel(self) -> bool:
        """As jupyter_server's post decides: no session for the path and no running kernel."""
        model = _body(self)
        notebook = model.get("notebook")
        path = notebook.get("path") if isinstance(notebook, dict) else model.get("path")
        if not isinstance(path, str):
            return False  # its 400
        if await self.session_manager.session_exists(path=path):
            return False  # answered with the existing session
        kernel = model.get("kernel")
        kernel_id = kernel.get("id") if isinstance(kernel, dict) else None
        return not (kernel_id and kernel_id in self.kernel_manager)


class SessionHandler(session_handlers.SessionHandler):
    """PATCH /api/sessions/{id}: a kernel change refused while paused; a path change followed."""

    @web.authenticated
    @authorized
    async def patch(self, session_id: str) -> None:
        lc = _lifecycle(self)
        model = _body(self)
        before = await self.session_manager.get_session(session_id=session_id)  # its 404
        kernel = model.get("kernel")
        if start_refusal(lc) and isinstance(kernel, dict):
            if kernel.get("id") is not None:
                changes = kernel["id"] != (before.get("kernel") or {}).get("id")
            else:
                changes = kernel.get("name") is not None  # a new kernel, even of the same name
            if changes:
                _refuse(self)
        await _finish(super().patch(session_id))
        if "path" in model or isinstance(model.get("notebook"), dict):
            try:
                after = await self.session_manager.get_session(session_id=session_id)
            except web.HTTPError:
                return
            await note_rename(lc, before.get("path"), after.get("path"))


class MainKernelHandler(kernel_handlers.MainKernelHandler):
    """POST /api/kernels: refused while paused."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        _refuse(self)
        await _finish(super().post())


class KernelActionHandler(kernel_handlers.KernelActionHandler):
    """POST /api/kernels/{id}/restart: refused while paused (interrupt is not)."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, action: str) -> None:
        if action == "restart":
            _refuse(self)
        await _finish(super().post(kernel_id, action))


def handlers() -> list[tuple[str, type]]:
    """jupyter_server's routes that start kernels, with the patterns it uses for them."""
    routes = {h: p for p, h, *_ in [*session_handlers.default_handlers,
                                    *kernel_handlers.default_handlers]}
    return [(routes[session_handlers.SessionRootHandler], SessionRootHandler),
            (routes[session_handlers.SessionHandler], SessionHandler),
            (routes[kernel_handlers.MainKernelHandler], MainKernelHandler),
            (routes[kernel_handlers.KernelActionHandler], KernelActionHandler)]
