"""A checkpoint written by a forked child of the kernel, from its copy-on-write memory.

Why: the engine pickles with the C pickler, which holds the interpreter lock for as long as
one variable takes (a dict of a million entries: seconds). A writer *thread* in the kernel
then holds up the person's next cell that long, and cannot be stopped mid-variable. A forked
child has a consistent copy of the namespace as it was at the fork (the kernel was idle: no
cell ran), so the parent goes on at once, a cell started meanwhile neither waits nor tears
the copy, and the autosave completes even while cells run.

What the child must not do: use a native thread pool the parent started (blake3's rayon
pool, torch's OpenMP threads: they have no threads in the child, see ``_child_setup``), touch CUDA (a forked CUDA context is unusable: the caller uses a
thread when CUDA is initialized), write on the kernel's stdout/stderr (ipykernel would forward
it to the notebook), or run the parent's exit handlers (``os._exit``). It publishes only when
the parent says so (``may_publish``, checked under the autosave's lock), and never once the
parent is gone (the answer is then an end of file). What its write learnt (the change cache,
the blobs known good) is sent back, so the next pause writes only what changed since.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pickle
import signal
import struct
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from ..checkpoint import goodblobs

PR_SET_PDEATHSIG = 1


class NotPublished(KeyboardInterrupt):
    """The parent said no (or is gone): the child's write aborts as a whole."""


def _send(fd: int, msg: dict[str, Any]) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(struct.pack("<Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _recv(fd: int) -> dict[str, Any] | None:
    """A message of our own child (the same program: not input from outside); None at EOF."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    body = _read_exactly(fd, struct.unpack("<Q", head)[0])
    return None if body is None else pickle.loads(body)  # our own child


def _child_setup() -> None:
    with contextlib.suppress(Exception):  # die with the kernel (Linux)
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt of the kernel is not for us
    with contextlib.suppress(OSError):
        os.nice(19)  # the kernel's own work (the person's cells) comes first
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - until os._exit
    warnings.simplefilter("ignore")
    # Native thread pools of the parent have no threads here: a job handed to one waits
    # forever. blake3's "all cores" mode uses rayon's pool (started by any earlier write in the
    # kernel): hash on this thread. torch's intra-op pool alike (OpenMP after a fork).
    import blake3

    from ..checkpoint import store

    store.blob_hasher = blake3.blake3
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            torch.set_num_threads(1)


def _good(store_url: str) -> dict[str, Any]:
    """The blobs of ``store_url`` this process knows good (goodblobs' own table: the child
    tells the parent what its write added)."""
    with goodblobs._lock:
        return {d: st for (url, d), st in goodblobs._good.items() if url == store_url}


_frozen = False  # the collector is frozen by us and not thawed yet
_frozen_lock = threading.Lock()


def _freeze_gc() -> bool:
    """Move every object the collector tracks to its permanent generation while the kernel is
    idle and the child writes.

    Why: a collection of the old generation writes into the header of every object it scans,
    so in the parent and in the child (the pickling allocates) it would copy on write every
    page of a large namespace while the child lives. The gc module's documentation gives this
    use of ``gc.freeze()`` before a fork. The person's code never runs frozen: a cell that
    starts thaws it (:func:`thaw`, from the autosave's pre-run hook), so ``gc.collect()``,
    ``gc.get_objects()`` and ``gc.get_referrers()`` see everything as usual, and the child
    keeps its own frozen copy. A notebook that froze objects itself is left as it is."""
    global _frozen
    with _frozen_lock:
        if gc.get_freeze_count() or not gc.isenabled():
            return False
        gc.freeze()
        _frozen = True
        return True


def thaw() -> None:
    """Put what :func:`_freeze_gc` froze back into the oldest generation (once)."""
    global _frozen
    with _frozen_lock:
        if _frozen:
            _frozen = False
            gc.unfreeze()


def _unfreeze_gc(froze: bool) -> None:
    if froze:
        thaw()


def write_in_child(write: Callable[[Callable[[Any], Any]], Any], store_url: str,
                   cache: Any, *, may_publish: Callable[[], bool],
                   started: Callable[[int], None]) -> dict[str, Any]:
    """Run ``write(publish_guard)`` in a forked child; wait for it (the caller is a thread).
    ``store_url``: the store's normalized URL (``Store.url``).

    Returns ``{"done": {...}}`` (the write's id and sizes; ``cache`` and the known-good blobs
    updated from the child), ``{"cancelled": True}`` or ``{"error": "one line"}``."""
    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    froze = _freeze_gc()
    try:
        pid = os.fork()
    except BaseException:
        _unfreeze_gc(froze)
        raise
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(up_r)
            os.close(down_w)
            _child_setup()
            before = _good(store_url)

            def guard(publish: Any) -> Any:
                def guarded(txn: Any, stream: str, data: bytes) -> None:
                    _send(up_w, {"ready": True})
                    if _read_exactly(down_r, 2) != b"go":
                        raise NotPublished()
                    publish(txn, stream, data)
                return guarded

            res = write(guard)
            _send(up_w, {"done": {"checkpoint_id": res.checkpoint_id,
                                  "bytes_written": res.bytes_written,
                                  "bytes_total": res.bytes_total},
                         "cache": (cache.store_url, cache.chunks, cache.storage_hashes),
                         "good": [(d, st) for d, st in _good(store_url).items()
                                  if before.get(d) != st]})
            code = 0
        except BaseException as e:  # noqa: BLE001 - told to the parent, then exit
            with contextlib.suppress(BaseException):
                _send(up_w, {"cancelled": True} if isinstance(e, KeyboardInterrupt)
                      else {"error": f"{type(e).__name__}: {e}"[:400]})
        finally:
            os._exit(code)
    os.close(up_w)
    os.close(down_r)
    try:
        started(pid)
        msg = _recv(up_r)
        if msg is not None and msg.get("ready"):
            ok = may_publish()
            with contextlib.suppress(OSError):
                os.write(down_w, b"go" if ok else b"no")
            msg = _recv(up_r)
    finally:
        os.close(up_r)
        os.close(down_w)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        _unfreeze_gc(froze)
    if msg is None:
        return {"cancelled": True}  # killed (a foreground checkpoint, a stop)
    if "done" in msg:
        url, chunks, hashes = msg["cache"]
        cache.bind(url)
        cache.chunks, cache.storage_hashes = chunks, hashes
        for digest, stamp in msg.get("good") or []:
            goodblobs.remember(store_url, digest, stamp)
    return msg
