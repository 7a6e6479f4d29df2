"""``POST offers/restore`` and ``POST offers/dismiss``: the person's answer to a death's offer.

Only the person restores an offer (never the server by itself): the restore runs in the
notebook's running kernel, like ``%restore``, and merges the saved variables into it; a failed
restore changes nothing and keeps the offer.
"""

from __future__ import annotations

from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized

from . import bridge as kbridge
from . import validate as v
from .handlers import STATUS_START_WAIT, BaseHandler
from .httperror import ApiError

# How long a restore waits for the kernel's running cell to end before it says "busy".
IDLE_WAIT = 5.0
OFFER = v.body_schema(("path",), path={"type": "string", "maxLength": v.MAX_PATH},
                      id={"type": "string", "maxLength": 2 * v.MAX_PATH})


class _OfferHandler(BaseHandler):
    async def offer(self, body: dict[str, Any]) -> dict[str, Any]:
        # A page open across a restart acts on what the new server offers, once it knows.
        await self.extensionapp.start_checked(STATUS_START_WAIT)
        path = body["path"]
        offer = (self.lifecycle.state.get("offers") or {}).get(path)
        if not isinstance(offer, dict) or (body["id"] and body["id"] != offer.get("id")):
            raise ApiError(404, f"no offer for {path}")
        return offer


class OfferRestoreHandler(_OfferHandler):
    """Restore the offered checkpoint into the notebook's running kernel."""

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.body(OFFER)
        offer = await self.offer(body)
        path = body["path"]
        if not offer.get("checkpoint_id"):
            raise ApiError(409, f"{path} has no autosave or checkpoint to restore")
        rec = await self.notebook_kernel(
            path, f"no kernel runs for {path}: open the notebook first", 409)
        # jupyter_server may not have read the trailing idle of a cell that just ended
        if not await kbridge.wait_idle(self.serverapp, rec.kernel_id, IDLE_WAIT):
            if kbridge.execution_state(self.serverapp, rec.kernel_id) == "dead":
                raise ApiError(409, f"the kernel of {path} stopped; open the notebook again")
            raise ApiError(409, f"the kernel of {path} is running a cell; restore when it "
                           "is idle")
        app = self.extensionapp
        try:
            res = await kbridge.call(
                self.serverapp, rec.kernel_id, "restore", timeout=app.bridge_timeout,
                silence=app.kernel_silence_timeout, store_url=app.store_url or None,
                key_path=app.key_path or None, stream=offer.get("stream") or rec.stream,
                checkpoint_id=offer["checkpoint_id"], device=app.restore_device, only=None)
        except Exception as e:
            raise ApiError(409, f"restoring {path} failed: {e}; nothing was changed") from e
        if res.get("ok") is False:
            raise ApiError(409, f"restoring {path} failed: {res.get('error')}; nothing was "
                           "changed")
        result = {"path": path, "kernel_id": rec.kernel_id,
                  "checkpoint_id": offer["checkpoint_id"],
                  "variables": res.get("variables") or [], "warnings": res.get("warnings") or [],
                  "cells_lost": offer.get("cells_lost"), "seconds_lost": offer.get("age_s")}
        await self.lifecycle.record(
            "offer_restored", flight=False, path=path, kernel_id=rec.kernel_id,
            checkpoint_id=offer["checkpoint_id"], cause=offer.get("cause"),
            used_since=bool(offer.get("used_since")), cells_lost=offer.get("cells_lost"),
            seconds_lost=offer.get("age_s"), variable_count=len(result["variables"]))
        self.reply(result)


class OfferDismissHandler(_OfferHandler):
    """Drop the offer (the checkpoint stays in the store)."""

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.body(OFFER)
        await self.offer(body)
        await self.lifecycle.record("offer_dismissed", flight=False, path=body["path"])
        self.set_status(204)
        self.finish()


def handlers(api: str) -> list[tuple[str, type]]:
    return [(rf"{api}/offers/restore", OfferRestoreHandler),
            (rf"{api}/offers/dismiss", OfferDismissHandler)]
