"""Kernel deaths and the way back: each notebook's newest autosave, offered, never imposed.

- Every kernel the server starts gets its autosave installed (a silent bridge call, kept out of
  the person's activity like every bridge call), with ``c.PauseApp.autosave``.
- jupyter_client's ``KernelRestarter`` calls a kernel's ``"restart"`` callbacks when it finds
  the process dead (crash, OOM killer, SIGKILL) and before it starts the new one; an API
  restart the person asked for does not go through them. That is the death: the notebook's
  newest authentic checkpoint (an autosave, as a rule) becomes an *offer* in the state
  (journaled ``kernel_died``), shown in ``GET status`` as ``offers`` and restored only by the
  person (``POST offers/restore``, or ``%restore`` in the new kernel).
- A server killed without grace (SIGKILL of the server and its kernels, a pod deleted with
  ``--grace-period=0``) leaves its ``running`` marker in the state directory: the next server
  offers each notebook whose newest checkpoint is an autosave written while it ran.

Cells lost are counted from the kernel's IOPub (``execute_input`` of the cells started after
the autosave's cell), seconds lost from the autosave's time to the death.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..atomicfile import replace_file
from ..checkpoint import open_keyed_store
from ..checkpoint.retention import is_autosave
from ..journal import parse_iso
from . import bridge
from .iopub import watch_iopub
from .previous import age_words
from .restarts import KERNEL_ACTIONS

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

    from .app import PauseApp
    from .lifecycle import Lifecycle

log = logging.getLogger(__name__)

MARKER = "running.json"  # in the state directory while a server runs; removed at a clean stop


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def offer_text(offer: dict[str, Any]) -> str:
    """"The kernel died; its state as of cell [12], 5 s before, can be restored."."""
    who = "The kernel died" if offer.get("cause") == "kernel_died" else \
        "The server stopped without saving"
    if not offer.get("checkpoint_id"):
        return f"{who}; its state is gone (no autosave of it exists)."
    cell = f"cell [{offer['cell']}]" if isinstance(offer.get("cell"), int) else "its last save"
    age = offer.get("age_s")
    when = f", {age_words(float(age))} before" if isinstance(age, (int, float)) else ""
    return f"{who}; its state as of {cell}{when}, can be restored."


def offers_status(state: dict[str, Any], serverapp: Any,
                  running: dict[str, str]) -> list[dict[str, Any]]:
    """``GET status``'s ``offers`` (see the module doc): ``running`` maps path -> kernel id."""
    out = []
    for path, o in sorted((state.get("offers") or {}).items()):
        if not isinstance(o, dict):
            continue
        o = dict(o)  # noqa: PLW2901 - a copy: the state's own dict stays as it was
        o["kernel_id"] = running.get(path)
        text = offer_text(o)
        if o.get("used_since"):
            text += (" (cells were run since: restoring merges the saved variables over the "
                     "current ones)")
        o["text"] = text
        out.append(o)
    return out


class Deaths:
    """Watches kernel starts and deaths; makes and settles the offers."""

    def __init__(self, app: PauseApp) -> None:
        self.app = app
        lc, serverapp = app.lifecycle, app.serverapp
        if lc is None or serverapp is None:  # the extension makes both before this
            raise RuntimeError("kernel deaths are watched only once the extension has started")
        self.lc: Lifecycle = lc
        self.serverapp: ServerApp = serverapp
        self._tasks: set[asyncio.Task] = set()
        self._watches: dict[str, asyncio.Task] = {}
        self._cells: dict[str, dict[str, Any]] = {}   # kernel id -> last execute_input seen
        self._deaths: dict[str, asyncio.Future] = {}  # kernel id -> its offer (being made)
        self._logger: Any = None

    # -- start / stop -------------------------------------------------------------------------
    def start(self) -> None:
        logger = getattr(self.serverapp, "event_logger", None)
        if logger is not None and KERNEL_ACTIONS in logger.schemas.schema_ids:
            logger.add_listener(schema_id=KERNEL_ACTIONS, listener=self._on_action)
            self._logger = logger
        else:
            log.warning("jupyter_pause: this jupyter_server announces no kernel starts; "
                        "autosave and death offers are off")
        km = self.serverapp.kernel_manager
        for kid in list(km.list_kernel_ids()):
            self._spawn(self._started(kid))

    async def stop(self, clean: bool = True) -> None:
        if self._logger is not None:
            self._logger.remove_listener(schema_id=KERNEL_ACTIONS, listener=self._on_action)
            self._logger = None
        for t in list(self._watches.values()) + list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._watches.values(), *self._tasks, return_exceptions=True)
        self._watches.clear()
        if clean:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.app.state_dir, MARKER))

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- kernels --------------------------------------------------------------------------------
    async def _on_action(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        kid = data.get("kernel_id")
        if not kid or data.get("status") != "success":
            return
        if data.get("action") == "start":
            self._spawn(self._started(kid))
        elif data.get("action") == "restart":
            self._spawn(self._restarted(kid))
        elif data.get("action") == "shutdown":
            watch = self._watches.pop(kid, None)
            if watch is not None:
                watch.cancel()
            self._cells.pop(kid, None)

    async def _started(self, kid: str) -> None:
        km = self.serverapp.kernel_manager
        if kid not in km:
            return
        km.add_restart_callback(kid, lambda: self._died(kid), "restart")
        self._watch(kid)
        await self._install(kid, None)

    async def _restarted(self, kid: str) -> None:
        """A new process under the same id: its hooks are gone; install them again (with the
        offer, when it was a death, so that ``%restore`` takes the offered checkpoint)."""
        death = self._deaths.pop(kid, None)
        offer = None
        if death is not None:
            with contextlib.suppress(Exception):
                offer = await asyncio.wait_for(asyncio.shield(death), 60)
        self._watch(kid)
        await self._install(kid, (offer or {}).get("checkpoint_id") or "")

    def _watch(self, kid: str) -> None:
        old = self._watches.pop(kid, None)
        if old is not None:
            old.cancel()
        self._watches[kid] = asyncio.ensure_future(self._read_cells(kid))

    async def _read_cells(self, kid: str) -> None:
        """The cells the person starts (``execute_input``; silent bridge calls send none).
        No handshake: a welcome would count as the kernel's activity."""
        km = self.serverapp.kernel_manager
        if kid not in km:
            return

        def on_msg(msg: dict[str, Any]) -> None:
            if msg.get("msg_type") == "execute_input" or \
                    (msg.get("header") or {}).get("msg_type") == "execute_input":
                count = (msg.get("content") or {}).get("execution_count")
                self._cells[kid] = {"count": count if isinstance(count, int) else None,
                                    "at": time.time()}
                self._note_used(kid)

        with contextlib.suppress(asyncio.CancelledError):
            async with watch_iopub(km.get_kernel(kid), on_msg, handshake=False):
                await asyncio.Event().wait()  # until cancelled

    def _note_used(self, kid: str) -> None:
        """The person ran a cell in a kernel that has an offer: it is used since the death."""
        for path, o in (self.lc.state.get("offers") or {}).items():
            if o.get("used_since") or o.get("dead_kernel_id") not in (kid, None):
                continue
            if o.get("dead_kernel_id") is None and self._path_of(kid) != path:
                continue
            o["used_since"] = True  # in memory: the restore journals what it found

    async def _install(self, kid: str, offered: str | None) -> None:
        settings = self.app.autosave_settings()
        if not settings.get("enabled") and not offered:
            return
        if kid not in self.serverapp.kernel_manager:
            return
        try:
            # No stream: the kernel's own JPY_SESSION_NAME is the notebook's stream (the
            # session may not exist yet when the kernel starts; see bridge._stream).
            res = await bridge.call(self.serverapp, kid, "autosave", settings=settings,
                                    store_url=self.app.store_url or None,
                                    key_path=self.app.key_path or None, stream=None,
                                    offered=offered, timeout=self.app.bridge_timeout)
        except Exception as e:  # noqa: BLE001 - a kernel without jupyter_pause: no autosave
            log.info("jupyter_pause: no autosave in kernel %s: %s", kid[:8], e)
            return
        if res.get("ok") is False:
            log.info("jupyter_pause: no autosave in kernel %s: %s", kid[:8], res.get("error"))

    def _path_of(self, kid: str) -> str | None:
        sm = self.serverapp.session_manager
        with contextlib.suppress(Exception):
            for row in sm.cursor.execute("SELECT path FROM session WHERE kernel_id=?", (kid,)):
                return row[0]
        return None

    # -- deaths --------------------------------------------------------------------------------
    def _died(self, kid: str) -> None:
        """The restarter found the process dead (called on the event loop, before it restarts
        the kernel)."""
        died_at = _now_iso()
        loop = asyncio.get_event_loop()
        fut = loop.create_future()
        self._deaths[kid] = fut
        last = self._cells.pop(kid, None)
        self._spawn(self._offer(kid, died_at, last, fut))

    async def _offer(self, kid: str, died_at: str, last: dict[str, Any] | None,
                     fut: asyncio.Future) -> None:
        offer: dict[str, Any] | None = None
        try:
            records = await bridge.running_kernels(self.serverapp)
            rec = next((r for r in records if r.kernel_id == kid), None)
            if rec is None or not rec.path:
                return  # a kernel of no notebook: nothing to show it on
            newest = await asyncio.to_thread(self._newest, rec.stream)
            offer = make_offer("kernel_died", rec.path, rec.stream, newest, died_at,
                               dead_kernel_id=kid,
                               last_cell=(last or {}).get("count"))
            await self.lc.record("kernel_died", flight=False, offer=offer)
            log.warning("jupyter_pause: kernel %s of %s died; %s", kid[:8], rec.path,
                        offer_text(offer))
        except Exception:  # the death is in the log either way
            log.exception("jupyter_pause: cannot make the offer after kernel %s died", kid[:8])
        finally:
            if not fut.done():
                fut.set_result(offer)

    def _newest(self, stream: str) -> Any:
        store = open_keyed_store(self.app.store_url or None, self.app.key_path or None)
        found = store.list(stream)
        return found[0] if found else None

    # -- a server killed without grace ------------------------------------------------------
    async def start_after_kill(self) -> None:
        """At start: mark this server running; if the previous one was killed without grace,
        journal ``server_killed`` with an offer for each notebook it left an autosave of."""
        try:
            previous = await asyncio.to_thread(self.mark_running)
        except OSError as e:
            log.warning("jupyter_pause: cannot write the running marker: %s", e)
            return
        if previous is None:
            return
        offers = await asyncio.to_thread(self.offers_after_kill, previous)
        await self.lc.record("server_killed", flight=False, offers=offers,
                             previous_start=previous.get("started"))
        if offers:
            log.warning("jupyter_pause: the previous server was killed; offering %s",
                        "; ".join(f"{o['path']}: {offer_text(o)}" for o in offers))

    def mark_running(self) -> dict[str, Any] | None:
        """Write this server's marker; the previous one's content if it was left behind (that
        server did not stop cleanly). Blocking (start-up)."""
        path = os.path.join(self.app.state_dir, MARKER)
        previous = None
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            previous = data if isinstance(data, dict) else {}
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            previous = {}  # unreadable: a marker all the same
        os.makedirs(self.app.state_dir, exist_ok=True)
        # 0600 like everything in the state directory (it holds cell sources); not fsync'd:
        # a marker lost with the machine only loses offers a killed server would have made
        replace_file(path, json.dumps({"pid": os.getpid(), "started": _now_iso()}),
                     durable=False)
        return previous

    def offers_after_kill(self, previous: dict[str, Any]) -> list[dict[str, Any]]:
        """Each notebook whose newest checkpoint is an autosave written since the killed
        server started (blocking: reads the store)."""
        try:
            since = parse_iso(str(previous.get("started"))).timestamp()
        except (TypeError, ValueError):
            since = 0.0
        noticed = _now_iso()
        try:
            store = open_keyed_store(self.app.store_url or None, self.app.key_path or None)
            newest: dict[str, Any] = {}
            for m in store.list():
                if m.stream not in newest or m.id > newest[m.stream].id:
                    newest[m.stream] = m
        except Exception as e:  # noqa: BLE001 - no offers then; the reason goes to the log
            log.warning("jupyter_pause: cannot look for autosaves after a kill: %s", e)
            return []
        out = []
        for stream, m in sorted(newest.items()):
            created = m.created_at() or 0.0
            if is_autosave(m) and created >= since:
                out.append(make_offer("server_killed", self._path_for(stream), stream, m,
                                      noticed, dead_kernel_id=None, last_cell=None))
        return out

    def _path_for(self, stream: str) -> str:
        """The notebook's API path of a stream: jupyter_server names a kernel's session by
        the notebook's file path under its root directory."""
        root = os.path.abspath(getattr(self.serverapp, "root_dir", "") or ".")
        full = os.path.abspath(stream) if os.path.isabs(stream) else None
        if full and (full + "/").startswith(root.rstrip("/") + "/"):
            return os.path.relpath(full, root).replace(os.sep, "/")
        return stream


def make_offer(cause: str, path: str, stream: str, m: Any, died_at: str, *,
               dead_kernel_id: str | None, last_cell: int | None) -> dict[str, Any]:
    """An offer (see the module doc and ``GET status``'s ``offers``)."""
    offer: dict[str, Any] = {
        "id": f"{cause}-{stream}-{died_at}", "kind": None, "cause": cause, "path": path,
        "stream": stream, "dead_kernel_id": dead_kernel_id, "died_at": died_at,
        "checkpoint_id": None, "created_at": None, "cell": None, "age_s": None,
        "variables": 0, "used_since": False, "cells_lost": None,
    }
    if m is None:
        return offer
    meta = m.meta if isinstance(m.meta, dict) else {}
    cell = meta.get("cell") if isinstance(meta.get("cell"), int) else None
    created = m.created_at()
    try:
        age = max(0.0, parse_iso(died_at).timestamp() - created) if created else None
    except (TypeError, ValueError):
        age = None
    offer.update(kind="autosave" if is_autosave(m) else "checkpoint", checkpoint_id=m.id,
                 created_at=m.created, cell=cell,
                 age_s=round(age, 3) if age is not None else None,
                 variables=len(m.variables or []))
    if isinstance(last_cell, int) and cell is not None:
        # the cell running at the death was not finished: it is lost with the ones before it
        offer["cells_lost"] = max(0, last_cell - cell)
    return offer
