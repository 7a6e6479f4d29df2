"""The way back a failure offers: each notebook's newest authentic checkpoint in the store."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..checkpoint import open_keyed_store
from ..cluster.base import KernelRecord
from ..journal import parse_iso

if TYPE_CHECKING:
    from .app import PauseApp


def offer_previous(app: PauseApp, records: list[KernelRecord], fid: str | None
                   ) -> dict[str, Any] | None:
    """A pause record whose checkpoints are each notebook's newest authentic checkpoint
    (blocking: reads the store). None when no notebook has one. ``records`` are updated."""
    try:
        store = open_keyed_store(app.store_url or None, app.key_path or None)
        kernels = []
        for rec in records:
            found = store.list(rec.stream)
            if found:
                rec.checkpoint_id, rec.token = found[0].id, None
                rec.bytes_total = int(found[0].bytes_total or 0)
                kernels.append((rec, found[0].created))
    except Exception as e:  # noqa: BLE001 - no offer then; the reason goes to the log
        app.log.warning("jupyter_pause: cannot look up earlier checkpoints: %s", e)
        return None
    if not kernels:
        return None
    return {
        "flight_id": fid, "mode": "pause", "offered": True,
        "kernels": [r.to_dict() for r, _ in kernels],
        "checkpoints": [r.checkpoint_id for r, _ in kernels],
        "previous": [{"path": r.path, "stream": r.stream, "checkpoint_id": r.checkpoint_id,
                      "created": created} for r, created in kernels],
    }


def age_words(seconds: float) -> str:
    """``"3 hours"``: a duration in words (its largest unit)."""
    seconds = max(0.0, seconds)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{int(seconds)} s"


def age_text(created: str | None) -> str:
    """``"3 hours old"``: a checkpoint's age in words."""
    try:
        seconds = (datetime.now(timezone.utc) - parse_iso(str(created))).total_seconds()
    except (TypeError, ValueError):
        return "of unknown age"
    return f"{age_words(seconds)} old"


def offer_text(offer: dict[str, Any]) -> str:
    """The offered checkpoints in one line."""
    items = [f"{p.get('path') or p.get('stream')}: checkpoint {p.get('checkpoint_id')}, "
             f"{age_text(p.get('created'))}" for p in offer.get("previous") or []]
    return "previous checkpoints: " + "; ".join(items)


def add_previous(rows: list[dict[str, Any]], offer: dict[str, Any] | None) -> None:
    """Add to each not-saved row of a server stop which earlier checkpoint is still there."""
    previous = {p.get("stream"): p for p in (offer or {}).get("previous") or []}
    for row in rows:
        if row["status"] == "saved":
            continue
        p = previous.get(row.get("stream"))
        row.setdefault("cause", row["reason"])  # why it was not saved, without what follows
        if p:
            row["previous_checkpoint"] = p.get("checkpoint_id")
            row["reason"] = (f"{row['reason']}; its previous checkpoint {p.get('checkpoint_id')} "
                             "is intact")
        else:
            row["previous_checkpoint"] = None
            row["reason"] = f"{row['reason']}; it has no earlier checkpoint"


def offer_hint(pause: dict[str, Any] | None) -> str | None:
    """The hint for the notebooks a server stop did not save and whose earlier checkpoint is
    offered (``previous`` entries with ``not_saved``, see :func:`.state._offer_after_stop`).
    Their age is told as of the stop, so that the text depends on the journal alone."""
    lines = []
    for p in (pause or {}).get("previous") or []:
        why = p.get("not_saved")
        if not isinstance(why, dict):
            continue
        try:
            seconds = (parse_iso(str(why.get("stopped_at")))
                       - parse_iso(str(p.get("created")))).total_seconds()
            age = f"{age_words(seconds)} before the stop"
        except (TypeError, ValueError):
            age = "unknown age"
        lines.append(f"{p.get('path') or p.get('stream')} was not saved at the stop "
                     f"({why.get('reason')}); its checkpoint of {age} can be restored: Resume")
    return ". ".join(lines) + "." if lines else None
