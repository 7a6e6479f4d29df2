"""The lifecycle's durable record: ``state.json`` (atomic snapshot) + ``journal.jsonl`` (append-only).

Every line of the journal carries a sequence number and state.json records the last one it
reflects, so a crash between the two writes is repaired on start by replaying the newer lines.
Both files live on the persistent volume so the history survives the pod going away.
All methods here block (fsync): the Lifecycle calls them from one worker thread, in order.

The journal holds cell sources (provenance in reports), so everything under the state directory
is private to the user: folders 0700 and files 0600 whatever the umask, and too-open modes found
at start are tightened with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..statefile import STATE_FILE

JOURNAL_FILE = "journal.jsonl"
_log = logging.getLogger(__name__)

# The event names other components read (contract §4); the policy report reads only these.
EVENTS = frozenset({
    "activity", "pause_requested", "checkpoint_written", "snapshot_ready", "accelerator_released",
    "paused", "resume_requested", "waiting_for_capacity", "pod_scheduled", "verified", "restored",
    "kernel_usable", "first_cell_ran", "ready", "failed", "auto_pause_announced",
    "auto_pause_cancelled", "recomputed",
})


def utcnow_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


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


class Journal:
    def __init__(self, state_dir: str | os.PathLike[str], log: logging.Logger | None = None):
        self.dir = Path(state_dir)
        self.state_path = self.dir / STATE_FILE
        self.journal_path = self.dir / JOURNAL_FILE
        self.seq = 0
        self.log = log or _log

    def open(self) -> None:
        make_private_dir(self.dir)
        secure_tree(self.dir, self.log)
        last = None
        for entry in self.entries():
            last = entry
        self.seq = int(last.get("seq", 0)) if last else 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Make the entry (numbered by ``next_seq()``) durable before returning."""
        line = json.dumps(entry, separators=(",", ":"), default=str) + "\n"
        fd = open_private(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with open(fd, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        return entry

    def entries(self, after_seq: int = 0) -> Iterator[dict[str, Any]]:
        """Journal entries in order; a torn last line (crash mid-write) is skipped."""
        if not self.journal_path.exists():
            return
        with open(self.journal_path, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and int(entry.get("seq", 0)) > after_seq:
                    yield entry

    def load_state(self) -> dict[str, Any] | None:
        try:
            with open(self.state_path, encoding="utf-8") as f:
                data = json.load(f)
        except (FileNotFoundError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def save_state(self, state: dict[str, Any]) -> None:
        """temp file + fsync + rename + directory fsync: readers see the old or the new file."""
        fd, tmp = tempfile.mkstemp(prefix=".state.", suffix=".tmp", dir=self.dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(state, f, default=str)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
