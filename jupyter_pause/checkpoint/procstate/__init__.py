"""Process state: what a process holds besides its variables (random streams, the working
directory, the user's changes to ``os.environ`` and ``sys.path``, library settings, warnings
filters, and, registered by the kernel side, IPython's state).

One registry of entries, in the spirit of the reducers: each entry captures one piece of state as
JSON, puts it back, and says what it did. :func:`capture` runs them all; its result goes into the
signed manifest (``Manifest.process``); :func:`restore` runs them in order on what a checkpoint
holds. What comes back from the store is untrusted: an entry validates its state before applying
anything, and a bad or unknown entry is reported (skipped, with the reason), never raised.

Rules every entry keeps:
- capture imports nothing: a library's settings are read only when ``sys.modules`` has it;
- capture returns None when there is nothing to keep (a default value);
- restore never overrides what the new process decided for itself (devices, thread counts and
  variables the platform set): it keeps those and says so.

Entries (tests: tests/checkpoint/test_procstate.py): environment.py (sys.path, cwd, os.environ),
rng.py (python, numpy, torch, CUDA), settings.py (numpy, torch, pandas, matplotlib),
logging_levels.py, warnings_filters.py; the kernel's ipystate.py adds IPython's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..manifest import VariableReport

log = logging.getLogger(__name__)

FORMAT = 1
KIND = "process state"  # the ``kind`` of a process-state row in reports

Outcome = tuple[str, str, "str | None"]  # (row name, status, reason)


class BadState(ValueError):
    """The stored state of an entry is not what the entry writes (reported as skipped)."""


@dataclass(frozen=True)
class Entry:
    """One piece of process state. ``restore`` returns outcomes (row name, status, reason);
    None means one row: ``label`` restored."""

    name: str  # the key in the checkpoint; never changes once released
    label: str  # the row's name in reports (never a Python identifier: no clash with variables)
    capture: Callable[[], Any]
    restore: Callable[[Any], list[Outcome] | None]
    order: int = 50  # restore order: environment first, IPython last
    # fills what capture caches once per process; see warm()
    warm: Callable[[], Any] | None = None


_REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    _REGISTRY[entry.name] = entry
    return entry


def registered() -> list[Entry]:
    return sorted(_REGISTRY.values(), key=lambda e: (e.order, e.name))


def get(name: str) -> Entry:
    return _REGISTRY[name]


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _reason(e: BaseException) -> str:
    text = " ".join((str(e) or type(e).__name__).split())
    return text if len(text) <= 300 else text[:297] + "..."


def capture() -> dict[str, Any]:
    """The process state as JSON: ``{"format", "entries": {name: state}, "skipped": {name:
    reason}}``. Never raises: an entry that fails is recorded as skipped."""
    entries: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for e in registered():
        try:
            state = e.capture()
            if state is None:
                continue
            entries[e.name] = json.loads(json.dumps(state))  # JSON now, not at signing time
        except Exception as exc:
            log.debug("process state %s not captured", e.name, exc_info=True)
            skipped[e.name] = f"not saved: {_reason(exc)}"
    return {"format": FORMAT, "entries": entries, "skipped": skipped}


def warm() -> None:
    """Fill the caches of every entry's capture in this process, so that a child forked from it
    captures from them instead of working them out again (and losing them) on each fork: the
    start ``sys.path`` is a short subprocess (35 ms, measured in an autosave's child). Never
    raises: capture then works it out itself and reports as it would."""
    for e in registered():
        if e.warm is not None and e.name not in _cold:
            try:
                e.warm()
            except Exception:  # capture says what is wrong
                _cold.add(e.name)  # not asked again each time (a subprocess that fails)
                log.debug("process state %s not warmed", e.name, exc_info=True)


_cold: set[str] = set()  # entries whose warm() failed in this process


def _size(state: Any) -> int:
    try:
        return len(json.dumps(state, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return 0


def _label(name: str) -> str:
    e = _REGISTRY.get(name)
    return e.label if e is not None else name


def captured(state: Mapping[str, Any] | None) -> list[VariableReport]:
    """Rows for what :func:`capture` saved (status ``saved``) or could not (``skipped``)."""
    if not isinstance(state, Mapping):
        return []
    rows = [VariableReport(_label(n), KIND, _size(s), "saved")
            for n, s in (state.get("entries") or {}).items()]
    rows += [VariableReport(_label(n), KIND, 0, "skipped", str(r))
             for n, r in (state.get("skipped") or {}).items()]
    return rows


def restore(state: Any) -> list[VariableReport]:
    """Put back the process state a checkpoint holds (``Manifest.process``). ``{}`` (a checkpoint
    written before process state existed) restores nothing. Never raises."""
    if state is None or (isinstance(state, Mapping) and not state):
        return []
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        fmt = state.get("format") if isinstance(state, Mapping) else type(state).__name__
        return [VariableReport("process state", KIND, 0, "skipped",
                               f"unknown process-state format {str(fmt)[:40]!r}")]
    entries = state.get("entries")
    if not isinstance(entries, Mapping):
        return [VariableReport("process state", KIND, 0, "skipped", "malformed in the checkpoint")]
    rows: list[VariableReport] = []
    for e in registered():
        if e.name not in entries:
            continue
        size = _size(entries[e.name])
        try:
            outcomes = e.restore(entries[e.name])
        except BadState as exc:
            outcomes = [(e.label, "skipped", f"malformed in the checkpoint: {_reason(exc)}")]
        except Exception as exc:
            log.debug("process state %s not restored", e.name, exc_info=True)
            outcomes = [(e.label, "failed", _reason(exc))]
        for label, status, reason in outcomes or [(e.label, "restored", None)]:
            rows.append(VariableReport(label, KIND, size, status, reason))
    for name in entries:
        if name not in _REGISTRY:
            rows.append(VariableReport(str(name)[:80], KIND, 0, "skipped",
                                       "no such entry here (a newer version's, or kernel "
                                       "state read outside a kernel)"))
    return rows


# -- helpers shared by the entries -----------------------------------------------------------------


def need(cond: bool, what: str) -> None:
    """Validation of stored state: raise BadState(what) unless ``cond``."""
    if not cond:
        raise BadState(what)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def scalar(v: Any) -> bool:
    """A JSON scalar, the only kind of setting value entries keep."""
    return v is None or isinstance(v, (bool, int, float, str))


from . import environment, logging_levels, rng, settings, warnings_filters  # noqa: F401
