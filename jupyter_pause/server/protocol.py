"""The server's half of the bridge protocol (see :mod:`jupyter_pause.kernel.bridge`): the code
string of a call, its result in the reply, and the progress lines it prints.

Pure: no messaging (that is :mod:`.bridge`), no jupyter_server, no IPython.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import re
import shlex
from collections.abc import Awaitable, Callable
from typing import Any

from .. import __version__
from ..kernel.progress import PROGRESS_PREFIX
from ..kernel.side import PACKAGE, PROTOCOL

EXPR_NAME = "jupyter_pause"
SIDE_NAME = "jupyter_pause_kernel_side"
_MODULE = "__import__('jupyter_pause.kernel.bridge', fromlist=['_'])"
RESULT_EXPRESSION = f"{_MODULE}.last_result()"
# Whether the kernel's interpreter has the package at all (stdlib only, raises nothing).
_HAVE = "__import__('importlib.util', fromlist=['_']).find_spec('jupyter_pause')"
# Sent with every call: what the kernel side is (kernel/side.py), or, where the package is not
# installed, the kernel's own interpreter, the one that must install it. It is evaluated after
# the code, so it answers also when the code did nothing.
SIDE_EXPRESSION = (
    f"__import__('jupyter_pause.kernel.side', fromlist=['_']).describe() if {_HAVE} "
    "else {'installed': False, 'python': __import__('sys').executable, 'language': 'python'}"
)
#: The "function" that only asks what the kernel side is (no code of ours runs in the kernel).
PROBE = "kernel_side"

ProgressCallback = Callable[[int, int], "None | Awaitable[None]"]


def bridge_code(func: str, **kwargs: Any) -> str:
    """The code string of one bridge call (a single expression; binds no name). It tells the
    kernel side our protocol, and does nothing in a kernel without the package (instead of
    failing: a failed execution evaluates no user expression, and :data:`SIDE_EXPRESSION` is
    how the server learns which interpreter lacks it)."""
    if func == PROBE:
        return "None"
    return f"{_MODULE}.call({func!r}, {json.dumps(kwargs)!r}, {PROTOCOL}) if {_HAVE} else None"


def user_expressions(func: str) -> dict[str, str]:
    """The ``user_expressions`` of a bridge call."""
    if func == PROBE:
        return {SIDE_NAME: SIDE_EXPRESSION}
    return {EXPR_NAME: RESULT_EXPRESSION, SIDE_NAME: SIDE_EXPRESSION}


def install_command(python: str | None) -> str:
    """The command that installs the kernel side this server speaks to into ``python``."""
    pin = f"=={__version__}" if re.fullmatch(r"\d+(\.\d+)*", __version__) else ""
    return f"{shlex.quote(python) if python else 'python'} -m pip install {PACKAGE}{pin}"


def side_error(side: dict[str, Any], python: str | None = None) -> str | None:
    """Why this kernel side cannot take a bridge call (one line, with the command that fixes
    it), or None when it can. ``python``: the interpreter to name where the kernel did not say
    (its kernelspec's)."""
    py = side.get("python") or python
    cmd = install_command(py)
    if side.get("installed") is False:
        where = f" ({py})" if py else ""
        return (f"{PACKAGE} is not installed in this kernel's environment{where}; install it "
                f"there, then restart the kernel: `{cmd}`")
    protocol = side.get("protocol")
    if side.get("installed") and protocol != PROTOCOL:
        have = f"{PACKAGE} {side.get('version') or '(unknown version)'}"
        speaks = (f"protocol {protocol}" if isinstance(protocol, int)
                  else "from before protocol versions")
        return (f"this kernel has {have} ({speaks}); the server needs protocol {PROTOCOL}: "
                f"`{cmd}`, then restart the kernel")
    return None


def parse_side(reply: dict[str, Any]) -> dict[str, Any] | None:
    """What the kernel side is, from a bridge call's ``execute_reply`` (or its content): a dict
    as :func:`jupyter_pause.kernel.side.describe` returns, ``{"installed": False, "python"}``
    for a kernel without the package, None where the reply does not tell."""
    content = reply.get("content", reply)
    if content.get("status") != "ok":
        ename, evalue = content.get("ename", ""), content.get("evalue", "")
        if ename == "ModuleNotFoundError" and "jupyter_pause" in evalue:
            return {"installed": False, "python": None, "language": "python"}
        if ename == "TypeError" and "call()" in evalue:  # a kernel side without ``protocol``
            return {"installed": True, "protocol": None, "version": None, "python": None,
                    "language": "python"}
        return None
    expr = (content.get("user_expressions") or {}).get(SIDE_NAME)
    if not isinstance(expr, dict):
        return None
    if expr.get("status") != "ok":
        if expr.get("ename") == "ModuleNotFoundError":  # the package, from before kernel/side.py
            return {"installed": True, "protocol": None, "version": None, "python": None,
                    "language": "python"}
        return None
    try:
        side = ast.literal_eval((expr.get("data") or {}).get("text/plain", ""))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return side if isinstance(side, dict) else None


def parse_reply(reply: dict[str, Any], python: str | None = None,
                func: str | None = None) -> dict[str, Any]:
    """The bridge's result dict from an ``execute_reply`` message (or its content). A kernel
    without the package, or with one of another protocol, is ``{"ok": False, "error_kind":
    "kernel_side", "error": ...}``, the error naming the command that fixes it (``python``: the
    interpreter to name where the kernel did not say which it is). For :data:`PROBE` the
    result is the kernel side itself, ``{"ok": True, "installed": ..., ...}``."""
    content = reply.get("content", reply)
    side = parse_side(content)
    why = side_error(side, python) if side is not None else None
    if why:
        return {"ok": False, "error": why, "error_kind": "kernel_side"}
    if func == PROBE:
        if side is None:
            return {"ok": False, "error": "the kernel did not say what it runs"}
        return {"ok": True, **side}
    if content.get("status") != "ok":
        ename, evalue = content.get("ename", "error"), content.get("evalue", "")
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
    if result.get("protocol_mismatch"):  # the kernel side refused our protocol itself
        theirs = result.get("kernel_side")
        theirs = theirs if isinstance(theirs, dict) else {}
        return {"ok": False, "error_kind": "kernel_side",
                "error": side_error({"installed": True, **theirs}, python) or result.get("error")}
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
