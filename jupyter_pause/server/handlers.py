"""REST API under ``<base_url>/jupyter-pause/api/``: every verb authenticated, XSRF by APIHandler."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

import tornado
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin

from . import kernels as kbridge
from . import validate as v
from .lifecycle import Lifecycle, Refusal

API = r"/jupyter-pause/api"


class BaseHandler(ExtensionHandlerMixin, APIHandler):
    # jupyter_server's authorizer sees reads (GET) and writes (POST/DELETE) of this resource,
    # so a deployment can grant status to viewers and pause/resume to owners only.
    auth_resource = "jupyter_pause"

    @property
    def lifecycle(self) -> Lifecycle:
        return self.extensionapp.lifecycle

    async def prepare(self) -> None:
        await super().prepare()
        reason = getattr(self.extensionapp, "disabled_reason", None)
        # Only an authenticated caller learns why (the reason names the other server).
        if reason and self.current_user and not self._finished:
            self.reply({"message": f"jupyter_pause is disabled in this server: {reason}"}, 503)

    def body(self, schema: dict[str, v.Field]) -> dict[str, Any]:
        """The request body as a typed dict of ``schema``'s fields (absent ones None)."""
        try:
            return v.parse_body(self.request.body, schema)
        except v.BadRequest as e:
            raise Refusal(str(e), 400) from None

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))

    def refuse(self, e: Refusal) -> None:
        self.reply({"message": str(e)}, e.status)


class StatusHandler(BaseHandler):
    # A UI polling status is not the person's activity: it must not keep the workspace active.
    _track_activity = False

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        status = await self.lifecycle.status()
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
    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        try:
            body = self.body(v.PAUSE)
            flight = await self.lifecycle.request_pause(
                trigger=body["trigger"] or "api", interrupt=bool(body["interrupt"]),
                mode=body["mode"] or "pause")
        except Refusal as e:
            return self.refuse(e)
        self.reply({"flight": flight.to_dict()}, 202)


class ResumeHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        try:
            body = self.body(v.RESUME)
            flight = await self.lifecycle.request_resume(trigger=body["trigger"] or "api")
        except Refusal as e:
            return self.refuse(e)
        self.reply({"flight": flight.to_dict()}, 202)


class RecomputeHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        try:
            body = self.body(v.RECOMPUTE)
            path, names = body["path"], body["names"]
            if self.lifecycle.flight is not None:
                raise Refusal(f"a {self.lifecycle.flight.kind} is in progress; try again after it")
            records = await kbridge.running_kernels(self.serverapp)
            rec = next((r for r in records if r.path == path), None)
            if rec is None:
                raise Refusal(f"no running kernel for {path}", 404)
            try:
                res = await kbridge.call(self.serverapp, rec.kernel_id, "recompute", names=names,
                                         timeout=self.extensionapp.bridge_timeout)
            except Exception as e:
                raise Refusal(f"recompute in {path} failed: {e}") from e
            if res.get("ok") is False:
                raise Refusal(f"recompute in {path} failed: {res.get('error')}")
            # The report now says what the re-run brought back (journaled, so it survives).
            await self.lifecycle.record_recompute(path, rec.kernel_id,
                                                  list(res.get("variables") or []))
        except Refusal as e:
            return self.refuse(e)
        self.reply({"variables": res.get("variables", [])})


def _open_store(app: Any) -> Any:
    from ..checkpoint import load_or_create_key, open_store

    # With the key, listings show only authentic checkpoints (a foreign one is never offered).
    # Opened once: the key check (no new key over existing checkpoints) lists the same store.
    store = open_store(app.store_url or None)
    store.key = load_or_create_key(app.key_path or None, store=store)
    return store


class CheckpointsHandler(BaseHandler):
    _track_activity = False  # reading, like GET status

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            stream = v.query_str("stream", self.get_argument("stream", None), v.STREAM)
        except v.BadRequest as e:
            return self.refuse(Refusal(str(e), 400))

        def listing() -> list[dict[str, Any]]:
            store = _open_store(self.extensionapp)
            return [_summary(m) for m in store.list(stream)]

        try:
            items = await asyncio.to_thread(listing)
        except Exception as e:  # noqa: BLE001 - one line back to the caller
            return self.reply({"message": f"cannot list checkpoints: {e}"}, 500)
        self.reply({"checkpoints": items})


class CheckpointHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def delete(self, checkpoint_id: str) -> None:
        try:
            v.query_str("checkpoint id", checkpoint_id, v.CHECKPOINT_ID)
        except v.BadRequest as e:
            return self.refuse(Refusal(str(e), 400))
        pending = self.lifecycle.state.get("pause") or self.lifecycle.state.get("inflight") or {}
        if checkpoint_id in (pending.get("checkpoints") or []):
            return self.refuse(Refusal(
                f"checkpoint {checkpoint_id} is the way back of the current pause; resume first"))

        def delete() -> None:
            _open_store(self.extensionapp).delete(checkpoint_id)

        try:
            await asyncio.to_thread(delete)
        except Exception as e:  # noqa: BLE001 - mapped to 404/500 below
            from ..checkpoint import NotFoundError

            if isinstance(e, (NotFoundError, FileNotFoundError, KeyError)):
                return self.reply({"message": f"no checkpoint {checkpoint_id}"}, 404)
            return self.reply({"message": f"cannot delete checkpoint {checkpoint_id}: {e}"}, 500)
        self.set_status(204)
        self.finish()


class GcHandler(BaseHandler):
    """Retention: the backend's snapshots, checkpoints beyond ``keep`` per notebook (older than
    ``older_than`` s), then unreferenced blobs. The current pause's checkpoints are kept."""

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        app = self.extensionapp
        try:
            body = self.body(v.GC)
            keep = app.keep_checkpoints if body["keep"] is None else body["keep"]
            older_than = body["older_than"]
            if self.lifecycle.flight is not None:
                raise Refusal(f"a {self.lifecycle.flight.kind} is in progress; try again after it")
        except Refusal as e:
            return self.refuse(e)
        # The retention module does it: snapshots, checkpoints, blobs, in an order that orphans
        # nothing, protecting the current pause's checkpoints (state.json + lifecycle.state).
        from ..policy.gc import run_gc_for_app

        try:
            res = await run_gc_for_app(app, keep=keep, older_than=older_than,
                                       dry_run=bool(body["dry_run"]))
        except Exception as e:  # noqa: BLE001 - one line back to the caller
            # The retention module's GCError / a ValueError: a request that makes no sense.
            bad_request = isinstance(e, ValueError) or type(e).__name__ == "GCError"
            return self.reply({"message": f"gc refused: {e}" if bad_request
                               else f"gc failed: {e}"}, 400 if bad_request else 500)
        self.reply(res)


def _summary(m: Any) -> dict[str, Any]:
    get = m.get if isinstance(m, dict) else lambda k, d=None: getattr(m, k, d)
    variables = get("variables", []) or []
    return {"id": get("id"), "stream": get("stream"), "created": get("created"),
            "bytes_total": get("bytes_total", 0), "variables": len(variables)}


def default_handlers() -> list[tuple[str, type]]:
    return [
        (rf"{API}/status", StatusHandler),
        (rf"{API}/pause", PauseHandler),
        (rf"{API}/resume", ResumeHandler),
        (rf"{API}/recompute", RecomputeHandler),
        (rf"{API}/checkpoints", CheckpointsHandler),
        (rf"{API}/checkpoints/([^/]+)", CheckpointHandler),
        (rf"{API}/gc", GcHandler),
    ]
