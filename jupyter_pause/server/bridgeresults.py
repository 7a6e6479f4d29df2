"""The kernel bridge's results as the server reads them.

On the wire a result is the JSON object :mod:`jupyter_pause.kernel.bridge` documents; here it
becomes a frozen dataclass at one boundary (``from_json``), so the flights read attributes, not
keys. A failed call keeps its exception type (``error_type``): the failure reason is looked up
by that type (:data:`ERROR_REASONS`), never guessed from the message.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

# The kernel side's exception type (checkpoint.errors.error_type) -> a failure reason of
# cluster.reasons. KeyMismatchError subclasses IntegrityError; it is listed for its own sake.
ERROR_REASONS: dict[str, str] = {
    "StorageFullError": "storage_full",
    "IntegrityError": "integrity_error",
    "KeyMismatchError": "integrity_error",
    "NotFoundError": "not_found",
}

Unreadable = Literal["missing", "corrupt"]


@dataclasses.dataclass(frozen=True)
class BridgeFailure:
    """Why a bridge call answered ``{"ok": false}``."""

    error: str  # one line for a person
    error_type: str | None = None  # None: a kernel side that does not send it
    # "missing" | "corrupt" (the kernel's own reading of error_type), "kernel_side" (the
    # package is missing in the kernel or speaks another protocol: the error names the fix)
    kind: str | None = None

    def reason(self, default: str) -> str:
        """The failure reason of this error's type; ``default`` for a type without one."""
        return ERROR_REASONS.get(self.error_type or "", default)

    @property
    def unreadable(self) -> Unreadable | None:
        """"missing" or "corrupt" when the checkpoint itself can never be restored (retrying
        cannot help); a key mismatch can be fixed once the right key is back, so it is not
        "corrupt"."""
        if self.error_type == "NotFoundError":
            return "missing"
        if self.error_type == "IntegrityError":
            return "corrupt"
        return None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BridgeFailure:
        etype, kind = data.get("error_type"), data.get("error_kind")
        return cls(error=str(data.get("error") or "unknown error"),
                   error_type=etype if isinstance(etype, str) and etype else None,
                   kind=kind if isinstance(kind, str) and kind else None)


def _failure(data: dict[str, Any]) -> BridgeFailure | None:
    return None if data.get("ok") else BridgeFailure.from_json(data)


def _rows(value: Any) -> list[dict[str, Any]]:
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


@dataclasses.dataclass(frozen=True)
class CheckpointResult:
    """``checkpoint``: the checkpoint written, or why not (``failure``)."""

    failure: BridgeFailure | None = None
    checkpoint_id: str | None = None
    bytes_written: int = 0
    bytes_total: int = 0
    variables: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    process_state: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    pid: int | None = None
    token: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointResult:
        pid = data.get("pid")
        return cls(
            failure=_failure(data), checkpoint_id=data.get("checkpoint_id"),
            bytes_written=_int(data.get("bytes_written")),
            bytes_total=_int(data.get("bytes_total")), variables=_rows(data.get("variables")),
            process_state=_rows(data.get("process_state")),
            pid=pid if isinstance(pid, int) else None, token=data.get("token") or None,
            warnings=[str(w) for w in data.get("warnings") or []])


@dataclasses.dataclass(frozen=True)
class RestoreResult:
    """``restore``: what came back into the namespace, or why nothing did (``failure``)."""

    failure: BridgeFailure | None = None
    checkpoint_id: str | None = None
    variables: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    process_state: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    modules: list[Any] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RestoreResult:
        return cls(
            failure=_failure(data), checkpoint_id=data.get("checkpoint_id"),
            variables=_rows(data.get("variables")),
            process_state=_rows(data.get("process_state")),
            warnings=[str(w) for w in data.get("warnings") or []],
            modules=list(data.get("modules") or []))

    @classmethod
    def failed(cls, error: str, error_type: str | None = None) -> RestoreResult:
        """A restore that did not get an answer (the kernel died, the call failed)."""
        return cls(failure=BridgeFailure(error=error, error_type=error_type))


@dataclasses.dataclass(frozen=True)
class LivenessResult:
    """``liveness``: which process answered and whether a checkpoint rebuilt it."""

    failure: BridgeFailure | None = None
    token: str | None = None
    pid: int | None = None
    armed_at: Any = None
    never_pause: bool = False
    # Set once this process was rebuilt from a checkpoint: {"checkpoint_id", "at", "by",
    # "variables"}; the server then never restores it again.
    restored: dict[str, Any] | None = None
    cells_run: int | None = None  # None: unknown (counts as used)
    provenance: bool = False

    @property
    def ok(self) -> bool:
        return self.failure is None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LivenessResult:
        pid, cells, restored = data.get("pid"), data.get("cells_run"), data.get("restored")
        # liveness answers without "ok" in older kernel sides: only an explicit false fails
        failure = BridgeFailure.from_json(data) if data.get("ok") is False else None
        return cls(
            failure=failure, token=data.get("token") or None,
            pid=pid if isinstance(pid, int) else None, armed_at=data.get("armed_at"),
            never_pause=bool(data.get("never_pause")),
            restored=restored if isinstance(restored, dict) and restored else None,
            cells_run=cells if isinstance(cells, int) and not isinstance(cells, bool) else None,
            provenance=bool(data.get("provenance")))
