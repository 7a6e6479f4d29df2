"""Running the picklers on deep structures (a linked list of 200k nodes, a list nested 100k deep).

The C pickler and dill recurse once or twice per nesting level. In a thread of ours with a big
stack, with the recursion limit raised to what that stack holds, they get through; the limit is
put back when the work ends. The stack is virtual memory: only the pages the recursion touches
are ever committed. On Python 3.12 and 3.13 the C recursion limit is a fixed constant that
``sys.setrecursionlimit`` does not raise, so there a structure deeper than it still ends in
RecursionError (the caller skips the variable with that reason).

The caller's thread waits; when it is interrupted there (the time limit's SIGALRM, Ctrl-C), the
same interruption is delivered to the worker thread, and the call returns only once the worker
has stopped: no pickler is left running behind a skipped variable.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

_STACKS = (1 << 30, 1 << 28, 1 << 26)  # tried in turn: a platform may refuse a 1 GiB stack
_BYTES_PER_LEVEL = 512  # C stack per recursion level allowed for; the C pickler uses ~200
_STOP_WAIT = 10.0  # seconds to wait for an interrupted worker before leaving it
_lock = threading.Lock()  # one deep call at a time: the recursion limit is process-wide


class _Interrupted(BaseException):
    """Delivered into the worker when the waiting caller was interrupted."""


def call_deep(fn: Callable[[], T]) -> T:
    """``fn()`` in a thread with a big stack and a recursion limit to match; its result or
    exception comes back here."""
    out: dict[str, Any] = {}

    ended = threading.Event()  # not thread.is_alive(): see _wait

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e
        finally:
            ended.set()

    go = threading.Event()  # the worker may only start recursing once the limit is up
    with _lock:
        old = sys.getrecursionlimit()
        thread = None
        try:
            thread, size = _start(target, go)
            sys.setrecursionlimit(max(old, size // _BYTES_PER_LEVEL))
            go.set()
            _wait(ended)
        finally:
            if thread is not None and not ended.is_set():
                go.set()
                _stop(thread, ended)
            sys.setrecursionlimit(old)
    if "error" in out:
        raise out["error"]
    value: T = out["value"]
    return value


def _start(target: Callable[[], None], go: threading.Event) -> tuple[threading.Thread, int]:
    def run() -> None:
        go.wait()
        target()

    previous = threading.stack_size()
    try:
        for size in _STACKS:
            try:
                threading.stack_size(size)
                thread = threading.Thread(target=run, name="jp-deep-pickle", daemon=True)
                thread.start()
            except (RuntimeError, MemoryError, ValueError):
                continue
            return thread, size
    finally:
        threading.stack_size(previous)
    raise RuntimeError("could not start a thread with a large stack for a deep structure")


def _wait(ended: threading.Event) -> None:
    # Not thread.join(): on Python 3.11 a join interrupted by an exception (the limit's
    # SIGALRM, Ctrl-C) marks the thread stopped while it runs on (threading's
    # _wait_for_tstate_lock releases the running thread's tstate lock), so is_alive() said
    # False and the worker was left pickling behind the skipped variable, unstopped, unlogged.
    while not ended.wait(0.05):  # short waits: the caller's signal handlers run in between
        pass


def _stop(thread: threading.Thread, ended: threading.Event) -> None:
    """Raise _Interrupted in the worker (at its next Python instruction) until it ends."""
    deadline = time.monotonic() + _STOP_WAIT
    while not ended.is_set() and time.monotonic() < deadline:
        # the whole step guarded: the limit's alarm repeats every second and may land in the
        # ctypes call too; escaping here left the worker running with no warning
        try:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident or 0), ctypes.py_object(_Interrupted)
            )
            ended.wait(0.5)
        except BaseException:  # noqa: BLE001, S110 - the limit's repeated alarm: keep waiting
            pass
    if not ended.is_set():
        log.warning("a deep pickling thread did not stop after %g s; left running", _STOP_WAIT)
