"""One variable's row in a checkpoint, restore or recompute report, and the rules of its status.

Standard library only: the kernel side (magics, bridge) builds rows, the server journals them
and serves them in ``GET status``, the frontend shows them; all read the same dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, is_dataclass
from typing import Any, TypedDict

# The order reports count statuses in: what came back first, what did not after.
STATUS_ORDER = ("saved", "restored", "recomputed", "live", "skipped", "stale", "failed")
# Statuses of a variable whose value is not (fully) there: re-running its recorded cell may
# bring it back. "recomputed" is done; a "failed" re-run may be retried.
RECOMPUTABLE = ("skipped", "stale", "failed")
FIELDS = ("name", "kind", "size", "status", "reason", "cell")


class VariableRow(TypedDict):
    """One variable of a report (JSON as it is journaled and served)."""

    name: str | None
    kind: str | None
    size: int | None
    status: str | None
    reason: str | None
    cell: dict[str, Any] | None  # {"execution_count", "source"} of the cell that defined it
    recomputable: bool


def is_recomputable(status: str | None, cell: Mapping[str, Any] | None) -> bool:
    """A variable can be recomputed when it is missing or partial and its cell's source is known."""
    return bool(cell and cell.get("source")) and status in RECOMPUTABLE


def row(
    name: str | None,
    status: str | None,
    reason: str | None = None,
    *,
    kind: str | None = None,
    size: int | None = None,
    cell: Mapping[str, Any] | None = None,
) -> VariableRow:
    """A row with ``recomputable`` derived from its status and cell."""
    cell = dict(cell) if isinstance(cell, Mapping) else None
    return VariableRow(name=name, kind=kind, size=size, status=status, reason=reason, cell=cell,
                       recomputable=is_recomputable(status, cell))


def as_row(v: Any) -> VariableRow:
    """A row from any variable report: the engine's dataclass, an object or a dict (extra keys
    and a stale ``recomputable`` are dropped; the rule decides)."""
    if isinstance(v, Mapping):
        d = dict(v)
    elif is_dataclass(v) and not isinstance(v, type):
        d = asdict(v)
    else:
        d = {k: getattr(v, k, None) for k in FIELDS}
    return row(d.get("name"), d.get("status"), d.get("reason"), kind=d.get("kind"),
               size=d.get("size"), cell=d.get("cell"))


def set_status(r: VariableRow | dict[str, Any], status: str, reason: str | None) -> None:
    """Change a row's status in place, ``recomputable`` following it."""
    r["status"], r["reason"] = status, reason
    r["recomputable"] = is_recomputable(status, r.get("cell"))


def counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Rows per status."""
    out: dict[str, int] = {}
    for r in rows:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out


def summary(rows: Iterable[Mapping[str, Any]]) -> str:
    """``"3 saved, 1 skipped"`` in STATUS_ORDER (unknown statuses last); ``"no variables"``."""
    n = counts(rows)
    parts = [f"{n[s]} {s}" for s in STATUS_ORDER if n.get(s)]
    parts += [f"{k} {s}" for s, k in n.items() if s not in STATUS_ORDER]
    return ", ".join(parts) or "no variables"
