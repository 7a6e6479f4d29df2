"""Read the lifecycle journal (``<state_dir>/journal.jsonl``) for reports.

The server appends one JSON object per line and fsyncs it, so a crash can leave at most one torn
line at the end; that line (and any other line that is not a JSON object with ``at`` and
``event``) is skipped and counted instead of failing the whole report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any


@dataclass(frozen=True)
class Event:
    at: float  # epoch seconds, UTC
    event: str
    flight: str | None = None
    kind: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


@dataclass
class Journal:
    events: list[Event]
    skipped_lines: int = 0
    path: str | None = None


def parse_time(value: Any) -> float:
    """ISO-8601 (``Z`` or offset; naive means UTC) or epoch seconds -> epoch seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"not a timestamp: {value!r}")
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _parse_line(line: str) -> Event | None:
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
            return None
        at = parse_time(obj.get("at"))
    except (ValueError, TypeError):
        return None
    rest = {k: v for k, v in obj.items() if k not in ("at", "event", "flight", "kind")}
    return Event(at=at, event=obj["event"], flight=obj.get("flight"), kind=obj.get("kind"),
                 fields=rest)


def parse_lines(lines: Iterable[str]) -> Journal:
    events: list[Event] = []
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        ev = _parse_line(line)
        if ev is None:
            skipped += 1
        else:
            events.append(ev)
    # Stable sort: the file is already in order; this only guards against clock steps.
    events.sort(key=lambda e: e.at)
    return Journal(events=events, skipped_lines=skipped)


def read_journal(path: str) -> Journal:
    """Read a journal file; a missing file is an empty journal."""
    if not os.path.exists(path):
        return Journal(events=[], path=path)
    with open(path, encoding="utf-8", errors="replace") as fh:
        journal = parse_lines(fh)
    journal.path = path
    return journal


def journal_path(state_dir: str) -> str:
    return os.path.join(state_dir, "journal.jsonl")


def by_flight(events: Iterable[Event]) -> Iterator[tuple[str, list[Event]]]:
    """Group events by flight id, in order of each flight's first event."""
    groups: dict[str, list[Event]] = {}
    for ev in events:
        if ev.flight:
            groups.setdefault(ev.flight, []).append(ev)
    yield from groups.items()
