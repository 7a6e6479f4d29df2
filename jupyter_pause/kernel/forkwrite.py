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
parent is gone (the answer is then an end of file). What its write learnt (the change cache
at the end; each blob known good as it comes, see ``learnt``) is sent back, so the next pause
writes only what changed since.

Giving memory back (:func:`_give_back`): while the child lives, every page it shares with the
kernel is copied on the kernel's first write to it, so a cell that changes a 30 MB tensor took
40-65 ms instead of 1 ms (a transparent huge page is split, then copied 4 KiB at a time). Once
the engine has hashed a storage it reuses unchanged and no later read of the write covers it
(``checkpoint.packs``; a rewrite of its old pack copies it from the store, locally, and on an
object store it waits until its pack is sure to be kept), the write does not read its memory
again; the child maps it away, so the kernel's later writes to it copy nothing. The engine hashes the
storages the walk found before it pickles anything (``TensorPacks.prehash``), so that comes
about 0.2 s after the fork for 4 GiB, the time it takes to read them once. Mapped to an inaccessible
reservation, not ``MADV_DONTNEED``: a read of that memory by anything we missed ends the child
(SIGSEGV: the autosave fails and the previous one stays) instead of reading zeros into a
checkpoint; after such a crash this kernel stops giving memory back.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import faulthandler
import functools
import gc
import os
import pickle
import resource
import signal
import struct
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from ..checkpoint import goodblobs

PR_SET_PDEATHSIG = 1
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS)
PROT_NONE = 0
RESERVE = 0x02 | 0x10 | 0x20 | 0x4000  # MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS | MAP_NORESERVE
# those values hold on these (other Linux ports number the flags differently)
GIVE_BACK_MACHINES = ("x86_64", "aarch64")
# Each storage given back splits a mapping in three: at most this many, well below the
# kernel's vm.max_map_count (65530 by default), so the child's own mappings never run out.
GIVE_BACK_MAX = 8192

_give_back_ok = True  # False once children that gave memory back crashed twice (this process)
_early_ok = True  # False once one did: memory is then given back only after the pickling
_kept: list[Any] = []  # in the child: storages whose memory it gave back, never freed there


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


def _recv_learning(fd: int, store_url: str) -> dict[str, Any] | None:
    """The child's next message, remembering (or forgetting) on the way the blobs it learnt of."""
    while True:
        msg = _recv(fd)
        if msg is None or "learnt" not in msg:
            return msg
        digest, stamp = msg["learnt"]
        if stamp is None:  # the child found it damaged or dropped it
            goodblobs.forget(store_url, digest)
        else:
            goodblobs.remember(store_url, digest, stamp)


def _child_setup() -> None:
    with contextlib.suppress(Exception):  # die with the kernel (Linux)
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt of the kernel is not for us
    with contextlib.suppress(Exception):  # a crash (see _give_back) dumps no copy of the kernel
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    faulthandler.disable()
    for sig in CRASH_SIGNALS:  # a handler of the kernel's that returns would fault forever
        signal.signal(sig, signal.SIG_DFL)
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


@functools.cache
def _mmap() -> Any:
    fn = ctypes.CDLL(None, use_errno=True).mmap
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_long]
    return fn


def _give_back(storages: list[Any]) -> int:
    """In the child: replace the whole pages inside each storage's memory by an inaccessible
    reservation (its pages are no longer shared with the kernel); returns the bytes.

    A reservation rather than a hole: nothing mapped later can land there, so a stray read
    faults instead of reading another allocation's bytes. The first and last page of each are
    kept: malloc's bookkeeping for the block (and its neighbour) lives there. The storages stay
    referenced until ``os._exit``, so nothing in the child frees (and reuses) that memory."""
    if not sys.platform.startswith("linux") or os.uname().machine not in GIVE_BACK_MACHINES:
        return 0
    mmap = _mmap()
    given = 0
    for us in storages:
        if len(_kept) >= GIVE_BACK_MAX:
            break
        a, n = us.data_ptr(), us.nbytes()
        start, end = (a // PAGE + 1) * PAGE, ((a + n - 1) // PAGE) * PAGE
        if end <= start:
            continue
        _kept.append(us)  # even if the call fails: it may have unmapped the range first
        if mmap(start, end - start, PROT_NONE, RESERVE, -1, 0) == start:
            given += end - start
    return given


def write_in_child(write: Callable[[Callable[[Any], Any], Any], Any], store_url: str,
                   cache: Any, *, may_publish: Callable[[], bool],
                   started: Callable[[int], None], lock: Any,
                   may_fork: Callable[[], bool], ended: Callable[[], None],
                   after: Callable[[], None] | None = None,
                   settled: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run ``write(publish_guard, done_with)`` in a forked child; wait for it (the caller is a
    thread). ``done_with``: the engine's hook for storages it will not read again (None when
    this kernel no longer gives memory back).
    ``store_url``: the store's normalized URL (``Store.url``).

    ``may_fork()`` is asked holding ``lock``, and the fork happens under it: a cell that starts
    (its hook takes the same lock) comes either before the check, and there is no fork, or
    after the fork; a copy is never taken in the middle of a cell. The child never takes
    ``lock``. ``started(pid)`` comes after the fork, ``ended()`` once the child has ended but
    before it is reaped (its pid cannot be reused until then, so a kill sent before
    ``ended()`` never reaches another process). ``after()`` runs in the child once the result
    is sent (the autosaves' retention: its reading of every manifest would otherwise hold the
    kernel's interpreter lock while the person's next cell runs); ``settled()`` comes when the
    parent has the result, from then on the child may be killed (it only runs ``after``); the
    call returns when the child has ended, and a failure or a kill of ``after`` changes
    nothing of the result.

    Returns ``{"done": {...}}`` (the write's id and sizes; ``cache`` and the known-good blobs
    updated from the child), ``{"cancelled": True}`` (no fork, or the child was killed:
    ``"signal"`` names the signal then) or ``{"error": "one line"}``."""
    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    fds = (up_r, up_w, down_r, down_w)
    parent = os.getpid()
    froze = _freeze_gc()
    try:
        with lock:
            pid = os.fork() if may_fork() else None
    except BaseException:
        if os.getpid() != parent:  # a child must never go back into the kernel's code
            os._exit(1)
        _unfreeze_gc(froze)
        _close(fds)
        raise
    if pid is None:
        _unfreeze_gc(froze)
        _close(fds)
        return {"cancelled": True}
    if pid == 0:  # the child: never returns
        code = 1
        sending = threading.RLock()  # one message at a time: the write's pool threads claim too

        def send(msg: dict[str, Any]) -> None:
            with sending:
                _send(up_w, msg)

        try:
            os.close(up_r)
            os.close(down_w)
            _child_setup()
            done_with = _GiveBack(_early_ok)

            def learnt(url: str, digest: str, stamp: Any) -> None:
                # A claim refreshes a blob's time, so the stamp the parent holds goes stale: it
                # hears the new one at once, even if this child dies before it is done.
                if url == store_url:
                    with contextlib.suppress(OSError):
                        send({"learnt": (digest, stamp)})

            goodblobs.on_remember = learnt

            def guard(publish: Any) -> Any:
                def guarded(txn: Any, stream: str, data: bytes) -> None:
                    send({"ready": True})
                    if _read_exactly(down_r, 2) != b"go":
                        raise NotPublished()
                    publish(txn, stream, data)
                return guarded

            res = write(guard, done_with if _give_back_ok else None)
            send({"done": {"checkpoint_id": res.checkpoint_id,
                           "bytes_written": res.bytes_written,
                           "bytes_total": res.bytes_total,
                           "bytes_given_back": done_with.given},
                  "cache": (cache.store_url, cache.chunks, cache.storage_hashes,
                            cache.pack_of)})
            goodblobs.on_remember = None  # the parent reads no more
            code = 0
            if after is not None:
                with contextlib.suppress(Exception):  # a clean-up: the next round does it
                    after()
        except BaseException as e:  # noqa: BLE001 - told to the parent, then exit
            goodblobs.on_remember = None
            with contextlib.suppress(BaseException):
                send({"cancelled": True} if isinstance(e, KeyboardInterrupt)
                     else {"error": f"{type(e).__name__}: {e}"[:400],
                           "gave_back": bool(_kept) and _bad_address(e)})
        finally:
            os._exit(code)
    os.close(up_w)
    os.close(down_r)
    status = 0
    try:
        started(pid)
        msg = _recv_learning(up_r, store_url)
        if msg is not None and msg.get("ready"):
            ok = may_publish()
            with contextlib.suppress(OSError):
                os.write(down_w, b"go" if ok else b"no")
            msg = _recv_learning(up_r, store_url)
        if msg is not None and "done" in msg and settled is not None:
            settled()
    finally:
        os.close(up_r)
        os.close(down_w)
        if hasattr(os, "waitid"):  # Linux; macOS has it from Python 3.13
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped yet
        else:  # a kill in the instant between this reap and ended() could reach a reused pid
            with contextlib.suppress(ChildProcessError):
                status = os.waitpid(pid, 0)[1]
        ended()
        with contextlib.suppress(ChildProcessError):
            status = os.waitpid(pid, 0)[1]
        _unfreeze_gc(froze)
    if msg is None and os.WIFSIGNALED(status) and os.WTERMSIG(status) in CRASH_SIGNALS:
        return {"error": crashed(os.WTERMSIG(status))}
    if msg is None:  # killed: by the kernel (a foreground checkpoint, a stop) or from outside
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        return {"cancelled": True, "signal": _signame(sig) if sig else None}
    if "error" in msg and msg.get("gave_back"):
        msg["error"] += crashed(None)  # it may come of the memory given back: not again
    if "done" in msg:
        url, chunks, hashes, pack_of = msg["cache"]
        cache.bind(url)
        cache.chunks, cache.storage_hashes, cache.pack_of = chunks, hashes, pack_of
    return msg


class _GiveBack:
    """The engine's ``done_with`` hook in the child. ``before_pickling``: the engine may give
    memory back as soon as it has hashed the storages, before anything is pickled
    (``TensorPacks.prehash``); off once a child that did so crashed (see :func:`crashed`)."""

    def __init__(self, before_pickling: bool) -> None:
        self.before_pickling = before_pickling
        self.given = 0

    def __call__(self, storages: list[Any]) -> None:
        self.given += _give_back(storages)


def _bad_address(e: BaseException | None) -> bool:
    """Whether a failure may come of memory given back: a system call handed such memory
    fails with EFAULT ("Bad address"; a read of it in user space ends the child instead)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if (isinstance(e, OSError) and e.errno == errno.EFAULT) or "Bad address" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:  # a real-time signal has no name
        return f"signal {sig}"


def _close(fds: tuple[int, ...]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def crashed(sig: int | None) -> str:
    """A child ended by a memory fault (``sig``), or failed on a bad address after giving
    memory back (None): the cause may be memory it gave back and then read (something shared
    a storage's bytes unseen, or a ``__getstate__`` read a tensor while it was pickled). This
    kernel first stops giving memory back before the pickling, then altogether; returns what
    to tell."""
    global _give_back_ok, _early_ok
    if _early_ok:
        _early_ok = False
        then = "; this kernel's autosaves now give memory back only once it is pickled"
    elif _give_back_ok:
        _give_back_ok = False
        then = "; this kernel's autosaves no longer give memory back"
    else:
        then = ""
    return then if sig is None else f"the autosave's writer crashed ({signal.Signals(sig).name}){then}"
