"""The local file store's file-system rules: private folders, no link followed, durable renames.

The store is a trust boundary (see :mod:`.store`): a planted link, FIFO or foreign folder must
never make us read, write or delete a file outside the store's root.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import stat
import sys
from collections.abc import Callable, Iterable
from typing import Any

from . import directio
from .errors import IntegrityError

log = logging.getLogger(__name__)

CHUNK = 16 << 20  # what one write (and one read of a restore) handles at a time
FADVISE = hasattr(os, "posix_fadvise") and sys.platform.startswith("linux")
SET_ASIDE_TRIES = 5  # a folder's place taken again and again: someone is fighting us, give up


def inside(root: str, path: str) -> bool:
    """True if ``path`` lies under ``root`` with no symbolic link on the way (the file itself
    may be one: unlinking removes the link, not its target)."""
    rel = os.path.relpath(path, root)
    if rel == "." or rel.startswith("..") or os.path.isabs(rel):
        return False
    cur = root
    for part in rel.split(os.sep)[:-1]:
        cur = os.path.join(cur, part)
        try:
            if not stat.S_ISDIR(os.lstat(cur).st_mode):
                return False
        except OSError:
            return False
    return True


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file at ``path``: no link is followed (a planted
    link would make us read a foreign file) and a planted FIFO or device cannot block us."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IntegrityError(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (see :func:`open_regular`); IntegrityError when
    it is larger than ``limit``."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        if limit is not None and os.fstat(fd).st_size > limit:
            raise IntegrityError(f"{path} is too large to be a manifest")
        return f.read()


def makedirs_private(root: str, path: str) -> None:
    """Create ``path`` (under ``root``) with every folder 0700 (os.makedirs applies its mode only
    to the last folder).

    Below the store's top-level folders, anything in the way that is not a folder (a link
    leading elsewhere, a file, a FIFO) is set aside (:func:`_set_aside`), never followed nor
    deleted: we never created it, and refusing would make every later write whose blob name
    starts with those two characters fail for good. A top-level folder (``blobs``, ``tmp``...)
    that is a link is refused: that is a set-up someone made, to be fixed where it was made."""
    rel = os.path.relpath(path, root)
    if rel.startswith("..") or os.path.isabs(rel):
        os.makedirs(path, exist_ok=True)
        return
    parts = [] if rel == "." else rel.split(os.sep)
    cur = root
    for depth, part in enumerate([None, *parts]):
        cur = cur if part is None else os.path.join(cur, part)
        for _ in range(SET_ASIDE_TRIES):
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                if part is None:
                    os.makedirs(os.path.dirname(cur), exist_ok=True)
                try:
                    os.mkdir(cur, 0o700)
                except FileExistsError:
                    continue  # another writer made it (or something else): look again
                _narrow(cur)
                continue
            if part is None or stat.S_ISDIR(st.st_mode):
                break
            if depth < 2:
                raise OSError(errno.ENOTDIR, f"{cur} is not a folder (a link?)")
            _set_aside(cur)
        else:
            raise OSError(errno.ENOTDIR, f"{cur} is not a folder (a link?) and keeps coming back")


def _narrow(folder: str) -> None:
    """Mode 0700 on a folder just made (the umask may have narrowed it further, never wider);
    through a descriptor, so a link swapped in meanwhile is not followed."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return  # no longer a folder: the caller looks again
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _set_aside(path: str) -> None:
    """Move what is at ``path`` (not a folder when looked at) to a name no reader of the store
    uses. A hard link of the entry itself, then the entry removed: neither works on a folder,
    so a folder another writer made here meanwhile is never moved (a rename would move it, and
    the blobs a published checkpoint names with it)."""
    aside = f"{path}.set-aside-{secrets.token_hex(4)}"
    try:
        os.link(path, aside, follow_symlinks=False)  # links a link itself, never its target
    except FileNotFoundError:
        return  # set aside by another writer: the caller looks again
    except OSError as e:
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(path).st_mode):
                return  # a folder now: the caller uses it
        raise OSError(errno.ENOTDIR, f"{path} is not a folder (a link?) and cannot be set "
                      f"aside: {e.strerror or e}") from None
    with contextlib.suppress(OSError):  # gone, or a folder now: the caller looks again
        os.unlink(path)
    log.warning("checkpoint store: %s was not a folder (a link, a file?); set it aside as %s "
                "and made a folder in its place", path, aside)


def narrow_folders(folders: Iterable[str]) -> None:
    """Stores made before folders were private: warn, and narrow our own folders to 0700."""
    for d in folders:
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or not st.st_mode & 0o077:
            continue
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            log.warning("checkpoint store folder %s is readable by others (mode %o) and "
                        "not ours to fix", d, st.st_mode & 0o777)
            continue
        try:
            os.chmod(d, 0o700)
            log.warning("checkpoint store folder %s was readable by others (mode %o); "
                        "made it private (0700)", d, st.st_mode & 0o777)
        except OSError as e:
            log.warning("checkpoint store folder %s is readable by others (mode %o): %s",
                        d, st.st_mode & 0o777, e.strerror or e)


def write_all(fd: int, mv: memoryview) -> None:
    while len(mv):
        n = os.write(fd, mv)
        mv = mv[n:]


def write_hashed(
    path: str,
    chunks: Iterable[Any],
    hasher: Any,
    size_hint: int,
    progress: Callable[[int], None] | None,
    written: Callable[[int], None],
) -> int:
    """Write the concatenation of ``chunks`` to the new file ``path``, hashing what is written,
    and fsync it; return its size. Blobs of at least :data:`directio.DIRECT_MIN` bytes
    (``size_hint``) bypass the page cache. ``written`` counts the bytes as they go."""
    big = size_hint >= directio.DIRECT_MIN and directio.supported()
    fd, direct = directio.open_new(path, direct=big)
    size = 0
    try:
        if big:
            # the sink falls back to buffered writes by itself where O_DIRECT is refused
            size = directio.write_file(fd, direct, path, chunks, size_hint, hasher, progress)
            written(size)
        else:
            for chunk in chunks:
                mv = memoryview(chunk).cast("B")
                for i in range(0, len(mv), CHUNK):
                    piece = mv[i : i + CHUNK]
                    hasher.update(piece)
                    write_all(fd, piece)
                    _write_behind(fd, size, len(piece))
                    size += len(piece)
                    written(len(piece))
                    if progress:
                        progress(len(piece))
            os.fsync(fd)
        _drop_cached(fd)
    finally:
        os.close(fd)
    return size


def _write_behind(fd: int, offset: int, length: int) -> None:
    """Start writing this range to the device now. Left to itself the kernel keeps a checkpoint's
    pages dirty until the final fsync (background writeback waits for 10% of RAM to be dirty),
    so the disk would idle while the checkpoint is being serialized. On Linux, DONTNEED on dirty
    pages starts their writeback without waiting for it (as PostgreSQL's flush hints do)."""
    if FADVISE:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _drop_cached(fd: int) -> None:
    """After fsync: drop the blob's now clean pages, so a checkpoint does not leave gigabytes of
    page cache charged to the notebook's memory cgroup."""
    if FADVISE:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
