"""The server's half of the bridge protocol (see :mod:`jupyter_pause.kernel.bridge`): the code
string of a call, its result in the reply, and the progress lines it prints.

Pure: no messaging (that is :mod:`.bridge`), no jupyter_server, no IPython.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from ..kernel.progress import PROGRESS_PREFIX

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


class LineSplitter:
    """Reassembles stdout ``stream`` messages into lines and reports the progress lines."""

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
