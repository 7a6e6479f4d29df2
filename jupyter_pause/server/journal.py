"""The lifecycle's durable record: ``state.json`` (atomic snapshot) + ``journal.jsonl`` (append-only).

Every line of the journal carries a sequence number and state.json records the last one it
reflects, so a crash between the two writes is repaired on start by replaying the newer lines.
Both files live on the persistent volume so the history survives the pod going away.
All methods here block (fsync): the Lifecycle calls them from one worker thread, in order.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
JOURNAL_FILE = "journal.jsonl"

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


class Journal:
    def __init__(self, state_dir: str | os.PathLike[str]):
        self.dir = Path(state_dir)
        self.state_path = self.dir / STATE_FILE
        self.journal_path = self.dir / JOURNAL_FILE
        self.seq = 0

    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
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
        with open(self.journal_path, "a", encoding="utf-8") as f:
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
