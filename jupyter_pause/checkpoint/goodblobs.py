"""Blobs this process knows to be good: it hashed their bytes itself (writing them, or reading
them back and checking the digest) and the file is the same file, unchanged, since.

A blob's name is its digest, but the file at that name can still be damaged in place (a disk, a
person, a tool). Reusing a blob on its name and size alone let one damaged blob spread into every
later checkpoint, and the next restore lost the whole notebook. So a write references an existing
blob only while it is known good here; otherwise it writes the bytes again (an atomic replace),
and the new checkpoint is whole even when an older one is damaged.

A stamp is what the store says of the file that changes with any rewrite: locally (device, inode,
size, mtime, ctime; ctime cannot be set back by a user); in an object store the object's
generation or ETag. Stores whose objects have no such identity are never trusted this way.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

Stamp = tuple[Any, ...]

_MAX = 200_000  # remembered blobs per process (the oldest are forgotten: they are rewritten)
_good: OrderedDict[tuple[str, str], Stamp] = OrderedDict()
_lock = threading.Lock()


# Told of each blob remembered, and forgotten (stamp None): a forked writer forwards them to its
# parent as they come, so a child that dies mid-write does not leave the parent with stamps its
# claims made stale, nor trusting a blob the child found damaged.
on_remember: Callable[[str, str, Stamp | None], None] | None = None


def remember(store_url: str, digest: str, stamp: Stamp | None) -> None:
    """Record that ``digest`` was hashed by this process while its file had ``stamp``."""
    if stamp is None:
        return
    with _lock:
        _good[(store_url, digest)] = stamp
        _good.move_to_end((store_url, digest))
        while len(_good) > _MAX:
            _good.popitem(last=False)
    hook = on_remember
    if hook is not None:
        hook(store_url, digest, stamp)


def is_good(store_url: str, digest: str, stamp: Stamp | None) -> bool:
    """True when this process hashed ``digest`` and its file still has the same ``stamp``."""
    if stamp is None:
        return False
    with _lock:
        return _good.get((store_url, digest)) == stamp


def forget(store_url: str, digest: str) -> None:
    with _lock:
        _good.pop((store_url, digest), None)
    hook = on_remember
    if hook is not None:
        hook(store_url, digest, None)


def forget_all() -> None:
    """Forget every blob (tests; a process that wants every later write to be a full one)."""
    with _lock:
        _good.clear()
