"""Thread synchronization objects: restored when nothing holds or waits on them.

A free lock is indistinguishable from a new free lock, so an unlocked ``Lock``/``RLock`` comes
back as a new one, and the pure-Python objects built on locks (``Condition``, ``Event``,
``Semaphore``, ``queue.Queue``) come back with their state (an Event's flag, a Semaphore's
count, a Queue's items) through their ordinary pickling. A lock held at checkpoint time stays
stale: no thread of the new process holds it, so a copy would be a lie either way (held by
nobody, or free while the code believes it is held). Barriers and threads stay stale.
"""

from __future__ import annotations

import threading
from typing import Any

from ..outcomes import StaleObject
from . import register


def _new_lock() -> Any:
    return threading.Lock()


def _new_rlock() -> Any:
    return threading.RLock()


def _held(kind: str) -> Exception:
    return StaleObject(
        f"{kind}: held when the checkpoint was taken; no thread of a restored kernel would "
        "hold it; re-run its cell"
    )


@register("_thread.lock")
def reduce_lock(lock: Any) -> Any:
    if lock.locked():
        raise _held("_thread.lock")
    return (_new_lock, ())


@register("_thread.RLock")
def reduce_rlock(lock: Any) -> Any:
    if not repr(lock).startswith("<unlocked"):  # owned by this or another thread
        raise _held("_thread.RLock")
    return (_new_rlock, ())


@register("threading.Condition", "threading.Event", "threading.Semaphore")
def reduce_by_state(obj: Any) -> Any:
    # their state is plain attributes around a lock (handled above): the ordinary path
    return NotImplemented
