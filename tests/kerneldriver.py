"""Run code in a real kernel and read back what came of it: the one driver of the tests.

- :class:`Outputs`: a cell's reply, its stdout and stderr, displays, results and errors.
- :class:`KernelDriver`: a started jupyter_client ``BlockingKernelClient`` with ``run`` (any
  outcome), ``ok`` (the cell must succeed), ``eval`` and ``silent`` (a user expression, the
  latter without a cell: no history, no pre/post_run_cell hooks).
- :func:`run_cell`: the same ``run`` through an ``AsyncKernelClient``, for the tests that
  drive an in-process server's kernels from its event loop.
- :func:`run_websocket`: the same over a server's kernel websocket, the way JupyterLab runs a
  cell (through a proxy, where the kernel's ZMQ ports are out of reach).
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11


@dataclass
class Outputs:
    """What one execute request brought back."""

    status: str = ""
    reply: dict = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""
    displays: list[dict] = field(default_factory=list)  # display_data + update_display_data
    results: list[dict] = field(default_factory=list)  # execute_result data
    errors: list[dict] = field(default_factory=list)  # iopub "error" messages

    @property
    def text(self) -> str:
        """Everything a person could see, as text."""
        parts = [self.stdout, self.stderr]
        for d in self.displays + self.results:
            parts.append(d.get("text/plain", ""))
            parts.append(d.get("text/html", ""))
        for e in self.errors:
            parts.extend(e.get("traceback", []))
        return "\n".join(parts)

    @property
    def execution_count(self) -> int | None:
        return self.reply.get("content", {}).get("execution_count")

    def expr(self, name: str) -> Any:
        """The value of user expression ``name`` (its repr read back as a literal)."""
        e = self.reply["content"]["user_expressions"][name]
        assert e["status"] == "ok", e
        return ast.literal_eval(e["data"]["text/plain"])

    def check(self, code: str, *, allow_traceback: bool = False) -> Self:
        """Fail unless the cell succeeded (and, unless allowed, showed no traceback)."""
        content = self.reply.get("content", {})
        assert self.status == "ok", (
            f"{code!r} failed: {content.get('ename')}: {content.get('evalue')}\n{self.text}")
        if not allow_traceback:
            assert "Traceback" not in self.text, self.text
        return self


def _collect(out: Outputs) -> Callable[[dict], None]:
    """An ``output_hook`` that files each IOPub message of the cell into ``out``."""

    def hook(msg: dict) -> None:
        t, c = msg["header"]["msg_type"], msg["content"]
        if t == "stream":
            if c["name"] == "stdout":
                out.stdout += c["text"]
            else:
                out.stderr += c["text"]
        elif t in ("display_data", "update_display_data"):
            out.displays.append(c["data"])
        elif t == "execute_result":
            out.results.append(c["data"])
        elif t == "error":
            out.errors.append(c)

    return hook


def _done(out: Outputs, reply: dict) -> Outputs:
    out.reply = reply
    out.status = reply["content"]["status"]
    return out


class KernelDriver:
    """Cells and expressions through a started ``BlockingKernelClient``."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc

    def ready(self, timeout: float = 60) -> Self:
        """Wait until the kernel answers and IOPub is subscribed: until then its output and
        trailing idle would be lost (a slow joiner) and a cell would wait out its timeout."""
        self.kc.wait_for_ready(timeout=timeout)
        return self

    def run(self, code: str, timeout: float = 30, user_expressions: dict | None = None,
            **kw: Any) -> Outputs:
        """Run ``code`` whatever comes of it (``kw``: more ``execute`` fields, e.g. silent)."""
        out = Outputs()
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=_collect(out),
                                            user_expressions=user_expressions or {},
                                            allow_stdin=False, **kw)
        return _done(out, reply)

    def start(self, code: str, timeout: float = 60) -> str:
        """Send a cell and return (its msg_id) once the kernel began it, not waiting for its
        end: closing the client at once could drop the request."""
        msg_id = self.kc.execute(code, allow_stdin=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
            if (msg["parent_header"].get("msg_id") == msg_id
                    and msg["msg_type"] == "execute_input"):
                return msg_id
        raise TimeoutError(f"the cell did not start in {timeout:g} s: {code!r}")

    def ok(self, code: str, *, allow_traceback: bool = False, **kw: Any) -> Outputs:
        """Run a cell that must succeed and, unless allowed, show no traceback."""
        return self.run(code, **kw).check(code, allow_traceback=allow_traceback)

    def eval(self, expr: str, **kw: Any) -> Any:
        """``expr``'s value, through an empty cell's user expressions."""
        return self.run("", user_expressions={"v": expr}, **kw).expr("v")

    def silent(self, expr: str, timeout: float = 60) -> Any:
        """``expr``'s value without a cell: no execution count, no pre/post_run_cell hook."""
        return self.eval(expr, silent=True, timeout=timeout)

    def close(self) -> None:
        self.kc.stop_channels()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


async def run_cell(kc: Any, code: str, *, timeout: float = 120, ready: float | None = 60,
                   **kw: Any) -> Outputs:
    """:meth:`KernelDriver.run` through a started ``AsyncKernelClient``; first waits up to
    ``ready`` seconds for the kernel (None: the caller already did)."""
    if ready is not None:
        await kc.wait_for_ready(timeout=ready)
    out = Outputs()
    reply = await kc.execute_interactive(code, timeout=timeout, output_hook=_collect(out),
                                         allow_stdin=False, **kw)
    return _done(out, reply)


def _message(msg_type: str, content: dict[str, Any], session: str) -> dict[str, Any]:
    return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": session,
                       "username": "test", "version": "5.3",
                       "date": datetime.now(timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {}, "content": content, "channel": "shell",
            "buffers": []}


async def run_websocket(ws_url: str, code: str, *, token: str, timeout: float = 60,
                        user_expressions: dict | None = None) -> Outputs:
    """:meth:`KernelDriver.run` over a server's kernel websocket
    (``ws://.../api/kernels/<id>/channels``), as JupyterLab runs a cell, in the JSON
    (not the binary) message form; ``token`` authorizes the request."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    deadline = time.monotonic() + timeout
    conn = await websocket_connect(HTTPRequest(
        ws_url, headers={"Authorization": f"token {token}"}, request_timeout=timeout))
    try:
        msg = _message("execute_request", {"code": code, "silent": False,
                                           "store_history": True,
                                           "user_expressions": user_expressions or {},
                                           "allow_stdin": False, "stop_on_error": True},
                       uuid.uuid4().hex)
        msg_id = msg["header"]["msg_id"]
        await conn.write_message(json.dumps(msg))
        out = Outputs()
        hook = _collect(out)
        reply: dict | None = None
        idle = False
        # The reply and the trailing idle come on different channels, in either order.
        while reply is None or not idle:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the cell did not finish in {timeout:g} s: {code!r}")
            raw = await asyncio.wait_for(asyncio.ensure_future(conn.read_message()), left)
            if raw is None:
                raise AssertionError("the kernel's websocket closed")
            m = json.loads(raw)
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = m["header"]["msg_type"]
            if kind == "execute_reply":
                reply = m
            elif kind == "status":
                idle = idle or m["content"].get("execution_state") == "idle"
            else:
                hook(m)
        return _done(out, reply)
    finally:
        conn.close()
