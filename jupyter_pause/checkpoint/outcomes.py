"""What saving or restoring one variable can come to besides success: skipped or stale (raised
while pickling), or restored with something missing (noted while unpickling).

The pickler, the reducers (``reducers/``) and the time limit all use these, so they live apart
from the pickler.
"""

from __future__ import annotations

import threading
from typing import Any


class SkipVariable(Exception):
    """The variable cannot be saved; ``str()`` says why."""

    status = "skipped"


class StaleObject(SkipVariable):
    """The variable would only be saved as a stale lie (a lock, a thread, a writable file...)."""

    status = "stale"


_notes = threading.local()


def start_notes() -> list[tuple[Any, str]]:
    """Collect :func:`note_loaded` calls of this thread (until :func:`stop_notes`)."""
    _notes.current = []
    return _notes.current


def stop_notes() -> None:
    _notes.current = None


def note_loaded(obj: Any, note: str) -> None:
    """Called by a reducer's rebuild function: ``obj`` came back, but not all of it (``note``
    says what is missing). ``load_group`` attributes it to the variable(s) holding it."""
    notes = getattr(_notes, "current", None)
    if notes is not None:
        notes.append((obj, note))


def attribute_notes(got: dict[str, Any], notes: list[tuple[Any, str]]) -> None:
    """Record each note against the variables of ``got`` that hold its object."""
    by_name = getattr(_notes, "by_name", None)
    if by_name is None:
        by_name = _notes.by_name = {}
    for obj, note in notes:
        owners = [n for n, v in got.items() if v is obj]
        if owners:
            for n in owners:
                by_name.setdefault(n, []).append(note)
        else:  # held inside a variable (or several linked ones): all of them are affected
            for n in got:
                by_name.setdefault(n, []).append(f"holds an object whose {note}")


def take_load_notes() -> dict[str, list[str]]:
    """Variable -> what did not come back with it, for the loads since the last call."""
    out = getattr(_notes, "by_name", None) or {}
    _notes.by_name = {}
    return out
