"""Errors raised by the checkpoint engine; every ``str()`` is one line meant for a person."""

from __future__ import annotations

import errno

# A write that failed with one of these ran out of space (a quota, a file size limit too).
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class CheckpointError(Exception):
    """Base class: a checkpoint could not be written or read."""


class NotFoundError(CheckpointError):
    """No checkpoint (or no such checkpoint id) in the store."""


class IntegrityError(CheckpointError):
    """A manifest or blob failed verification (corrupt, truncated or tampered with)."""


class KeyMismatchError(IntegrityError):
    """The checkpoint was signed with another key."""


class StorageFullError(CheckpointError):
    """The store ran out of space; the partial files were removed, older checkpoints are intact."""


def error_type(exc: BaseException) -> str:
    """The name of ``exc``'s type as it crosses the kernel bridge: the nearest class of this
    module in its MRO (a subclass defined elsewhere still reads as, e.g., StorageFullError),
    else its own class name. The server maps it to a failure reason, never the message.
    An OSError out of space that no store call wrapped is a StorageFullError too."""
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        return StorageFullError.__name__
    for cls in type(exc).__mro__:
        if cls.__module__ == __name__:
            return cls.__name__
    return type(exc).__name__
