"""Writing a large blob at device speed: O_DIRECT through page-aligned bounce buffers.

Buffered writes of a multi-GiB checkpoint run at about a third of what the disk can do: every byte
is first copied into the page cache, dirtied, then written back by the kernel's flusher while
fsync waits. With O_DIRECT the bytes go from our buffer to the device. The source memory (a tensor
storage, a numpy buffer) is neither page-aligned nor at an aligned file offset, so each piece is
copied into an aligned bounce buffer (memcpy runs ~10x faster than the disk) while another thread
writes the previous buffer: copy, hash and write overlap, and the device is never idle.

Where O_DIRECT is refused (tmpfs before Linux 6.6, some FUSE and network file systems answer
EINVAL, at open or at the first write) the same pipeline writes buffered; the reason is logged
once per file system.

The unaligned tail: the last buffer is written padded with zeros to the alignment, and the file
is cut back to its real size with ftruncate before the fsync.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

ALIGN = 4096  # covers 512-byte and 4 KiB logical sectors; memory, offsets and lengths use it
DIRECT_MIN = 8 << 20  # smaller blobs: buffered (a bounce pipeline costs more than it saves)
# Per buffer: 3 x 32 MiB per blob, two blobs at a time = 192 MiB at most, and under 5% of each
# blob (bounce_size). One pwrite is one buffer, and a disk takes larger requests faster: on
# the 2-core test machine a 4 GiB checkpoint took 0.97-0.98x the time of bench_checkpoint's
# O_DIRECT reference with 32 MiB buffers, 1.06-1.20x with 8 MiB and 1.08x with 24 MiB
# (medians of 6 runs each, the order rotated: the first write after another runs slower).
BOUNCE_MAX = 32 << 20
BOUNCE_MIN = 1 << 20
DEPTH = 3  # buffers per blob: one being filled, one being written, one queued behind it
_O_DIRECT = getattr(os, "O_DIRECT", 0)

_refused_lock = threading.Lock()
_refused: dict[int, str] = {}  # st_dev -> why O_DIRECT is not used there (logged once)


def supported() -> bool:
    return _O_DIRECT != 0


def bounce_size(size_hint: int) -> int:
    """Bounce buffer size for a blob: DEPTH buffers stay under 5% of the blob (memory bound)."""
    b = min(BOUNCE_MAX, max(BOUNCE_MIN, size_hint // (DEPTH * 21)))
    return b - b % ALIGN


def _note_refusal(path: str, why: str) -> None:
    try:
        dev = os.stat(os.path.dirname(path) or ".").st_dev
    except OSError:
        dev = -1
    with _refused_lock:
        if dev in _refused:
            return
        _refused[dev] = why
    log.info("checkpoint blobs under %s are written buffered: %s", os.path.dirname(path), why)


def refused_here(path: str) -> str | None:
    """Why O_DIRECT is not used on the file system of ``path`` (None: it is, or not tried yet)."""
    try:
        return _refused.get(os.stat(path).st_dev)
    except OSError:
        return None


def open_new(path: str, mode: int = 0o600, *, direct: bool = True) -> tuple[int, bool]:
    """Create ``path`` exclusively for writing; with O_DIRECT where the file system takes it.
    Returns (fd, direct)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    if direct and _O_DIRECT and refused_here(os.path.dirname(path)) is None:
        try:
            return os.open(path, flags | _O_DIRECT, mode), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            _note_refusal(path, f"O_DIRECT refused at open ({e.strerror})")
            # the failed open may have created the file (Linux checks O_DIRECT after creating)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return os.open(path, flags, mode), False


class Bounce:
    """DEPTH page-aligned buffers (anonymous mappings, so aligned and returned to the OS on
    close), handed out and returned through a free list."""

    def __init__(self, size: int, depth: int = DEPTH) -> None:
        self.size = size
        self._maps = [mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                      for _ in range(depth)]
        self.free = [memoryview(m) for m in self._maps]

    def close(self) -> None:
        self.free.clear()
        for m in self._maps:
            # a slice still referenced by an exception's frames keeps its map until it is freed
            with contextlib.suppress(BufferError):
                m.close()
        self._maps.clear()


class DirectSink:
    """Sequential writer of one new file: ``write`` pieces, then ``finish`` (tail, truncate,
    fsync). Pieces are copied into bounce buffers and written by one I/O thread, so the caller's
    copy and hash of the next piece overlap the device write of the previous one."""

    def __init__(self, fd: int, direct: bool, path: str, size_hint: int) -> None:
        self.fd, self.direct, self.path = fd, direct, path
        self.bounce = Bounce(bounce_size(size_hint))
        self.io = cf.ThreadPoolExecutor(1, thread_name_prefix="jp-dio")
        self.inflight: list[tuple[cf.Future[Any], memoryview]] = []
        self.cur: memoryview | None = None
        self.fill = 0
        self.offset = 0  # file offset of the current buffer
        self.size = 0
        self.padded = False

    # -- the caller's side ---------------------------------------------------------------------
    def write(self, data: memoryview, hasher: Any = None) -> None:
        """Copy ``data`` into bounce buffers; ``hasher`` hashes the copies, so the name is
        that of the bytes written even if the source changes meanwhile."""
        pos, n = 0, len(data)
        while pos < n:
            if self.cur is None:
                self.cur = self._take()
            k = min(n - pos, len(self.cur) - self.fill)
            self.cur[self.fill : self.fill + k] = data[pos : pos + k]
            if hasher is not None:  # blake3 releases the GIL: overlaps the I/O thread's write
                hasher.update(self.cur[self.fill : self.fill + k])
            self.fill += k
            pos += k
            if self.fill == len(self.cur):
                self._submit(self.fill)
        self.size += n

    def finish(self) -> int:
        """Write the tail, cut the file to its size, fsync. Returns the size."""
        if self.cur is not None and self.fill:
            pad = -self.fill % ALIGN if self.direct else 0
            if pad:  # the pad never reaches the blob: ftruncate below cuts it off
                self.cur[self.fill : self.fill + pad] = bytes(pad)
                self.padded = True
            self._submit(self.fill + pad)
        self._drain(0)
        if self.padded:
            os.ftruncate(self.fd, self.size)
        os.fsync(self.fd)
        return self.size

    def close(self) -> None:
        """Release threads and buffers (after finish, or to abandon the write)."""
        for f, _ in self.inflight:
            f.cancel()
        self.io.shutdown(wait=True)
        self.inflight.clear()
        self.cur = None
        self.bounce.close()

    # -- internals -----------------------------------------------------------------------------
    def _take(self) -> memoryview:
        while not self.bounce.free:
            self._drain(len(self.inflight) - 1)
        self.fill = 0
        return self.bounce.free.pop()

    def _submit(self, length: int) -> None:
        buf, self.cur = self.cur, None
        assert buf is not None
        self.inflight.append((self.io.submit(self._pwrite, buf, length, self.offset), buf))
        self.offset += length
        self.fill = 0

    def _drain(self, keep: int) -> None:
        """Wait until at most ``keep`` writes are in flight; their buffers go back to the pool."""
        while len(self.inflight) > keep:
            f, buf = self.inflight.pop(0)
            f.result()
            self.bounce.free.append(buf)

    def _pwrite(self, buf: memoryview, length: int, offset: int) -> None:
        mv = buf[:length]
        while len(mv):
            try:
                n = os.pwrite(self.fd, mv, offset)
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                self._go_buffered(e)
                continue
            mv = mv[n:]
            offset += n

    def _go_buffered(self, e: OSError) -> None:
        """The file system took O_DIRECT at open but refuses the I/O: clear the flag on this
        descriptor and go on buffered (Linux allows toggling O_DIRECT with F_SETFL)."""
        import fcntl

        fl = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fl & ~_O_DIRECT)
        self.direct = False
        _note_refusal(self.path, f"O_DIRECT write refused ({e.strerror})")


READ_PIECE = 32 << 20  # one read request of a restore
READ_DEPTH = 4  # read requests in flight per blob


def read_file(
    fd: int,
    path: str,
    mv: memoryview,
    size: int,
    hasher: Any,
    tick: Callable[[int], None] | None = None,
) -> int:
    """Read the first ``size`` bytes of ``fd`` into ``mv`` (page-aligned, e.g. an anonymous
    mapping), hashing them in file order; returns how many were there (less if it shrank).

    The measured cause of slow and swinging restores was the page cache's readahead: one
    buffered stream of 16 MiB reads ran at 0.5-1.5 GB/s from one run to the next, with a copy
    out of the page cache on top. Here the bytes go from the device into ``mv`` with O_DIRECT,
    READ_DEPTH requests at a time (the virtual disk serves parallel requests faster than one
    stream), while the caller's thread hashes the pieces that have landed. Where O_DIRECT is
    refused the same pipeline reads buffered. The unaligned tail is read buffered."""
    import fcntl

    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    direct = False
    if _O_DIRECT and refused_here(os.path.dirname(path)) is None:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT)
            direct = True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            _note_refusal(path, f"O_DIRECT refused for reads ({e.strerror})")
    state = {"direct": direct}
    lock = threading.Lock()

    def buffered(e: OSError) -> None:
        with lock:
            if state["direct"]:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
                state["direct"] = False
                _note_refusal(path, f"O_DIRECT read refused ({e.strerror})")

    def piece(a: int, b: int) -> int:
        got = a
        while got < b:
            # Read before the call: another reader may turn O_DIRECT off while this read fails
            # for it, and this one must then go again, not fail the restore.
            was_direct = state["direct"]
            try:
                r = os.preadv(fd, [mv[got:b]], got)
            except OSError as e:
                if e.errno != errno.EINVAL or not was_direct:
                    raise
                buffered(e)
                continue
            if not r:
                break
            got += r
        return got - a

    aligned = size - size % ALIGN if direct else size
    spans = [(a, min(a + READ_PIECE, aligned)) for a in range(0, aligned, READ_PIECE)]
    done = 0
    pool = cf.ThreadPoolExecutor(READ_DEPTH, thread_name_prefix="jp-dread")  # threads: lazily
    futs: list[cf.Future[int]] = []
    try:
        for a, b in spans:
            futs.append(pool.submit(piece, a, b))
        for (a, b), f in zip(spans, futs, strict=False):
            r = f.result()
            hasher.update(mv[a : a + r])
            done += r
            if tick:
                tick(r)
            if r < b - a:  # end of file: the size check of the caller refuses the blob
                return done
    finally:
        for f in futs:
            f.cancel()
        pool.shutdown(wait=True)
        if state["direct"]:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)  # the tail and later reads: buffered
    if done < size:
        r = piece(done, size)
        hasher.update(mv[done : done + r])
        done += r
        if tick:
            tick(r)
    return done


def write_file(
    fd: int,
    direct: bool,
    path: str,
    chunks: Iterable[Any],
    size_hint: int,
    hasher: Any,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write the concatenation of ``chunks`` to ``fd`` through a :class:`DirectSink`, hashing
    each piece; fsync'd on return. Returns the size."""
    sink = DirectSink(fd, direct, path, size_hint)
    step = sink.bounce.size
    try:
        for chunk in chunks:
            mv = memoryview(chunk).cast("B")
            for i in range(0, len(mv), step):
                piece = mv[i : i + step]
                sink.write(piece, hasher)
                if progress:
                    progress(len(piece))
        return sink.finish()
    finally:
        sink.close()
