"""Open files: reopened at the same position and mode when the file is unchanged.

At checkpoint time a read-mode file records its absolute path, mode, position, size, mtime and a
digest of its content (all of it up to FULL_HASH_MAX; above that the first, the current and the
last MiB, and then size and mtime must match too, since the digest does not cover every byte).
At restore the file is checked first: gone or changed raises ``SourceChanged`` naming what
differs, which fails the variable (and the variables linked to it) with that reason, so
``%restore --recompute`` can re-run its cell. A file open for writing, appending or updating is
never reopened: the copy could truncate the file or write the same data twice; it stays
reported as stale with why. A closed file comes back closed, with its name and mode.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import Any

from ..outcomes import StaleObject
from . import register

FULL_HASH_MAX = 64 << 20
_SAMPLE = 1 << 20


class SourceChanged(Exception):
    """The file behind a saved file object changed or went away since the checkpoint."""


def _digest(path: str, size: int, pos: int) -> tuple[str, bool]:
    """(digest, covers_every_byte)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= FULL_HASH_MAX:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
            return h.hexdigest(), True
        for off in (0, max(0, min(pos, size - _SAMPLE)), size - _SAMPLE):
            f.seek(off)
            h.update(f.read(_SAMPLE))
    return h.hexdigest(), False


def _stale(f: Any, why: str) -> Exception:
    t = type(f)
    return StaleObject(f"{t.__module__}.{t.__qualname__}: {why}")


def file_state(f: Any, name: Any, mode: str) -> dict[str, Any]:
    """What restoring a read-mode file needs, or StaleObject with why it cannot be reopened."""
    if not isinstance(name, str):
        raise _stale(f, f"open file without a path (descriptor {name!r}); re-run its cell")
    if any(c in mode for c in "wax+"):
        raise _stale(
            f,
            f"{name} is open for writing (mode {mode!r}); reopening it could truncate it or "
            "write the same data twice, so it is not reopened; re-run its cell",
        )
    path = os.path.abspath(name)
    try:
        pos = f.tell()
    except (OSError, ValueError) as e:  # e.g. a text file being iterated with next()
        raise _stale(f, f"{name}: its position cannot be read ({e})") from None
    try:
        st = os.stat(path)
    except OSError as e:
        raise _stale(f, f"{name}: {e.strerror}") from None
    digest, full = _digest(path, st.st_size, pos if isinstance(pos, int) else 0)
    return {
        "path": path,
        "name": name,
        "mode": mode,
        "pos": pos,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "digest": digest,
        "full": full,
    }


def check_unchanged(s: dict[str, Any]) -> None:
    path = s["path"]
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SourceChanged(f"{path} is gone since the checkpoint") from None
    except OSError as e:
        raise SourceChanged(f"{path} cannot be read: {e.strerror}") from None
    if st.st_size != s["size"]:
        raise SourceChanged(
            f"{path} changed since the checkpoint (size {s['size']} -> {st.st_size} bytes)"
        )
    if not s["full"] and st.st_mtime_ns != s["mtime_ns"]:
        raise SourceChanged(f"{path} changed since the checkpoint (modified again)")
    digest, _ = _digest(path, st.st_size, s["pos"] if isinstance(s["pos"], int) else 0)
    if digest != s["digest"]:
        raise SourceChanged(f"{path} changed since the checkpoint (same size, other content)")


def _reopen(s: dict[str, Any], text: dict[str, Any] | None, raw: bool) -> Any:
    if any(c in s["mode"] for c in "wax+"):  # never written by file_state; refused regardless
        raise SourceChanged(f"{s['path']}: refusing to reopen with mode {s['mode']!r}")
    check_unchanged(s)
    if text is not None:
        f: Any = open(  # noqa: SIM115 - the open handle is what is being restored
            s["path"],
            s["mode"],
            encoding=text["encoding"],
            errors=text["errors"],
            newline=text["newline"],
        )
        f.buffer.raw.name = s["name"]  # as the notebook opened it (relative paths stay so)
    elif raw:
        f = io.FileIO(s["path"], "r")
        f.name = s["name"]
    else:
        f = open(s["path"], s["mode"])  # noqa: SIM115
        f.raw.name = s["name"]
    f.seek(s["pos"])
    return f


def _closed(kind: str, name: Any, mode: str, encoding: str | None) -> Any:
    """A closed file object like the saved one (``with open(...) as f`` leaves ``f`` so): made
    on the null device, so neither the file nor its absence matters, then closed."""
    mode = mode.replace("x", "w")  # "x" refuses an existing path, and the null device exists
    if kind == "raw":
        f: Any = io.FileIO(os.devnull, mode)
        f.name = name
    elif kind == "text":
        f = open(os.devnull, mode, encoding=encoding)  # noqa: SIM115
        f.buffer.raw.name = name
    else:
        f = open(os.devnull, mode)  # noqa: SIM115
        f.raw.name = name
    f.close()
    return f


@register("_io.TextIOWrapper")
def reduce_text(f: Any) -> Any:
    if f.closed:
        return (_closed, ("text", getattr(f, "name", None), f.mode, f.encoding))
    buf = getattr(f, "buffer", None)
    if not isinstance(getattr(buf, "raw", None), io.FileIO):
        raise _stale(f, "holds a stream that is not a plain file")
    s = file_state(f, getattr(f, "name", None), f.mode)
    # TextIOWrapper does not expose its newline= argument: the default is assumed
    text = {"encoding": f.encoding, "errors": f.errors, "newline": None}
    return (_reopen, (s, text, False))


@register("_io.BufferedReader", "_io.BufferedWriter", "_io.BufferedRandom", "_io.FileIO")
def reduce_binary(f: Any) -> Any:
    raw = isinstance(f, io.FileIO)
    if f.closed:
        return (_closed, ("raw" if raw else "binary", getattr(f, "name", None), f.mode, None))
    if not raw and not isinstance(getattr(f, "raw", None), io.FileIO):
        raise _stale(f, "holds a stream that is not a plain file")
    s = file_state(f, getattr(f, "name", None), f.mode)
    return (_reopen, (s, None, raw))


def _reopen_fits(s: dict[str, Any], memmap: bool | None, mapped: bool, name: str) -> Any:
    """An astropy FITS file handle, reopened read-only on the unchanged file."""
    check_unchanged(s)
    from astropy.io.fits.file import _File

    f = _File(s["path"], mode="readonly", memmap=memmap)
    f.name = name  # as the notebook named it (relative paths stay so)
    f._file.raw.name = s["name"]
    if mapped:
        f.readarray(shape=(0,))  # the original had its memory map open: open it again
    f.seek(s["pos"])
    return f


@register("astropy.io.fits.file._File")
def reduce_fits_file(f: Any) -> Any:
    """astropy's handle behind an HDUList (and its memory map). Read-only ones are reopened
    (HDU data already read travels in the checkpoint as arrays); others stay stale."""
    if f.closed:
        raise _stale(f, "a closed FITS file")
    if f.mode != "readonly" or f.compression or f.file_like:
        raise _stale(
            f,
            f"FITS file {f.name} opened with mode {f.mode!r}"
            + (f", {f.compression} compressed" if f.compression else "")
            + ("" if f.mode == "readonly" else "; reopening it could change the file")
            + "; re-run its cell",
        )
    s = file_state(f._file, f._file.name, "rb")
    memmap = True if f.strict_memmap else (None if f.memmap else False)  # fits.open(memmap=)
    return (_reopen_fits, (s, memmap, f._mmap is not None, f.name))
