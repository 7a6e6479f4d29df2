"""REST API under ``<base_url>/jupyter-pause/api/``: every verb authenticated, XSRF by APIHandler.

A refused request raises :class:`ApiError` (an ``HTTPError``); jupyter_server's
``APIHandler.write_error`` answers it as ``{"message": ...}`` JSON with its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin

from ..checkpoint import NotFoundError, open_keyed_store
from ..kernel.server_api import FROM_KERNEL_HEADER
from ..statefile import needed_ids
from . import bridge as kbridge
from . import validate as v
from .deaths import offers_status
from .httperror import ApiError
from .lifecycle import Lifecycle, LosesState, Refusal

if TYPE_CHECKING:
    from .app import PauseApp

API = r"/jupyter-pause/api"


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """The lifecycle's ``Refusal`` (409, or its status) as the HTTP error it answers."""
    try:
        yield
    except Refusal as e:
        raise ApiError(e.status, str(e)) from None


class BaseHandler(ExtensionHandlerMixin, APIHandler):
    """What every jupyter_pause handler shares: the authorizer's resource, the 503 of a
    disabled server, typed bodies and JSON replies."""

    # jupyter_server's authorizer sees reads (GET) and writes (POST/DELETE) of this resource,
    # so a deployment can grant status to viewers and pause/resume to owners only.
    auth_resource = "jupyter_pause"

    @property
    def extensionapp(self) -> PauseApp:
        """This extension's app (jupyter_server's mixin types it as any ExtensionApp)."""
        return cast("PauseApp", super().extensionapp)

    @property
    def lifecycle(self) -> Lifecycle:
        lc = self.extensionapp.lifecycle
        if lc is None:  # prepare() answers 503 before any handler gets here
            raise tornado.web.HTTPError(503, "jupyter_pause is disabled on this server")
        return lc

    # APIHandler.prepare() drops JupyterHandler's keyword the same way (and says so the same way)
    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        reason = getattr(self.extensionapp, "disabled_reason", None)
        # Only an authenticated caller learns why (the reason names the other server).
        if reason and self.current_user and not self._finished:
            raise ApiError(503, f"jupyter_pause is disabled in this server: {reason}")

    def body(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The request body checked against ``schema``: every field, absent ones None."""
        try:
            v.check_raw(self.request.body)  # bounds that get_json_body does not have
            try:
                data = self.get_json_body()
            except tornado.web.HTTPError:
                raise v.BadRequest("the request body is not JSON") from None
            return v.check({} if data is None else data, schema)
        except v.BadRequest as e:
            raise ApiError(400, str(e)) from None

    def query(self, name: str, value: str | None, schema: dict[str, Any]) -> str | None:
        """A query or URL value checked against ``schema`` (a 400 says what is wrong)."""
        try:
            return v.query_str(name, value, schema)
        except v.BadRequest as e:
            raise ApiError(400, str(e)) from None

    def reply(self, data: Any, status: int = 200) -> None:
        """``data`` as JSON (APIHandler.finish sets the content type)."""
        self.set_status(status)
        self.finish(json.dumps(data, default=str))

    async def notebook_kernel(self, path: str, missing: str, status: int = 404) -> Any:
        """The running kernel of ``path`` for a call into it: refused while a flight runs,
        and answered ``status`` with ``missing`` when no kernel runs for it."""
        if self.lifecycle.flight is not None:
            raise ApiError(409, f"a {self.lifecycle.flight.kind} is in progress; try again "
                           "after it")
        records = await kbridge.running_kernels(self.serverapp)
        rec = next((r for r in records if r.path == path), None)
        if rec is None:
            raise ApiError(status, missing)
        return rec


# How long a GET status made while the server starts waits for the start-up checks (one
# listing of the store); past it, the answer comes without them and their event follows.
STATUS_START_WAIT = 15.0


class StatusHandler(BaseHandler):
    """GET status: the state, the flight, the kernels and the last report."""

    # A UI polling status is not the person's activity: it must not keep the workspace active.
    _track_activity = False

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        await self.extensionapp.start_checked(STATUS_START_WAIT)
        status = await self.lifecycle.status()
        # What a kernel death or a killed server left to restore (see .deaths).
        running = {k.get("path"): k.get("id") for k in status.get("kernels") or []
                   if k.get("path")}
        status["offers"] = offers_status(self.lifecycle.state, self.serverapp, running)
        status["recoveries"] = dict(self.lifecycle.state.get("recoveries") or {})
        # Whether there is an accelerator to speak of: the UI names one only when there is.
        status.setdefault("accelerator", dict(self.lifecycle.app.accelerator or {}))
        # The report names the cell that made each variable, and cells hold secrets: only
        # those who may write (pause, recompute) see their source; viewers get the rest.
        allowed = self.authorizer.is_authorized(self, self.current_user, "write",
                                                self.auth_resource)
        if not (await allowed if inspect.isawaitable(allowed) else allowed):
            status = self._without_sources(status)
        self.reply(status)

    @classmethod
    def _without_sources(cls, value: Any) -> Any:
        """A copy with every cell's ``source``/``code`` text replaced by None (state untouched)."""
        if isinstance(value, dict):
            return {k: None if k in ("source", "code") and isinstance(v, str)
                    else cls._without_sources(v) for k, v in value.items()}
        if isinstance(value, list):
            return [cls._without_sources(v) for v in value]
        return value


class PauseHandler(BaseHandler):
    """POST pause: start a pause (or a stop) flight; 202 with the flight.

    A kernel that cannot be checkpointed (see :mod:`.checkpointable`) makes it 409 with
    ``{"message", "reason": "uncheckpointable", "uncheckpointable": [{kernel_id, path, kernel,
    language, why, install_command}]}``, nothing changed, unless ``lose_state`` names it (or
    ``allow_uncheckpointable`` is true): then it is shut down without a checkpoint."""

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.body(v.PAUSE)
        lose = bool(body["allow_uncheckpointable"]) or list(body["lose_state"] or [])
        try:
            flight = await self.lifecycle.checked_pause(
                trigger=body["trigger"] or "api", interrupt=bool(body["interrupt"]),
                mode=body["mode"] or "pause", lose_state=lose,
                # a kernel id, matched against the running ones: only ever skips a question
                busy=[self.request.headers.get(FROM_KERNEL_HEADER, "")[:200]])
        except LosesState as e:  # the person's choice: the UI asks "pause anyway?"
            self.reply({"message": str(e), "reason": "uncheckpointable",
                        "uncheckpointable": [u.to_dict() for u in e.kernels]}, 409)
            return
        except Refusal as e:
            raise ApiError(e.status, str(e)) from None
        self.reply({"flight": flight.to_dict()}, 202)


class ResumeHandler(BaseHandler):
    """POST resume: start a resume flight; 202 with the flight."""

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.body(v.RESUME)
        with refusals():
            flight = await self.lifecycle.request_resume(trigger=body["trigger"] or "api")
        self.reply({"flight": flight.to_dict()}, 202)


class RecomputeHandler(BaseHandler):
    """POST recompute: re-run in a notebook's kernel the cells of variables not restored."""

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.body(v.RECOMPUTE)
        path, names = body["path"], body["names"]
        rec = await self.notebook_kernel(path, f"no running kernel for {path}")
        try:
            res = await kbridge.call(self.serverapp, rec.kernel_id, "recompute", names=names,
                                     timeout=self.extensionapp.bridge_timeout)
        except Exception as e:
            raise ApiError(409, f"recompute in {path} failed: {e}") from e
        if res.get("ok") is False:
            raise ApiError(409, f"recompute in {path} failed: {res.get('error')}")
        # The report now says what the re-run brought back (journaled, so it survives).
        await self.lifecycle.record_recompute(path, rec.kernel_id,
                                              list(res.get("variables") or []))
        self.reply({"variables": res.get("variables", [])})


def _summary(m: Any) -> dict[str, Any]:
    get = m.get if isinstance(m, dict) else lambda k, d=None: getattr(m, k, d)
    variables = get("variables", []) or []
    return {"id": get("id"), "stream": get("stream"), "created": get("created"),
            "bytes_total": get("bytes_total", 0), "variables": len(variables)}


class CheckpointsHandler(BaseHandler):
    """GET checkpoints: the store's authentic checkpoints (``?stream=`` for one notebook)."""

    _track_activity = False  # reading, like GET status

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        stream = self.query("stream", self.get_argument("stream", None), v.STREAM)

        def listing() -> list[dict[str, Any]]:
            store = open_keyed_store(self.extensionapp.store_url or None,
                                     self.extensionapp.key_path or None)
            return [_summary(m) for m in store.list(stream)]

        try:
            items = await asyncio.to_thread(listing)
        except Exception as e:  # one line back to the caller
            raise ApiError(500, f"cannot list checkpoints: {e}") from e
        self.reply({"checkpoints": items})


class CheckpointHandler(BaseHandler):
    """DELETE checkpoints/<id>: delete one checkpoint, never the current pause's way back."""

    @tornado.web.authenticated
    @authorized
    async def delete(self, checkpoint_id: str) -> None:
        self.query("checkpoint id", checkpoint_id, v.CHECKPOINT_ID)
        if checkpoint_id in needed_ids(self.lifecycle.state):
            raise ApiError(409, f"checkpoint {checkpoint_id} is the way back of the current "
                           "pause; resume first")

        def delete() -> None:
            open_keyed_store(self.extensionapp.store_url or None,
                                     self.extensionapp.key_path or None).delete(checkpoint_id)

        try:
            await asyncio.to_thread(delete)
        except (NotFoundError, FileNotFoundError, KeyError) as e:
            raise ApiError(404, f"no checkpoint {checkpoint_id}") from e
        except Exception as e:  # one line back to the caller
            raise ApiError(500, f"cannot delete checkpoint {checkpoint_id}: {e}") from e
        self.set_status(204)
        self.finish()


def default_handlers() -> list[tuple[str, type]]:
    """The server's own routes (the policy module adds its own, gc among them)."""
    from .offerhandlers import handlers as offer_handlers  # it builds on BaseHandler

    return [
        (rf"{API}/status", StatusHandler),
        (rf"{API}/pause", PauseHandler),
        (rf"{API}/resume", ResumeHandler),
        (rf"{API}/recompute", RecomputeHandler),
        (rf"{API}/checkpoints", CheckpointsHandler),
        (rf"{API}/checkpoints/([^/]+)", CheckpointHandler),
        *offer_handlers(API),
    ]
