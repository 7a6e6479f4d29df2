"""The lifecycle's durable record: ``state.json`` (atomic snapshot) + ``journal.jsonl`` (append-only).

The server writes both (:class:`Journal`); the policy tools read the journal for reports
(:func:`read_journal`) and, like the kernel side, read ``state.json`` through
:mod:`jupyter_pause.statefile`. Standard library only, so every layer can import it.

Every line of the journal carries a sequence number and state.json records the last one it
reflects, so a crash between the two writes is repaired on start by replaying the newer lines.
Both files live on the persistent volume so the history survives the pod going away.
The writer's methods block (fsync): the server calls them from one worker thread, in order.
A reader skips a torn last line (a crash mid-write) and any line that is not an event, and
counts them instead of failing.

The journal holds cell sources (provenance in reports), so everything under the state directory
is private to the user: folders 0700 and files 0600 whatever the umask, and too-open modes found
at start are tightened with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .atomicfile import replace_file
from .statefile import STATE_FILE, read_state
from .vocabulary import JOURNAL_EVENTS

JOURNAL_FILE = "journal.jsonl"
_log = logging.getLogger(__name__)

# Every event the journal may hold (the contract other components read, named in
# :mod:`.vocabulary`); the writer refuses any other name, so a report never meets an event it
# does not know.
EVENTS = frozenset(JOURNAL_EVENTS)


# A journal line longer than this is skipped unread (a ready event with thousands of variables
# is a few MiB): the file is input like any other, and one line must not take the memory.
MAX_LINE = 32 << 20
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# The fields :func:`jupyter_pause.server.state.apply` and the reports read, by type: a line
# whose field has another type is skipped (and counted), never folded into the state.
_STR = (str, type(None))
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "flight": _STR, "kind": _STR, "trigger": _STR, "mode": _STR, "message": _STR,
    "reason": _STR, "hint": _STR, "state_after": _STR, "outcome": _STR, "path": _STR,
    "step": _STR, "kernel_id": _STR, "checkpoint_id": _STR,
    "kernels": (list, type(None)), "checkpoints": (list, type(None)),
    "variables": (list, type(None)), "rows": (list, type(None)),
    "report": (dict, type(None)), "resume_from": (dict, type(None)),
    "durations": (dict, type(None)), "inflight": (dict, type(None)),
    "bytes_written": (int, float, type(None)), "bytes_total": (int, float, type(None)),
    "offer": (dict, type(None)), "offers": (list, type(None)),
}
_LIST_OF_DICTS = ("kernels", "variables", "rows", "offers")


def entry_problem(obj: Any) -> str | None:
    """Why a decoded journal line is not an event this version can fold in, else None."""
    if not isinstance(obj, dict):
        return f"not a JSON object but {type(obj).__name__}"
    seq = obj.get("seq", 0)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        return f"seq {str(seq)[:40]!r} is not a non-negative integer"
    event = obj.get("event")
    if not isinstance(event, str) or event not in EVENTS:
        return f"unknown event {str(event)[:40]!r}"
    try:
        if not math.isfinite(parse_time(obj.get("at"))):
            raise ValueError
    except (ValueError, TypeError, OverflowError):
        return f"at {str(obj.get('at'))[:40]!r} is not a time"
    for name, types in _FIELD_TYPES.items():
        value = obj.get(name)
        if not isinstance(value, types) or isinstance(value, bool):
            return f"{name} is {type(value).__name__}, not {'/'.join(t.__name__ for t in types)}"
    for name in _LIST_OF_DICTS:
        if not all(isinstance(x, dict) for x in obj.get(name) or []):
            return f"{name} holds something other than objects"
    if not all(isinstance(x, str) for x in obj.get("checkpoints") or []):
        return "checkpoints holds something other than ids"
    return None


def _no_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate (valid in JSON text, not in UTF-8) replaced by
    U+FFFD, so that nothing read from the journal can break a print or a reply."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_no_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_no_surrogates(k): _no_surrogates(v) for k, v in value.items()}
    return value


def decode_line(line: str) -> tuple[Any, str | None]:
    """(the event, None) for a good journal line, else (None, why it is skipped)."""
    if len(line) > MAX_LINE:
        return None, f"longer than {MAX_LINE >> 20} MiB"
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as e:
        return None, f"not JSON ({str(e)[:80]})"
    why = entry_problem(obj)
    if why is not None:
        return None, why
    return (_no_surrogates(obj) if _SURROGATE_ESCAPE.search(line) else obj), None


def read_lines(f: Any) -> Iterator[str]:
    """The lines of a text file, each at most :data:`MAX_LINE` + 1 characters: the rest of a
    longer one is read in bounded pieces and dropped (the line is then too long to decode)."""
    while True:
        line = f.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith("\n"):
            while (rest := f.readline(1 << 20)) and not rest.endswith("\n"):
                pass
        yield line


# ---------------------------------------------------------------------- time


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


def parse_iso(value: Any) -> datetime:
    """:func:`parse_time` as an aware UTC datetime (for arithmetic with ``datetime.now``)."""
    return datetime.fromtimestamp(parse_time(value), tz=timezone.utc)


def iso(ts: float) -> str:
    """Epoch seconds -> ISO-8601 UTC with ``Z``."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def utcnow_iso() -> str:
    """Now, as the journal's ``at`` (milliseconds, ``Z``)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------------- private files


def make_private_dir(path: str | os.PathLike[str]) -> None:
    """``mkdir -p`` where every folder it creates is 0700 whatever the umask.

    Folders that already exist are left alone here (a parent may be a shared mount);
    :func:`secure_tree` checks the state directory itself and what is inside it.
    """
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        make_private_dir(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)  # mkdir's mode passes through the umask; this one does not


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` that creates the file 0600 (the umask can only take bits away from that)."""
    return os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)


def secure_tree(root: str | os.PathLike[str], log: logging.Logger | None = None) -> list[str]:
    """Make ``root`` and everything under it private (folders 0700, files without group/other
    bits); returns the paths that were tightened, each reported in the log with its old mode.

    Symbolic links are neither followed nor changed. A path that cannot be fixed (another
    owner) is reported as an error and left as it is.
    """
    log = log or _log
    fixed: list[str] = []
    if os.name == "nt" or not os.path.isdir(root):
        return fixed

    def fix(path: str, want_dir: bool) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            return
        mode = stat.S_IMODE(st.st_mode)
        new = (mode | 0o700) & ~0o077 if want_dir else mode & ~0o077
        if new == mode:
            return
        try:
            os.chmod(path, new)
        except OSError as e:
            log.error("jupyter_pause: %s is mode %04o (readable by others) and cannot be made "
                      "private: %s; fix it with: chmod %s %s", path, mode, e.strerror or e,
                      "700" if want_dir else "600", path)
            return
        log.warning("jupyter_pause: %s was mode %04o, readable by other users; made it %04o "
                    "(the state directory holds cell sources)", path, mode, new)
        fixed.append(path)

    fix(str(root), True)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            fix(os.path.join(dirpath, d), True)
        for f in filenames:
            fix(os.path.join(dirpath, f), False)
    return fixed


# ---------------------------------------------------------------------- the writer


class Journal:
    """The server's writer of the state directory: journal lines and the state snapshot."""

    def __init__(self, state_dir: str | os.PathLike[str], log: logging.Logger | None = None):
        self.dir = Path(state_dir)
        self.state_path = self.dir / STATE_FILE
        self.journal_path = self.dir / JOURNAL_FILE
        self.seq = 0
        self.log = log or _log
        # Lines skipped on the last read (not JSON, wrong types, unknown events, too long):
        # each is logged; status shows the count.
        self.skipped_lines = 0

    def open(self) -> None:
        make_private_dir(self.dir)
        secure_tree(self.dir, self.log)
        self.seq = max((entry.get("seq", 0) for entry in self.entries()), default=0)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Make the entry (numbered by ``next_seq()``) durable before returning."""
        if entry.get("event") not in EVENTS:
            raise ValueError(f"not a journal event: {entry.get('event')!r}")
        line = json.dumps(entry, separators=(",", ":"), default=str) + "\n"
        fd = open_private(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with open(fd, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        return entry

    def entries(self, after_seq: int = 0) -> Iterator[dict[str, Any]]:
        """Journal entries in order. A line that is not an event (a torn last line after a
        crash mid-write, an edit by hand, a newer version's event) is skipped with a warning
        and counted in ``skipped_lines``: the journal is input, never a reason to fail."""
        self.skipped_lines = 0
        if not self.journal_path.exists():
            return
        with open(self.journal_path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(read_lines(f), 1):
                if not line.strip():
                    continue
                entry, why = decode_line(line)
                if entry is None:
                    self.skipped_lines += 1
                    self.log.warning("jupyter_pause: %s line %d skipped: %s",
                                     self.journal_path, n, why)
                elif entry.get("seq", 0) > after_seq:
                    yield entry

    def load_state(self) -> dict[str, Any] | None:
        return read_state(self.dir)

    def save_state(self, state: dict[str, Any]) -> None:
        """temp file + fsync + rename + directory fsync: readers see the old or the new file."""
        replace_file(self.state_path, json.dumps(state, default=str), sync_dir=True)


# ---------------------------------------------------------------------- the reader


@dataclass(frozen=True)
class Event:
    """One journal line as reports read it."""

    at: float  # epoch seconds, UTC
    event: str
    flight: str | None = None
    kind: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


@dataclass
class History:
    """The events of a journal file, oldest first, and how many lines were not events."""

    events: list[Event]
    skipped_lines: int = 0
    path: str | None = None


def _parse_line(line: str) -> Event | None:
    obj, _ = decode_line(line)
    if obj is None:
        return None
    at = parse_time(obj["at"])
    rest = {k: v for k, v in obj.items() if k not in ("at", "event", "flight", "kind")}
    return Event(at=at, event=obj["event"], flight=obj.get("flight"), kind=obj.get("kind"),
                 fields=rest)


def parse_lines(lines: Iterable[str]) -> History:
    """Journal lines -> events; a line that is not a JSON object with ``at`` and ``event`` is
    counted in ``skipped_lines``."""
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
    return History(events=events, skipped_lines=skipped)


def journal_path(state_dir: str | os.PathLike[str]) -> str:
    return os.path.join(state_dir, JOURNAL_FILE)


def read_journal(path: str) -> History:
    """Read a journal file; a missing file is an empty history."""
    if not os.path.exists(path):
        return History(events=[], path=path)
    with open(path, encoding="utf-8", errors="replace") as fh:
        history = parse_lines(read_lines(fh))
    history.path = path
    return history


def by_flight(events: Iterable[Event]) -> Iterator[tuple[str, list[Event]]]:
    """Group events by flight id, in order of each flight's first event."""
    groups: dict[str, list[Event]] = {}
    for ev in events:
        if ev.flight:
            groups.setdefault(ev.flight, []).append(ev)
    yield from groups.items()
