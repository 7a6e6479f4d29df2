"""Progress while a checkpoint is written or read: bytes done / total, throttled to ~5 updates/s."""

from __future__ import annotations

import html
import json
import sys
import threading
import time
from typing import Any

from ..units import format_bytes

PROGRESS_PREFIX = "JUPYTER_PAUSE_PROGRESS "
_INTERVAL = 0.2


class _Throttled:
    def __init__(self, interval: float = _INTERVAL) -> None:
        self._interval = interval
        self._last = 0.0
        self._lock = threading.Lock()  # the engine may report from worker threads
        self.done = 0
        self.total = 0

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            self.done, self.total = int(done), int(total)
            now = time.monotonic()
            final = total > 0 and done >= total
            if not final and now - self._last < self._interval:
                return
            self._last = now
            self._emit(self.done, self.total)

    def _emit(self, done: int, total: int) -> None:
        raise NotImplementedError


class _Bar:
    """The object displayed (and updated in place) in the notebook."""

    def __init__(self, label: str, done: int, total: int, message: str | None = None) -> None:
        self.label, self.done, self.total, self.message = label, done, total, message

    def _text(self) -> str:
        if self.message:
            return self.message
        if self.total:
            pct = min(100, int(100 * self.done / self.total))
            return f"{self.label}: {format_bytes(self.done)} / {format_bytes(self.total)} ({pct}%)"
        return f"{self.label}: {format_bytes(self.done)}"

    def __repr__(self) -> str:
        return self._text()

    def _repr_html_(self) -> str:
        if self.message:
            return f"<div>{html.escape(self.message)}</div>"
        mx = max(self.total, 1)
        return (
            f"<div><progress value='{min(self.done, mx)}' max='{mx}' style='width:20em'>"
            f"</progress> <span>{html.escape(self._text())}</span></div>"
        )


class NotebookProgress(_Throttled):
    """An updating display (``display_id``) under the running cell."""

    def __init__(self, label: str) -> None:
        super().__init__()
        from IPython.display import display

        self.label = label
        self.started = time.monotonic()
        self._handle: Any = display(_Bar(label, 0, 0, f"{label}..."), display_id=True)

    def _emit(self, done: int, total: int) -> None:
        if self._handle is not None:
            self._handle.update(_Bar(self.label, done, total))

    def finish(self, message: str) -> None:
        if self._handle is not None:
            self._handle.update(_Bar(self.label, self.done, self.total, message))

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class StdoutProgress(_Throttled):
    """Lines the server parses: ``JUPYTER_PAUSE_PROGRESS {"done": n, "total": m}``."""

    def _emit(self, done: int, total: int) -> None:
        line = PROGRESS_PREFIX + json.dumps({"done": done, "total": total})
        print(line, file=sys.stdout, flush=True)


def parse_progress_line(line: str) -> tuple[int, int] | None:
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        d = json.loads(line[len(PROGRESS_PREFIX) :])
        return int(d["done"]), int(d["total"])
    except (ValueError, KeyError, TypeError):
        return None
