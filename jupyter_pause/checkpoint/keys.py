"""The per-user HMAC key that authenticates checkpoints; it lives outside any store."""

from __future__ import annotations

import os
import secrets
import shlex
import stat
from typing import Any

from jupyter_core.paths import jupyter_data_dir

from .errors import CheckpointError

KEY_BYTES = 32
# POSIX permissions only: on Windows the mode bits say nothing about who can read a file.
_CHECK_MODES = os.name != "nt"


class KeyFileError(CheckpointError):
    """The key file is missing while checkpoints depend on it, or others can read or change it."""


def default_key_path() -> str:
    return os.path.join(jupyter_data_dir(), "jupyter-pause", "checkpoint.key")


def _parse(raw: bytes, path: str) -> bytes:
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) < 16:
        raise CheckpointError(
            f"checkpoint key file {path} is not a valid key; remove it to make a new one"
        )
    return key


def count_checkpoints(store: Any) -> int:
    """How many manifest files ``store`` (a Store, a local path or an fsspec URL) holds.

    Counts files, signed or not: without the key nothing can be verified, and a store that looks
    used is reason enough not to mint a key that would orphan it (so the error says "manifest
    files", never "checkpoints signed with a key"). Listed here rather than through the Store
    API so that this check needs nothing but the location.
    """
    url = str(getattr(store, "url", store))
    if "://" in url and not url.startswith("file://"):
        import fsspec

        fs, root = fsspec.core.url_to_fs(url)
        try:
            return len(fs.glob(root.rstrip("/") + "/manifests/*/*.json"))
        except FileNotFoundError:
            return 0
    root = os.path.join(os.path.abspath(os.path.expanduser(url.removeprefix("file://"))),
                        "manifests")
    n = 0
    try:
        slugs = [e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for d in slugs:
        try:
            n += sum(1 for e in os.scandir(d) if e.name.endswith(".json"))
        except (FileNotFoundError, NotADirectoryError):
            continue
    return n


def _read_key(path: str) -> bytes:
    """Read the key, refusing a file that other users could read or replace."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    key = _parse(b"".join(chunks), path)  # a malformed file is useless whatever its mode
    if _CHECK_MODES and mode & 0o077:
        # Whoever can read the key can forge checkpoints that the kernel will unpickle.
        raise KeyFileError(
            f"checkpoint key file {path} is accessible to other users (mode {mode:04o}); "
            f"make it private with: chmod 600 {shlex.quote(path)}"
        )
    return key


def _missing_key(path: str, store: Any, count: int) -> KeyFileError:
    where = getattr(store, "url", store)
    return KeyFileError(
        f"checkpoint key file {path} is missing, but the store {where} holds {count} "
        f"checkpoint manifest file(s), which only that key can verify (unsigned or forged ones "
        f"are counted too: without the key they cannot be told apart); a new key would make "
        f"every genuine one unreadable. "
        f"Restore the key file from a backup, or move the store aside (or set "
        f"c.PauseApp.store_url to a new store) to start afresh with a new key"
    )


def _makedirs_private(directory: str) -> None:
    """Create ``directory`` and any missing parents as 0700, whatever the umask."""
    if os.path.isdir(directory):
        return
    parent = os.path.dirname(directory)
    if parent and parent != directory:
        _makedirs_private(parent)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        return  # made by another process meanwhile
    if _CHECK_MODES:
        os.chmod(directory, 0o700)  # the umask may have taken bits we wanted; never adds any


def load_or_create_key(path: str | None = None, *, store: Any = None) -> bytes:
    """Return the key at ``path``, creating a random one (mode 0600) on first use.

    ``store`` (a Store, a path or an fsspec URL) is where the key's checkpoints live: when the key
    is missing but that store already holds checkpoints, :class:`KeyFileError` says so instead of
    minting a new key that would silently orphan them. A key file that group or others can read
    or write is refused with the command that fixes it.

    Creation is race-free: the key is written to a private temp file (O_EXCL, 0600) and
    hard-linked into place, so two processes starting at once end up with the same key and no
    process ever sees a partial one.
    """
    path = os.path.expanduser(path or default_key_path())
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint key {path}: {e.strerror or e}") from None
    if store is not None:
        try:
            count = count_checkpoints(store)
        except OSError as e:
            raise CheckpointError(
                f"checkpoint key file {path} is missing and the store "
                f"{getattr(store, 'url', store)} cannot be listed to check for checkpoints that "
                f"depend on it: {e.strerror or e}"
            ) from None
        if count:
            raise _missing_key(path, store, count)
    directory = os.path.dirname(path) or "."
    try:
        _makedirs_private(directory)
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if _CHECK_MODES:
                os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
            os.write(fd, secrets.token_bytes(KEY_BYTES).hex().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it first: use theirs
        finally:
            os.unlink(tmp)
    except OSError as e:
        raise CheckpointError(f"cannot create checkpoint key {path}: {e.strerror or e}") from None
    try:
        return _read_key(path)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint key {path}: {e.strerror or e}") from None


def key_id(key: bytes) -> str:
    """A fingerprint that tells keys apart without revealing them (recorded in manifests)."""
    import hashlib
    import hmac

    return hmac.new(key, b"jupyter-pause key id", hashlib.sha256).hexdigest()[:16]
