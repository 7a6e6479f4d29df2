"""The per-user HMAC key that authenticates checkpoints; it lives outside any store."""

from __future__ import annotations

import os
import secrets
import sys

from .errors import CheckpointError

KEY_BYTES = 32


def jupyter_data_dir() -> str:
    """Jupyter's data directory, resolved like ``jupyter_core.paths.jupyter_data_dir``.

    Re-implemented so this library stays free of Jupyter imports.
    """
    env = os.environ.get("JUPYTER_DATA_DIR")
    if env:
        return env
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Jupyter")
    if os.name == "nt":
        appdata = os.environ.get("APPDATA")
        return (
            os.path.join(appdata, "jupyter") if appdata else os.path.join(home, ".jupyter", "data")
        )
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return os.path.join(xdg, "jupyter")


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


def load_or_create_key(path: str | None = None) -> bytes:
    """Return the key at ``path``, creating a random one (mode 0600) on first use.

    Creation is race-free: the key is written to a private temp file and hard-linked into place,
    so two processes starting at once end up with the same key.
    """
    path = os.path.expanduser(path or default_key_path())
    try:
        with open(path, "rb") as f:
            return _parse(f.read(), path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint key {path}: {e.strerror or e}") from None
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
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
    with open(path, "rb") as f:
        return _parse(f.read(), path)


def key_id(key: bytes) -> str:
    """A fingerprint that tells keys apart without revealing them (recorded in manifests)."""
    import hashlib
    import hmac

    return hmac.new(key, b"jupyter-pause key id", hashlib.sha256).hexdigest()[:16]
