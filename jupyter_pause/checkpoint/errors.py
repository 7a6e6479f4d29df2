"""Errors raised by the checkpoint engine; every ``str()`` is one line meant for a person."""

from __future__ import annotations


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
