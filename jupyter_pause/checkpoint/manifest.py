"""The manifest (what a checkpoint holds, signed with HMAC-SHA256) and the result types."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

from .errors import IntegrityError, KeyMismatchError
from .keys import key_id

FORMAT = "jupyter-pause/checkpoint@1"
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass
class Manifest:
    """One checkpoint. ``blobs`` maps digest -> {size, kind}; groups and tensors point into it."""

    id: str
    stream: str
    created: str
    format: str = FORMAT
    env: dict[str, Any] = field(default_factory=dict)
    liveness: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    variables: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    blobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    tensors: list[dict[str, Any]] = field(default_factory=list)
    # process state (procstate.capture()); {} in checkpoints written before it existed
    process: dict[str, Any] = field(default_factory=dict)
    bytes_total: int = 0
    key_id: str = ""
    # Set by Store.list(): True when the HMAC was checked with a key, False when no key was given.
    verified: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        # shallow on purpose: asdict() deep-copies every nested list and dict
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "verified"}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        names = {f.name for f in fields(cls)} - {"verified"}
        return cls(**{k: v for k, v in d.items() if k in names})

    def variable(self, name: str) -> dict[str, Any] | None:
        return next((v for v in self.variables if v["name"] == name), None)

    def created_at(self) -> float | None:
        """``created`` (ISO-8601, as :func:`write` records it) in epoch seconds; None when it is
        not a time. For age rules only: the order of checkpoints comes from the signed id."""
        try:
            dt = datetime.fromisoformat(self.created)
        except (TypeError, ValueError):
            return None
        return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def canonical(d: dict[str, Any]) -> bytes:
    body = {k: v for k, v in d.items() if k != "hmac"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(manifest: Manifest, key: bytes) -> bytes:
    """The bytes of the manifest file: canonical JSON plus its HMAC."""
    manifest.key_id = key_id(key)
    d = manifest.to_dict()
    mac = hmac.new(key, canonical(d), hashlib.sha256).hexdigest()
    d["hmac"] = mac
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def parse(raw: bytes, where: str) -> dict[str, Any]:
    try:
        d = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: deep nesting
        raise IntegrityError(f"checkpoint manifest {where} is corrupt (not valid JSON)") from None
    if not isinstance(d, dict) or not isinstance(d.get("hmac"), str):
        raise IntegrityError(f"checkpoint manifest {where} is corrupt (no signature)")
    if d.get("format") != FORMAT:
        raise IntegrityError(f"checkpoint manifest {where} has unknown format {d.get('format')!r}")
    return d


def blob_names(d: dict[str, Any]) -> list[str]:
    """The digests a parsed (maybe unauthenticated) manifest names; anything else is dropped."""
    blobs = d.get("blobs")
    if not isinstance(blobs, dict):
        return []
    return [n for n in blobs if isinstance(n, str) and _DIGEST.fullmatch(n)]


def _well_formed(m: Manifest) -> bool:
    """The shape the reader and retention rely on (checked after the HMAC, so a bug of ours,
    never an attacker, is what this guards against; still cheaper than a traceback)."""
    if not all(isinstance(x, str) for x in (m.id, m.stream, m.created)):
        return False
    if not isinstance(m.blobs, dict) or not all(
        isinstance(k, str) and _DIGEST.fullmatch(k) and isinstance(v, dict)
        for k, v in m.blobs.items()
    ):
        return False
    return all(isinstance(x, list) for x in (m.variables, m.groups, m.tensors)) and all(
        isinstance(x, dict) for x in (m.meta, m.process)
    )


def verify(raw: bytes, key: bytes, where: str) -> Manifest:
    """Parse and authenticate manifest bytes; raise before anything is trusted."""
    d = parse(raw, where)
    try:
        mac = hmac.new(key, canonical(d), hashlib.sha256).hexdigest()
    except (RecursionError, ValueError):
        raise IntegrityError(f"checkpoint manifest {where} is corrupt") from None
    # compare_digest refuses non-ASCII str with TypeError: compare bytes
    if not hmac.compare_digest(mac.encode(), d["hmac"].encode("utf-8", "replace")):
        if d.get("key_id") != key_id(key):
            raise KeyMismatchError(
                f"checkpoint {where} was written with another key (HMAC mismatch); "
                "refusing to load it"
            )
        raise IntegrityError(
            f"checkpoint {where} failed authentication (manifest modified, HMAC "
            "mismatch); refusing to load it"
        )
    try:
        m = Manifest.from_dict(d)
    except TypeError:
        raise IntegrityError(f"checkpoint manifest {where} is malformed") from None
    if not _well_formed(m):
        raise IntegrityError(f"checkpoint manifest {where} is malformed")
    m.verified = True
    return m


@dataclass
class VariableReport:
    """What became of one variable in a write or a read (status, size, reason)."""

    name: str
    kind: str
    size: int
    status: str  # write: saved|skipped|stale ; read: restored|skipped|stale|failed
    reason: str | None = None
    cell: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WriteResult:
    """A published checkpoint: its manifest and id, and what happened to each variable."""

    manifest: Manifest
    checkpoint_id: str
    bytes_written: int
    bytes_total: int
    variables: list[VariableReport]
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)  # e.g. retention clean-up problems
    process_state: list[VariableReport] = field(default_factory=list)  # kind procstate.KIND


@dataclass
class ReadResult:
    """A verified checkpoint read back: the values and what became of each variable."""

    values: dict[str, Any]
    variables: list[VariableReport]
    warnings: list[str]
    manifest: Manifest
    bytes_read: int = 0
    seconds: float = 0.0
    process_state: list[VariableReport] = field(default_factory=list)  # what was put back
    # variable -> what did not come back with it (it is in ``values``, but only in part)
    load_notes: dict[str, list[str]] = field(default_factory=dict)
