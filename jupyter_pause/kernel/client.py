"""The server's half of the bridge protocol (see :mod:`jupyter_pause.kernel.bridge`).

Pure asyncio + jupyter_client: no jupyter_server import, no IPython import.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

PROGRESS_PREFIX = "JUPYTER_PAUSE_PROGRESS "
EXPR_NAME = "jupyter_pause"
_MODULE = "__import__('jupyter_pause.kernel.bridge', fromlist=['_'])"
RESULT_EXPRESSION = f"{_MODULE}.last_result()"

ProgressCallback = Callable[[int, int], "None | Awaitable[None]"]


def bridge_code(func: str, **kwargs: Any) -> str:
    """The code string of one bridge call (a single expression; binds no name)."""
    return f"{_MODULE}.call({func!r}, {json.dumps(kwargs)!r})"


def parse_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """The bridge's result dict from an ``execute_reply`` message (or its content)."""
    content = reply.get("content", reply)
    if content.get("status") != "ok":
        ename, evalue = content.get("ename", "error"), content.get("evalue", "")
        if ename == "ModuleNotFoundError" and "jupyter_pause" in evalue:
            return {
                "ok": False,
                "error": "jupyter_pause is not installed in this kernel's environment",
            }
        status = content.get("status")
        return {
            "ok": False,
            "error": f"the kernel could not run the bridge ({status}: {ename}: {evalue})".replace(
                "\n", " "
            ),
        }
    expr = (content.get("user_expressions") or {}).get(EXPR_NAME)
    if not isinstance(expr, dict):
        return {"ok": False, "error": "the kernel returned no bridge result"}
    if expr.get("status") != "ok":
        return {
            "ok": False,
            "error": f"the bridge result could not be read "
            f"({expr.get('ename')}: {expr.get('evalue')})",
        }
    text = (expr.get("data") or {}).get("text/plain", "")
    try:
        result = json.loads(text)
    except ValueError:
        return {"ok": False, "error": f"unreadable bridge result: {text[:200]!r}"}
    if not isinstance(result, dict):
        return {"ok": False, "error": "unexpected bridge result"}
    return result


def own_client(kernel_manager: Any) -> Any:
    """A client of one kernel (its ``KernelManager``) with a session of its own.

    ``kernel_manager.client()`` hands every client the manager's session, whose id is also the
    ZMQ identity of the client's shell socket: with two such clients open, the kernel's replies
    go to whichever socket connected last and the other one waits forever.
    """
    session = kernel_manager.session.clone()
    session.session = uuid.uuid4().hex  # also resets bsession, the socket identity
    return kernel_manager.client(session=session)


class _LineSplitter:
    """Reassembles stdout ``stream`` messages into lines and reports progress lines."""

    def __init__(self, progress: ProgressCallback | None) -> None:
        self.progress = progress
        self.buffer = ""
        self.pending: list[Awaitable[None]] = []
        self.last: tuple[int, int] | None = None

    def feed(self, text: str) -> None:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            self._line(line)

    def _line(self, line: str) -> None:
        if not line.startswith(PROGRESS_PREFIX):
            return
        try:
            d = json.loads(line[len(PROGRESS_PREFIX) :])
            done, total = int(d["done"]), int(d["total"])
        except (ValueError, KeyError, TypeError):
            return
        self.last = (done, total)
        if self.progress is not None:
            r = self.progress(done, total)
            if inspect.isawaitable(r):
                self.pending.append(asyncio.ensure_future(r))


async def call_bridge(
    kernel_client: Any,
    func: str,
    progress: ProgressCallback | None = None,
    timeout: float | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ``jupyter_pause.kernel.bridge.<func>(**kwargs)`` in the kernel; returns its result dict.

    ``kernel_client`` is a started ``jupyter_client.asynchronous.AsyncKernelClient`` (channels
    running). Use a client of your own: IOPub messages of other requests that arrive on it while
    this waits are consumed and dropped. Never a ``kernel_manager.client()``: that client shares
    the manager's session id, which is its shell socket's ZMQ identity, so with a second such
    client open the reply may go to the other socket and this call hangs until ``timeout``.
    Make it with :func:`own_client`. ``progress(done, total)`` may be sync or async.
    ``timeout`` bounds the whole call (including waiting for a busy kernel); on timeout the
    result is ``{"ok": False, "error": ..., "timeout": True}`` and the kernel may still be
    working on the request.
    Never raises for kernel-side failures: they come back as ``{"ok": False, "error": "..."}``.
    """
    splitter = _LineSplitter(progress)

    def on_iopub(msg: dict[str, Any]) -> None:
        msg_type = msg.get("msg_type") or msg["header"].get("msg_type")
        if msg_type == "stream" and msg["content"].get("name") == "stdout":
            splitter.feed(msg["content"].get("text", ""))

    try:
        reply = await kernel_client.execute_interactive(
            bridge_code(func, **kwargs),
            silent=True,
            store_history=False,
            user_expressions={EXPR_NAME: RESULT_EXPRESSION},
            allow_stdin=False,
            stop_on_error=False,
            timeout=timeout,
            output_hook=on_iopub,
        )
    except TimeoutError:
        return {
            "ok": False,
            "timeout": True,
            "error": f"the kernel did not answer {func} within {timeout:g} s",
        }
    finally:
        splitter.feed("\n")
        if splitter.pending:
            await asyncio.gather(*splitter.pending, return_exceptions=True)
    return parse_reply(reply)
