"""Replace a small file atomically: readers see the old content or the new, never a part.

One implementation for every small file the project rewrites in place (the server's state.json
and running marker, a store's manifests and refs, the upgrade check's results). Standard library
only and free of server imports: the kernel side (``checkpoint/``, ``kernel/``) uses it too, so
it ships in the kernel-side distribution.
"""

from __future__ import annotations

import contextlib
import os
import secrets

__all__ = ["fsync_dir", "replace_file"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename inside ``path`` durable; quietly nothing where directories cannot be
    opened (Windows) or synced (some network file systems)."""
    if os.name == "nt":
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_file(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = True,
                 sync_dir: bool = False) -> None:
    """Write ``data`` (str as UTF-8) to a new private (0600) temp file beside ``path`` and
    rename it over ``path``.

    ``durable``: fsync the file before the rename, so a power loss cannot leave an empty file
    under the final name. ``sync_dir``: fsync the folder after it, so the rename itself
    survives one. The temp name is unique and created exclusively: a leftover of a killed
    writer, or a file someone else placed there, is never written through or trusted.
    """
    path = os.fspath(path)
    buf = memoryview(data.encode("utf-8") if isinstance(data, str) else data)
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o600)
    try:
        try:
            while len(buf):
                buf = buf[os.write(fd, buf):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(path) or ".")
