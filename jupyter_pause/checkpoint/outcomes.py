"""What saving or restoring one variable can come to besides success: skipped or stale (raised
while pickling), or restored with something missing (noted while unpickling).

The pickler, the reducers (``reducers/``) and the time limit all use these, so they live apart
from the pickler.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class SkipVariable(Exception):
    """The variable cannot be saved; ``str()`` says why."""

    status = "skipped"


class StaleObject(SkipVariable):
    """The variable would only be saved as a stale lie (a lock, a thread, a writable file...)."""

    status = "stale"


# The load under way in this thread: a reducer's rebuild function is called by the unpickler
# with nothing but its own arguments, so this is its only way to the load it is part of. It lives
# for one unpickling (:func:`collecting_notes`); what it gathered leaves as a return value.
_notes = threading.local()


@contextlib.contextmanager
def collecting_notes() -> Iterator[list[tuple[Any, str]]]:
    """Gather this thread's :func:`note_loaded` calls within the block, into the list given."""
    previous = getattr(_notes, "current", None)
    collected: list[tuple[Any, str]] = []
    _notes.current = collected
    try:
        yield collected
    finally:
        _notes.current = previous


def note_loaded(obj: Any, note: str) -> None:
    """Called by a reducer's rebuild function: ``obj`` came back, but not all of it (``note``
    says what is missing). ``load_group`` attributes it to the variable(s) holding it."""
    notes = getattr(_notes, "current", None)
    if notes is not None:
        notes.append((obj, note))


def notes_by_variable(got: dict[str, Any], notes: list[tuple[Any, str]]) -> dict[str, list[str]]:
    """Variable of ``got`` -> what did not come back with it, from the notes of its load."""
    by_name: dict[str, list[str]] = {}
    for obj, note in notes:
        owners = [n for n, v in got.items() if v is obj]
        if owners:
            for n in owners:
                by_name.setdefault(n, []).append(note)
        else:  # held inside a variable (or several linked ones): all of them are affected
            for n in got:
                by_name.setdefault(n, []).append(f"holds an object whose {note}")
    return by_name
