"""Checkpoint engine: a kernel namespace <-> a signed, content-addressed checkpoint.

Pure library (no Jupyter server or kernel imports; jupyter_core only for the data directory, so the
key, the store and the server's state resolve it alike; torch, numpy and safetensors only when
they are in play)::

    store = open_store()                 # local dir under the Jupyter data dir, or an fsspec URL
    key = load_or_create_key()           # per-user HMAC key, 0600, outside the store
    res = write(namespace, store, key=key, stream="analysis.ipynb", cache=WriteCache())
    rr = read(store, key=key, stream="analysis.ipynb", device="auto")
    namespace.update(rr.values)          # read() never touches a namespace itself

With ``process_state=True`` on both, the process's random streams, cwd, environment and path
changes, settings and warnings filters (:mod:`.procstate`) go along and are put back by read()
before any value is rebuilt; ``WriteResult.process_state`` / ``ReadResult.process_state`` say
what was saved and restored.
"""

from __future__ import annotations

from . import procstate
from .cache import WriteCache
from .collect import gc
from .errors import (
    CheckpointError,
    IntegrityError,
    KeyMismatchError,
    NotFoundError,
    StorageFullError,
)
from .keys import default_key_path, load_or_create_key
from .manifest import Manifest, ReadResult, VariableReport, WriteResult
from .reader import read
from .retention import retain
from .store import Store, default_store_url, open_store
from .writer import write


def open_keyed_store(url: str | None = None, key_path: str | None = None) -> Store:
    """The store at ``url`` with its key, so that listings hold authentic checkpoints only.

    Opened once: the key check (never a new key over existing checkpoints) lists this store.
    """
    store = open_store(url)
    store.key = load_or_create_key(key_path, store=store)
    return store


__all__ = [
    "CheckpointError",
    "IntegrityError",
    "KeyMismatchError",
    "Manifest",
    "NotFoundError",
    "ReadResult",
    "StorageFullError",
    "Store",
    "VariableReport",
    "WriteCache",
    "WriteResult",
    "default_key_path",
    "default_store_url",
    "gc",
    "load_or_create_key",
    "open_keyed_store",
    "open_store",
    "procstate",
    "read",
    "retain",
    "write",
]
