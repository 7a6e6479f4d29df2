"""Torch storages in safetensors packs: writing (zero-copy, hashed while written) and loading
(from the verified in-memory copy, mapped to a device by policy). torch is imported only when
tensors are involved."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from . import goodblobs, localfs
from .errors import CheckpointError, IntegrityError

# safetensors dtype names; anything else is stored as raw bytes (U8) with the real dtype in the
# manifest, since pack entries are whole untyped storages anyway.
_ST_DTYPES = {
    "float64": ("F64", 8),
    "float32": ("F32", 4),
    "float16": ("F16", 2),
    "bfloat16": ("BF16", 2),
    "int64": ("I64", 8),
    "int32": ("I32", 4),
    "int16": ("I16", 2),
    "int8": ("I8", 1),
    "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
    "uint16": ("U16", 2),
    "uint32": ("U32", 4),
    "uint64": ("U64", 8),
    "float8_e4m3fn": ("F8_E4M3", 1),
    "float8_e5m2": ("F8_E5M2", 1),
}


def itemsize(dtype: str) -> int:
    """Bytes per item of a storage recorded with ``dtype`` (1 for raw bytes)."""
    return _ST_DTYPES.get(dtype, ("U8", 1))[1]


def record_device(storage: Any) -> str:
    """The device recorded for a storage (tests replace this to forge e.g. cuda:0)."""
    return str(storage.device)


def storage_bytes(us: Any) -> memoryview:
    """A zero-copy byte view of a CPU storage (kept alive by the caller)."""
    n = us.nbytes()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * n).from_address(us.data_ptr())).cast("B")


def pack_layout(entries: list[tuple[str, Any, str]]) -> tuple[bytes, list[Any]]:
    """Header bytes and the storages in file order for a safetensors pack.

    entries: (name, UntypedStorage, dtype name). Ordered by item size so every tensor stays
    aligned to its own item size without padding (safetensors forbids gaps).
    """
    laid = []
    for name, us, dtype in entries:
        st, size = _ST_DTYPES.get(dtype, ("U8", 1))
        if us.nbytes() % size:
            st, size = "U8", 1
        laid.append((size, name, us, st))
    laid.sort(key=lambda e: -e[0])
    header: dict[str, Any] = {"__metadata__": {"format": "jupyter-pause"}}
    off = 0
    for size, name, us, st in laid:
        n = us.nbytes()
        header[name] = {"dtype": st, "shape": [n // size], "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, [e[2] for e in laid]


HOST_PIECE = 64 << 20  # a device storage comes to host memory this much at a time


class DeviceCopies:
    """Bytes of device storages brought to host memory, by purpose: ``hash`` (the change check
    of every write) and ``write`` (the storages a write stores). What a GPU check proves an
    incremental checkpoint copied off the device."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = {"hash": 0, "write": 0}

    def add(self, purpose: str, n: int) -> None:
        with self._lock:
            self.counts[purpose] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


DEVICE_COPIES = DeviceCopies()


HASH_PIECE = 4 << 20  # hashed just before the writer copies it: still in the CPU's cache


def pack_chunks(entries: list[tuple[str, Any, str]],
                record: Callable[[str, str], None] | None = None,
                hash_names: Any = ()) -> Iterator[Any]:
    """Yield the bytes of a pack: header, then each storage (a device storage copied to host a
    piece at a time, so a checkpoint of a GPU model needs no host copy of a whole tensor; a
    :class:`StoredBytes` read back from the store).

    Storages named in ``hash_names`` are hashed (xxh3) piece by piece as they are handed to the
    writer and ``record(name, xxh3)`` is called after each: a storage no earlier entry could
    match needs no hash before the write, so its change check costs no pass of its own."""
    head, storages = pack_layout(entries)
    names = {id(us): name for name, us, _ in entries}
    yield head
    for us in storages:
        name = names[id(us)]
        if isinstance(us, StoredBytes):
            yield from us.pieces()  # checked against its xxh3 as it is read
            continue
        if us.device.type != "cpu":
            pieces = host_pieces(us, purpose="write")
        else:
            mv = storage_bytes(us)
            pieces = (mv[a : a + HASH_PIECE] for a in range(0, len(mv), HASH_PIECE))
        if record is None or name not in hash_names:
            yield from pieces
            continue
        import xxhash

        h = xxhash.xxh3_128()
        for piece in pieces:
            h.update(piece)
            yield piece
        record(name, h.hexdigest())


def host_pieces(us: Any, piece: int = HOST_PIECE, purpose: str = "hash") -> Iterator[Any]:
    """Host copies of a storage, ``piece`` bytes at a time. Each yielded view owns its memory
    (a numpy array that keeps its tensor alive): a consumer may hold it past the next piece."""
    import torch

    flat = torch.empty(0, dtype=torch.uint8, device=us.device).set_(us)
    for a in range(0, us.nbytes(), piece):
        host = flat[a : a + piece].cpu()
        DEVICE_COPIES.add(purpose, host.numel())
        # numpy's stubs declare ndarray.__buffer__ for Python >= 3.12 only
        yield memoryview(host.numpy())  # type: ignore[arg-type]


class StoredBytes:
    """A storage's bytes as an earlier pack in a local store holds them, to be copied into a
    new pack instead of read from memory (a forked writer has given that memory back: see
    packs.TensorPacks). The pack file is store input, trusted only as a reference is: it
    must be inside the store and known good to this process (:mod:`.goodblobs`: hashed here,
    and the same unchanged file since) before and after the copy, its header is checked as a
    restore checks it, and the bytes must have the xxh3 the storage had in memory. Otherwise
    the write fails before it publishes, and the pack is no longer trusted (the next write
    writes it from memory)."""

    def __init__(self, store: Any, digest: str, name: str, nbytes: int, xxh3: str) -> None:
        self.store, self.digest, self.name, self.n, self.xxh3 = store, digest, name, nbytes, xxh3
        self.path = store.blob_path(digest)

    def nbytes(self) -> int:
        return self.n

    def pieces(self) -> Iterator[bytes]:
        import xxhash

        if not self.store.inside(self.path):
            self._bad("is behind a link out of the store")
        try:
            fd = localfs.open_regular(self.path)
        except IntegrityError:
            self._bad("is not a regular file")
        except OSError as e:  # any other failure (no descriptor left) is this write's alone
            if e.errno == errno.ELOOP:
                self._bad("is not a regular file (a link)")
            if e.errno == errno.ENOENT:
                self._bad("is gone")
            raise
        try:
            before = self._stamp(fd)
            if not goodblobs.is_good(self.store.url, self.digest, before):
                self._bad("changed since this write checked it")
            size = os.fstat(fd).st_size
            head = _pread_all(fd, 8, 0)
            hlen = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 <= hlen <= min(size - 8, MAX_HEADER):
                self._bad("has a malformed header")
            header = _pread_all(fd, hlen, 8)
            try:
                base, offsets = pack_offsets(header, size - 8 - hlen)
            except CheckpointError:
                self._bad("has a malformed header")
            start, end = offsets.get(self.name, (0, -1))
            if end - start != self.n:
                self._bad(f"holds no {self.n}-byte storage {self.name!r}")
            h = xxhash.xxh3_128()
            for a in range(start, end, HASH_PIECE):
                want = min(HASH_PIECE, end - a)
                piece = _pread_all(fd, want, base + a)
                if len(piece) != want:
                    self._bad("was cut short")
                h.update(piece)
                yield piece
            if self._stamp(fd) != before:
                self._bad("changed while this write copied from it")
            if h.hexdigest() != self.xxh3:
                self._bad(f"no longer holds {self.name} as it was written")
        finally:
            os.close(fd)

    def _stamp(self, fd: int) -> Any:
        return self.store.blob_stamp(self.digest, os.fstat(fd))

    def _bad(self, what: str) -> NoReturn:
        goodblobs.forget(self.store.url, self.digest)  # the next write writes it from memory
        raise IntegrityError(f"tensor pack {self.digest[:16]} in {self.store.url} {what}; this "
                             "autosave is abandoned (the previous one stays) and the next one "
                             "writes the pack's tensors again")


def _pread_all(fd: int, n: int, at: int) -> bytes:
    """``n`` bytes at ``at``, fewer only at the end of the file (a read may return less)."""
    parts, got = [], 0
    while got < n:
        b = os.pread(fd, n - got, at + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def storage_xxh3(us: Any) -> str:
    """xxh3-128 of a storage's bytes: in place for a CPU storage, a piece at a time through
    host memory for a device storage (bounded host memory, as for the write)."""
    import xxhash  # only with a change-detection cache

    h = xxhash.xxh3_128()
    if us.device.type == "cpu":
        h.update(storage_bytes(us))
    else:
        for piece in host_pieces(us):
            h.update(piece)
    return h.hexdigest()


def resolve_device(policy: str) -> str | None:
    """Validate a device policy; returns None for 'auto'."""
    if policy == "auto":
        return None
    if policy == "cpu":
        return "cpu"
    if policy.startswith("cuda"):
        import torch

        idx = int(policy.split(":", 1)[1]) if ":" in policy else 0
        if not torch.cuda.is_available():
            raise CheckpointError(f"device {policy} requested but CUDA is not available here")
        if idx >= torch.cuda.device_count():
            raise CheckpointError(
                f"device {policy} requested but only {torch.cuda.device_count()} CUDA device(s) here"
            )
        return f"cuda:{idx}"
    raise CheckpointError(f"unknown device policy {policy!r} (use auto, cpu or cuda:N)")


def target_device(recorded: str, forced: str | None) -> str:
    if forced is not None:
        return forced
    if recorded == "cpu" or recorded.startswith("meta"):
        return recorded
    torch = sys.modules.get("torch")
    kind, _, idx = recorded.partition(":")
    if (
        kind == "cuda"
        and torch is not None
        and torch.cuda.is_available()
        and int(idx or 0) < torch.cuda.device_count()
    ):
        return recorded
    return "cpu"


class PackReader:
    """Loads storages out of verified packs; one safe_open per pack, kept while restoring."""

    def __init__(self, open_pack: Callable[[str], Any]) -> None:
        self._open_pack = open_pack  # digest -> dict-like name -> tensor
        self._packs: dict[str, Any] = {}

    def storage(self, entry: dict[str, Any], device: str) -> Any:
        digest = entry["blob"]
        pack = self._packs.get(digest)
        if pack is None:
            pack = self._packs[digest] = self._open_pack(digest)
        t = pack.get_tensor(entry["name"])
        if device != "cpu":
            t = t.to(device)
        return t.untyped_storage()

    def close(self) -> None:
        for p in self._packs.values():
            close = getattr(p, "__exit__", None)
            if close:
                with contextlib.suppress(Exception):  # closing a read-only handle
                    close(None, None, None)
        self._packs.clear()


class _Dict:
    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d

    def get_tensor(self, name: str) -> Any:
        return self.d[name]


MAX_HEADER = 100 << 20  # safetensors' own bound on a header


def _malformed() -> CheckpointError:
    return CheckpointError("tensor pack is malformed")


def pack_offsets(header: Any, data_len: int) -> tuple[int, dict[str, tuple[int, int]]]:
    """The data's offset in the file and each storage's (start, end) in the data, from a pack's
    JSON header (store input: every range checked to lie within the ``data_len`` bytes)."""
    try:
        parsed = json.loads(bytes(header))
    except (ValueError, RecursionError):
        raise _malformed() from None
    if not isinstance(parsed, dict):
        raise _malformed()
    entries: dict[str, tuple[int, int]] = {}
    for name, e in parsed.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(x) for x in e["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise _malformed() from None
        if not 0 <= start <= end <= data_len:
            raise _malformed()
        entries[name] = (start, end)
    return 8 + len(header), entries


class _BufferPack:
    """A safetensors pack parsed from the buffer whose digest was checked: every storage is a
    zero-copy view of that buffer, so nothing is read from the file again after verification."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf
        if len(buf) < 8:
            raise _malformed()
        (hlen,) = struct.unpack_from("<Q", buf, 0)
        if hlen > len(buf) - 8:
            raise _malformed()
        self.base, self.entries = pack_offsets(buf[8 : 8 + hlen], len(buf) - 8 - hlen)

    def get_tensor(self, name: str) -> Any:
        import torch

        start, end = self.entries[name]
        if end == start:
            return torch.empty(0, dtype=torch.uint8)
        # storages are untyped: the manifest's dtype and shape are applied when tensors are rebuilt
        return torch.frombuffer(self.buf, dtype=torch.uint8, count=end - start,
                                offset=self.base + start)


def open_pack_buffer(buf: Any) -> Any:
    return _BufferPack(buf)


def open_pack_bytes(data: bytes) -> Any:
    from safetensors.torch import load

    return _Dict(load(bytes(data)))
