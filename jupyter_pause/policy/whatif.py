"""What-if: what each idle threshold would have released and cost over recorded activity.

Model (documented so the numbers can be recomputed by hand): the accelerator is allocated for
the whole window ``[start, end)``; ``busy`` intervals are when the person or a cell used it.
For a threshold ``T`` every idle gap ``g`` (between busy intervals, and at both window edges)
with ``g > T`` triggers a pause at ``T`` into the gap; capturing takes ``capture_s`` (the
accelerator is still held), after which it is released until the gap ends. A gap that ends in
activity (not at the window end) forces a restart: the person waits ``restore_s``. Therefore
released = sum(max(0, g - T - capture_s)) <= allocated - used (the upper bound), with equality
only for T = 0 and zero capture time.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass

from ..journal import History, parse_time
from .costreport import flights
from .stats import clip, hours, merge_intervals, quantile, total

DEFAULT_THRESHOLDS = (15 * 60.0, 3600.0, 4 * 3600.0)


@dataclass
class Trace:
    """The window the accelerator was allocated and when it was used."""

    start: float
    end: float
    busy: list[tuple[float, float]]  # merged, clipped to [start, end)

    @property
    def allocated_s(self) -> float:
        return self.end - self.start

    @property
    def used_s(self) -> float:
        return total(self.busy)

    def gaps(self) -> list[tuple[float, float, bool]]:
        """Idle gaps as ``(start, end, ends_in_activity)``."""
        out, t = [], self.start
        for s, e in self.busy:
            if s > t:
                out.append((t, s, True))
            t = max(t, e)
        if self.end > t:
            out.append((t, self.end, False))
        return out


def make_trace(busy: list[tuple[float, float]], start: float | None = None,
               end: float | None = None) -> Trace:
    merged = merge_intervals(busy)
    if start is None:
        start = merged[0][0] if merged else 0.0
    if end is None:
        end = merged[-1][1] if merged else start
    if end < start:
        raise ValueError("the window ends before it starts")
    return Trace(start=start, end=end, busy=clip(merged, start, end))


def _rows_from_text(text: str, fmt: str) -> list[dict]:
    if fmt == "jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError(f"line {n}: expected a JSON object")
                rows.append(obj)
        return rows
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.reader(io.StringIO("\n".join(lines)))
    out = []
    header: list[str] | None = None
    for row in reader:
        cells = [c.strip() for c in row]
        if header is None and cells and cells[0].lower() == "start":
            header = [c.lower() for c in cells]
            continue
        keys = header or ["start", "end", "kind"]
        out.append(dict(zip(keys, cells, strict=False)))
    return out


def read_trace(path: str, *, start: float | None = None, end: float | None = None) -> Trace:
    """An activity trace: CSV (``start,end[,kind]``) or JSONL (``{"start","end","kind"}``).

    Times are ISO-8601 or epoch seconds. ``kind`` is ``busy`` (default) or ``allocated``: an
    ``allocated`` row sets the window (otherwise it spans the busy intervals; flags win).
    """
    fmt = "jsonl" if path.endswith((".jsonl", ".json", ".ndjson")) else "csv"
    with open(path, encoding="utf-8") as fh:
        rows = _rows_from_text(fh.read(), fmt)
    busy, w_start, w_end = [], None, None
    for n, row in enumerate(rows, 1):
        try:
            s, e = parse_time(row["start"]), parse_time(row["end"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{os.path.basename(path)} row {n}: needs start and end times "
                             f"({exc})") from None
        kind = str(row.get("kind") or "busy").lower()
        if kind == "allocated":
            w_start = s if w_start is None else min(w_start, s)
            w_end = e if w_end is None else max(w_end, e)
        elif kind == "busy":
            busy.append((s, e))
        else:
            raise ValueError(f"{os.path.basename(path)} row {n}: kind must be busy or allocated")
    return make_trace(busy, start if start is not None else w_start,
                      end if end is not None else w_end)


def trace_from_journal(journal: History, *, start: float | None = None, end: float | None = None,
                       granularity_s: float = 60.0) -> Trace:
    """Busy intervals from the journal's ``activity`` events (coalesced, at most one a minute).

    Each ``activity`` event stands for the minute before it; one with ``busy_kernels > 0`` keeps
    the workspace busy until the next journal event (a running cell keeps producing activity).
    ``first_cell_ran`` counts as activity too. Our own pause/resume events never do.
    """
    evs = journal.events
    busy: list[tuple[float, float]] = []
    for i, ev in enumerate(evs):
        if ev.event == "activity":
            busy.append((ev.at - granularity_s, ev.at))
            if (ev.get("busy_kernels") or 0) > 0 and i + 1 < len(evs):
                busy.append((ev.at, evs[i + 1].at))
        elif ev.event == "first_cell_ran":
            busy.append((ev.at - granularity_s, ev.at))
    if start is None and evs:
        start = evs[0].at
    if end is None and evs:
        end = evs[-1].at
    return make_trace(busy, start, end)


def measured_costs(journal: History | None) -> dict:
    """Median capture (time to pause) and restore (time to resume) from the journal."""
    fl = flights(journal.events) if journal else []
    tp = [f.time_to_pause for f in fl if f.kind == "pause" and f.time_to_pause is not None]
    tr = [f.time_to_resume for f in fl if f.kind == "resume" and f.time_to_resume is not None]
    return {"capture_s": quantile(tp, 0.5), "restore_s": quantile(tr, 0.5),
            "pauses_measured": len(tp), "resumes_measured": len(tr)}


def simulate(trace: Trace, thresholds: list[float], *, capture_s: float = 0.0,
             restore_s: float = 0.0, accelerators: float = 1.0,
             price_per_hour: float | None = None) -> dict:
    """The what-if table as a JSON-ready dict (hours are accelerator-hours)."""
    allocated_h = hours(trace.allocated_s) * accelerators
    used_h = hours(trace.used_s) * accelerators
    upper_h = allocated_h - used_h
    gaps = trace.gaps()
    rows = []
    for thr in sorted(thresholds):
        pauses = restarts = 0
        released_s = 0.0
        for gs, ge, ends_in_activity in gaps:
            g = ge - gs
            if g <= thr:
                continue
            pauses += 1
            released_s += max(0.0, g - thr - capture_s)
            if ends_in_activity:
                restarts += 1
        released_h = hours(released_s) * accelerators
        row = {
            "threshold_s": thr,
            "pauses": pauses,
            "restarts": restarts,
            "released_h": released_h,
            "held_h": allocated_h - released_h,
            "capture_h": hours(pauses * capture_s) * accelerators,
            "restore_wait_h": hours(restarts * restore_s),
            "share_of_upper_bound": (released_h / upper_h) if upper_h > 0 else 0.0,
        }
        if price_per_hour is not None:
            row["saved"] = released_h * price_per_hour
            row["cost_held"] = row["held_h"] * price_per_hour
        rows.append(row)
    return {
        "window": {"start": trace.start, "end": trace.end},
        "allocated_h": allocated_h,
        "used_h": used_h,
        "upper_bound_h": upper_h,
        "capture_s": capture_s,
        "restore_s": restore_s,
        "accelerators": accelerators,
        "price_per_hour": price_per_hour,
        "thresholds": rows,
    }

