"""Cost and capacity report built from the lifecycle journal only.

Definitions (kept in one place so the numbers can be checked by hand):

* The workspace holds its accelerator from the start of the window until ``accelerator_released``;
  it holds it again from the resume that brought compute back: the flight's ``pod_scheduled`` when
  there is one (a cluster waiting for capacity has not given the accelerator back yet), otherwise
  its ``resume_requested``. A resume that failed before any compute came back (no
  ``pod_scheduled``/``verified``/``restored``/``kernel_usable``/``ready``) leaves it released.
* Accelerator-hours = hours x the accelerator count recorded in ``accelerator_released``
  (``{"accelerator": {"type", "count"}}``); the count defaults to ``accelerators`` (1).
* Time to pause = ``pause_requested`` -> ``accelerator_released``. Time to resume =
  ``resume_requested`` -> ``first_cell_ran``, or ``kernel_usable`` when no cell ran yet.
* A server stop (flight kind ``stop``: ``shutdown_requested`` -> ``stopped``) is counted with what
  its shutdown checkpoint saved and not (and why), and the notebooks restored from it later
  (``restored_after_stop``). It does not enter the accelerator-hours: the journal does not see
  when the next server got its accelerator back.
* A flight belongs to the period of its request. Held/released time is split at period bounds
  (UTC days; weeks start on Monday).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from ..journal import Event, History, by_flight, iso
from ..vocabulary import FLIGHT_REQUESTS
from .stats import distribution, hours

PERIODS = ("day", "week", "all")
COMPUTE_BACK = ("pod_scheduled", "verified", "restored", "kernel_usable", "first_cell_ran", "ready")


@dataclass
class Flight:
    """One pause, resume or server stop as the journal tells it."""

    id: str
    kind: str  # "pause" | "resume" | "stop"
    requested: float
    trigger: str | None
    events: dict[str, Event] = field(default_factory=dict)  # first event of each name
    # stop flights: notebooks restored from the stop's checkpoints (outcome -> count)
    restores: Counter = field(default_factory=Counter)

    def at(self, name: str) -> float | None:
        ev = self.events.get(name)
        return ev.at if ev else None

    @property
    def failed(self) -> Event | None:
        return self.events.get("failed")

    @property
    def fail_reason(self) -> str:
        ev = self.failed
        if ev is None:
            return ""
        return str(ev.get("reason") or ev.get("step") or "unknown")

    # pause flights -------------------------------------------------------
    @property
    def released_at(self) -> float | None:
        return self.at("accelerator_released")

    @property
    def accel_count(self) -> float | None:
        ev = self.events.get("accelerator_released")
        acc = ev.get("accelerator") if ev else None
        if isinstance(acc, dict) and isinstance(acc.get("count"), (int, float)):
            return float(acc["count"])
        return None

    @property
    def time_to_pause(self) -> float | None:
        r = self.released_at
        return None if r is None else r - self.requested

    # resume flights ------------------------------------------------------
    @property
    def reacquired_at(self) -> float | None:
        scheduled = self.at("pod_scheduled")
        if scheduled is not None:
            return scheduled
        if any(n in self.events for n in COMPUTE_BACK):
            return self.requested
        if self.failed is not None:
            return None  # never got compute back
        return self.requested  # still in flight: assume compute is coming back now

    @property
    def time_to_resume(self) -> float | None:
        end = self.at("first_cell_ran")
        if end is None:
            end = self.at("kernel_usable")
        return None if end is None else end - self.requested

    @property
    def outcome(self) -> str:
        if self.kind == "stop":
            return "stopped" if "stopped" in self.events else "incomplete"
        if self.kind == "pause":
            if self.failed is not None:
                return "failed"
            return "paused" if ("paused" in self.events or self.released_at) else "incomplete"
        if self.failed is not None:
            return "failed"
        for name in ("ready", "verified"):
            ev = self.events.get(name)
            if ev is not None and ev.get("outcome"):
                return str(ev.get("outcome"))
        if "restored" in self.events:
            return "restored"
        return "incomplete"


def flights(events: list[Event]) -> list[Flight]:
    out: list[Flight] = []
    for fid, evs in by_flight(events):
        kind = next((e.kind for e in evs if e.kind in ("pause", "resume", "stop")), None)
        req = next((e for e in evs if e.event in FLIGHT_REQUESTS), None)
        if kind is None and req is not None:
            kind = FLIGHT_REQUESTS[req.event]
        if kind is None:
            continue
        f = Flight(id=fid, kind=kind, requested=(req or evs[0]).at,
                   trigger=(req.get("trigger") if req else None))
        for e in evs:
            f.events.setdefault(e.event, e)
            if e.event == "restored_after_stop":
                f.restores[str(e.get("outcome") or "unknown")] += 1
        out.append(f)
    out.sort(key=lambda f: f.requested)
    return out


def accelerator_intervals(fl: list[Flight], start: float, end: float, default_count: float = 1.0
                          ) -> tuple[list[tuple[float, float, float]], list[tuple[float, float, float]]]:
    """(held, released) as ``(start, end, count)`` intervals covering ``[start, end)``."""
    held: list[tuple[float, float, float]] = []
    released: list[tuple[float, float, float]] = []
    count = default_count
    state_since, is_held = start, True
    for f in fl:
        if f.kind == "pause" and is_held and f.released_at is not None:
            t = min(max(f.released_at, state_since), end)
            count = f.accel_count if f.accel_count is not None else count
            held.append((state_since, t, count))
            state_since, is_held = t, False
        elif f.kind == "resume" and not is_held and f.reacquired_at is not None:
            t = min(max(f.reacquired_at, state_since), end)
            released.append((state_since, t, count))
            state_since, is_held = t, True
    (held if is_held else released).append((state_since, end, count))
    return [x for x in held if x[1] > x[0]], [x for x in released if x[1] > x[0]]


def period_start(ts: float, period: str) -> float:
    if period == "all":
        return float("-inf")
    d = datetime.fromtimestamp(ts, tz=timezone.utc).replace(hour=0, minute=0, second=0,
                                                            microsecond=0)
    if period == "week":
        d -= timedelta(days=d.weekday())
    return d.timestamp()


def _period_bounds(start: float, end: float, period: str) -> list[tuple[float, float]]:
    if period == "all":
        return [(start, end)]
    step = 86400.0 if period == "day" else 7 * 86400.0
    out, p = [], period_start(start, period)
    while p < end:
        out.append((max(p, start), min(p + step, end)))
        p += step
    return out or [(start, end)]


def _accel_hours(intervals: list[tuple[float, float, float]], s: float, e: float) -> float:
    return sum(hours(b - a) * c for (a, b, c) in
               ((max(a, s), min(b, e), c) for a, b, c in intervals) if b > a)


def _pause_stats(fl: list[Flight]) -> dict:
    pauses = [f for f in fl if f.kind == "pause"]
    return {
        "total": len(pauses),
        "completed": sum(1 for f in pauses if f.outcome == "paused"),
        "failed": sum(1 for f in pauses if f.outcome == "failed"),
        "by_trigger": dict(Counter(f.trigger or "unknown" for f in pauses)),
        "failed_by_reason": dict(Counter(f.fail_reason for f in pauses if f.outcome == "failed")),
    }


def _resume_stats(fl: list[Flight]) -> dict:
    resumes = [f for f in fl if f.kind == "resume"]
    outcomes = Counter(f.outcome for f in resumes)
    return {
        "total": len(resumes),
        "live": outcomes.get("live", 0),
        "restored": outcomes.get("restored", 0),
        "fresh": outcomes.get("fresh", 0),
        "failed": outcomes.get("failed", 0),
        "by_trigger": dict(Counter(f.trigger or "unknown" for f in resumes)),
        "failed_by_reason": dict(Counter(f.fail_reason for f in resumes if f.outcome == "failed")),
    }


def _not_saved_reason(reason: str) -> str:
    """A bounded label for why a kernel was not saved at a stop."""
    text = reason.lower()
    for label, marker in (("busy", "busy"), ("killed", "killed"), ("budget", "budget"),
                          ("kernel_died", "died")):
        if marker in text:
            return label
    return "checkpoint_error"


def _stop_stats(fl: list[Flight]) -> dict:
    stops = [f for f in fl if f.kind == "stop"]
    saved = not_saved = interrupted = 0
    reasons: Counter = Counter()
    restores: Counter = Counter()
    for f in stops:
        ev = f.events.get("stopped")
        restores.update(f.restores)
        if ev is None:
            continue
        interrupted += bool(ev.get("interrupted"))
        for row in ev.get("rows") or []:
            if row.get("status") == "saved":
                saved += 1
            else:
                not_saved += 1
                reasons[_not_saved_reason(str(row.get("reason") or ""))] += 1
    return {
        "total": len(stops),
        "by_trigger": dict(Counter(f.trigger or "unknown" for f in stops)),
        "interrupted": interrupted,
        "kernels_saved": saved,
        "kernels_not_saved": not_saved,
        "not_saved_by_reason": dict(reasons),
        "restored_after": restores.get("restored", 0),
        "restore_failed_after": restores.get("failed", 0),
    }


def _time_to_stop(f: Flight) -> float | None:
    ev = f.events.get("stopped")
    return None if ev is None else ev.at - f.requested


def _size_stats(fl: list[Flight]) -> dict:
    written, totals, snaps = [], [], []
    for f in fl:
        ck = f.events.get("checkpoint_written")
        if ck is not None:
            written.append(int(ck.get("bytes_written") or 0))
            totals.append(int(ck.get("bytes_total") or 0))
        sn = f.events.get("snapshot_ready")
        if sn is not None and not sn.get("skipped"):
            snaps.append(int(sn.get("bytes") or 0))
    return {
        "checkpoints": len(written),
        "checkpoint_bytes_written": sum(written),
        "checkpoint_bytes_total_max": max(totals) if totals else 0,
        "checkpoint_bytes_written_dist": distribution(written),
        "snapshots": len(snaps),
        "snapshot_bytes": sum(snaps),
    }


def _count(v: Any) -> float | None:
    """A non-negative number read back from the journal, else None (the journal is input)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return float(v) if ok else None


def _recovery_stats(events: list[Event]) -> dict:
    """Kernels found dead and servers killed without grace, what was offered back and what was
    taken, and the work lost: cells and seconds between the newest autosave and the death
    (server/deaths.py journals ``kernel_died``/``server_killed`` with their offers)."""
    offers: list[dict] = []
    names: dict[str, int] = {}
    for e in events:
        names[e.event] = names.get(e.event, 0) + 1
        found = [e.get("offer")] if e.event == "kernel_died" else \
            e.get("offers") if e.event == "server_killed" else []
        offers += [o for o in (found if isinstance(found, list) else []) if isinstance(o, dict)]
    cells = [c for c in (_count(o.get("cells_lost")) for o in offers) if c is not None]
    secs = [c for c in (_count(o.get("age_s")) for o in offers) if c is not None]
    return {
        "kernel_deaths": names.get("kernel_died", 0),
        "server_kills": names.get("server_killed", 0),
        "offered": sum(1 for o in offers if isinstance(o.get("checkpoint_id"), str)),
        "restored": names.get("offer_restored", 0),
        "dismissed": names.get("offer_dismissed", 0),
        "cells_lost": int(sum(cells)),
        "seconds_lost": round(sum(secs), 3),
    }


def _section(fl: list[Flight], held, released, s: float, e: float,
             events: Sequence[Event] = ()) -> dict:
    held_h = _accel_hours(held, s, e)
    rel_h = _accel_hours(released, s, e)
    return {
        "start": iso(s),
        "end": iso(e),
        "wall_hours": hours(e - s),
        "accelerator_hours_held": held_h,
        "accelerator_hours_released": rel_h,
        "released_share": (rel_h / (held_h + rel_h)) if (held_h + rel_h) > 0 else 0.0,
        "pauses": _pause_stats(fl),
        "resumes": _resume_stats(fl),
        "stops": _stop_stats(fl),
        "sizes": _size_stats(fl),
        "recoveries": _recovery_stats(list(events)),
        "time_to_pause_s": distribution(f.time_to_pause for f in fl
                                        if f.kind == "pause" and f.time_to_pause is not None),
        "time_to_resume_s": distribution(f.time_to_resume for f in fl
                                         if f.kind == "resume" and f.time_to_resume is not None),
        # request -> stopped: how long the shutdown checkpoint held the server's exit
        "time_to_stop_s": distribution(t for t in (_time_to_stop(f) for f in fl
                                                   if f.kind == "stop") if t is not None),
    }


def build_report(journal: History, *, period: str = "day", since: float | None = None,
                 until: float | None = None, accelerators: float = 1.0) -> dict[str, Any]:
    """The report as a JSON-ready dict: ``{"window", "totals", "periods": [...]}``.

    ``until`` defaults to the last journal event; callers reporting on a live workspace pass now.
    """
    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}")
    events = journal.events
    if not events:
        start = since if since is not None else 0.0
        end = until if until is not None else start
    else:
        start = since if since is not None else events[0].at
        end = until if until is not None else events[-1].at
    end = max(end, start)
    every = flights(events)
    fl = [f for f in every if start <= f.requested <= end]
    # all flights, also those before the window: they decide the state at its start
    held, released = accelerator_intervals(every, start, end, accelerators)
    periods = []
    for s, e in _period_bounds(start, end, period):
        in_p = [f for f in fl if s <= f.requested < e or (f.requested == e == end)]
        evs = [x for x in events if s <= x.at < e or (x.at == e == end)]
        periods.append(_section(in_p, held, released, s, e, evs))
    return {
        "window": {"start": iso(start), "end": iso(end), "period": period},
        "journal": {"path": journal.path, "events": len(events),
                    "skipped_lines": journal.skipped_lines},
        "totals": _section(fl, held, released, start, end,
                           [x for x in events if start <= x.at <= end]),
        "periods": periods,
    }

