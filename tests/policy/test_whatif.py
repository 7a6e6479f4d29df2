"""The what-if against the seed example: 168 h allocated, 40 h used -> at most 128 h released.

Trace: Mon-Fri 09:00-17:00 in one week. Idle gaps: Mon 00:00-09:00 (9 h), four nights of 16 h,
Fri 17:00 -> Mon 00:00 (55 h): 128 h in six gaps, five of which end in activity (restarts).
For threshold T and capture c: released = 128 - 6 (T + c).
"""

from __future__ import annotations

import json
import os

import pytest

from jupyter_pause.journal import parse_lines, parse_time
from jupyter_pause.policy.render import render_whatif
from jupyter_pause.policy.whatif import (
    make_trace,
    measured_costs,
    read_trace,
    simulate,
    trace_from_journal,
)
from jupyter_pause.units import parse_duration

HERE = os.path.dirname(__file__)
TRACE = os.path.join(HERE, "fixtures", "trace_168_40.csv")
H = 3600.0


def test_seed_trace_totals():
    tr = read_trace(TRACE)
    assert tr.allocated_s == 168 * H
    assert tr.used_s == 40 * H
    assert len(tr.gaps()) == 6


@pytest.mark.parametrize("thr,released", [(900, 126.5), (H, 122.0), (4 * H, 104.0)])
def test_seed_thresholds_without_costs(thr, released):
    w = simulate(read_trace(TRACE), [thr])
    assert w["upper_bound_h"] == 128.0
    row = w["thresholds"][0]
    assert row["released_h"] == pytest.approx(released)
    assert row["held_h"] == pytest.approx(168 - released)
    assert row["pauses"] == 6 and row["restarts"] == 5


def test_seed_with_capture_and_restore_costs():
    w = simulate(read_trace(TRACE), [900, H, 4 * H], capture_s=120, restore_s=60,
                 price_per_hour=2.0)
    r15, r1h, r4h = w["thresholds"]
    assert r15["released_h"] == pytest.approx(128 - 6 * (0.25 + 120 / H))
    assert r4h["released_h"] == pytest.approx(128 - 6 * (4 + 120 / H))
    assert r15["capture_h"] == pytest.approx(6 * 120 / H)
    assert r15["restore_wait_h"] == pytest.approx(5 * 60 / H)
    assert r1h["saved"] == pytest.approx(2.0 * r1h["released_h"])
    assert [r["threshold_s"] for r in w["thresholds"]] == [900, H, 4 * H]


@pytest.mark.parametrize("capture", [0, 30, 3600])
def test_upper_bound_never_exceeded(capture):
    thresholds = [0, 1, 60, 900, H, 4 * H, 9 * H, 16 * H, 55 * H, 100 * H]
    w = simulate(read_trace(TRACE), thresholds, capture_s=capture)
    for row in w["thresholds"]:
        assert 0 <= row["released_h"] <= w["upper_bound_h"] + 1e-9
    if capture == 0:
        assert w["thresholds"][0]["released_h"] == pytest.approx(128.0)  # T = 0 reaches it
    assert w["thresholds"][-1]["pauses"] == 0 and w["thresholds"][-1]["released_h"] == 0


def test_short_breaks_force_restarts_only_at_low_thresholds(tmp_path):
    # 09:00-12:45 and 13:15-17:30 every weekday: still 40 h used, plus a 30 min lunch.
    rows = [{"start": "2026-11-02T00:00:00Z", "end": "2026-11-09T00:00:00Z", "kind": "allocated"}]
    for d in range(2, 7):
        rows += [{"start": f"2026-11-0{d}T09:00:00Z", "end": f"2026-11-0{d}T12:45:00Z"},
                 {"start": f"2026-11-0{d}T13:15:00Z", "end": f"2026-11-0{d}T17:30:00Z"}]
    p = tmp_path / "lunch.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    tr = read_trace(str(p))
    assert tr.used_s == 40 * H
    r15, r1h = simulate(tr, [900, H])["thresholds"]
    assert (r15["pauses"], r15["restarts"]) == (11, 10)
    assert r15["released_h"] == pytest.approx(128 - 11 * 0.25)
    assert (r1h["pauses"], r1h["restarts"]) == (6, 5)
    assert r1h["released_h"] == pytest.approx(128 - 2.5 - 6 * 1)


def test_window_flags_override_and_bad_rows(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("0,3600\n7200,10800\n")
    tr = read_trace(str(p), start=0, end=4 * H)
    assert tr.allocated_s == 4 * H and tr.used_s == 2 * H
    bad = tmp_path / "bad.csv"
    bad.write_text("start,end\nyesterday,today\n")
    with pytest.raises(ValueError, match="row 1"):
        read_trace(str(bad))


def test_trace_from_journal_activity_and_measured_costs():
    lines = [
        {"at": "2026-11-02T00:00:00Z", "event": "activity", "busy_kernels": 1, "connections": 1},
        {"at": "2026-11-02T00:30:00Z", "event": "activity", "busy_kernels": 0, "connections": 1},
        {"at": "2026-11-02T03:00:00Z", "flight": "p", "kind": "pause",
         "event": "pause_requested", "trigger": "idle"},
        {"at": "2026-11-02T03:02:00Z", "flight": "p", "kind": "pause",
         "event": "accelerator_released"},
        {"at": "2026-11-02T05:00:00Z", "flight": "r", "kind": "resume",
         "event": "resume_requested"},
        {"at": "2026-11-02T05:00:30Z", "flight": "r", "kind": "resume", "event": "kernel_usable"},
        {"at": "2026-11-02T05:01:00Z", "flight": "r", "kind": "resume", "event": "first_cell_ran"},
        {"at": "2026-11-02T06:00:00Z", "event": "activity", "busy_kernels": 0, "connections": 1},
    ]
    j = parse_lines(json.dumps(x) for x in lines)
    tr = trace_from_journal(j)
    t0 = parse_time("2026-11-02T00:00:00Z")
    # busy: [-60 s, 0] clipped away, [0, 30 min] (busy kernel), [5:00, 5:01], [5:59, 6:00]
    assert tr.start == t0 and tr.end == t0 + 6 * H
    assert tr.busy == [(t0, t0 + 1800), (t0 + 5 * H, t0 + 5 * H + 60),
                       (t0 + 6 * H - 60, t0 + 6 * H)]
    costs = measured_costs(j)
    assert costs["capture_s"] == 120 and costs["restore_s"] == 60


def test_render_and_durations():
    w = simulate(make_trace([(0, H)], 0, 10 * H), [900, H])
    text = render_whatif(w)
    assert "15m" in text and "1h" in text and "at most 9.0 h" in text
    assert parse_duration("15m") == 900 and parse_duration("1.5h") == 5400
    assert parse_duration("7d") == 7 * 86400 and parse_duration(30) == 30
    with pytest.raises(ValueError):
        parse_duration("soon")
