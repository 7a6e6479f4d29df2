"""A time limit on one variable's serialization, so a ``__getstate__`` that never returns cannot
hold a checkpoint (and the kernel) forever.

The limit is a ``SIGALRM`` timer whose handler raises :class:`SerializeTimeout` in the main
thread, inside the pickler: Python code (a ``__getstate__``, ``__reduce__``, a sleep, a lock
wait) is interrupted there, the pickler unwinds, the variable is skipped with the reason and the
checkpoint goes on with the others. Abandoning the pickle in a worker thread instead would leave
that thread running (and holding the object) after the checkpoint. A C extension that blocks
without returning to the interpreter is not interrupted until it does.

Signals can only be handled in the main thread; elsewhere (or with another SIGALRM handler
installed, or no limit given) the call runs without a limit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .outcomes import SkipVariable

T = TypeVar("T")


class SerializeTimeout(SkipVariable):
    """Raised inside the pickler when a variable took longer than the limit. A SkipVariable:
    the variable is reported as skipped with this reason, and never retried with dill."""


def call_with_limit(limit: float | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    if not limit or limit <= 0 or threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    previous = signal.getsignal(signal.SIGALRM)
    if previous not in (signal.SIG_DFL, signal.SIG_IGN, None):
        return fn(*args, **kwargs)  # someone else's alarm: never steal it
    armed = True

    def on_alarm(signum: int, frame: Any) -> None:
        if armed:  # a late signal after the call returned must not raise elsewhere
            raise SerializeTimeout(f"took longer than {limit:g} s to serialize")

    signal.signal(signal.SIGALRM, on_alarm)
    try:
        # Re-raised every second after the limit: code that swallows the first one (a broad
        # ``except`` in a __getstate__) does not get to hang on.
        signal.setitimer(signal.ITIMER_REAL, limit, 1.0)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            armed = False
    finally:
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
