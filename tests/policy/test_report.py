"""Report numbers against a hand-computed journal (fixtures/journal_two_days.jsonl).

Hand computation (accelerator count 2 from ``accelerator_released``):
- day 1 released 02:01:30 -> 06:10:00 (pod_scheduled) = 4.141667 h and 20:00:30 -> 24:00 =
  3.991667 h: 8.133333 h x 2 = 16.266667; held 24 - 8.133333 = 15.866667 h x 2 = 31.733333.
- day 2 released 00:00 -> 08:00 (r2 has no pod_scheduled: its resume_requested) = 8 h and
  18:01 -> 24:00 = 5.983333 h (r3 failed waiting for capacity: stays released): 13.983333 h x 2
  = 27.966667; held 10.016667 h x 2 = 20.033333.
- time to pause: p1 90 s, p2 30 s, p4 60 s -> p50 60, p90 84, max 90.
- time to resume: r1 660 s (first_cell_ran), r2 40 s (kernel_usable; no cell) -> p50 350,
  p90 598, max 660.
"""

from __future__ import annotations

import os

import pytest

from jupyter_pause.journal import parse_time, read_journal
from jupyter_pause.policy.costreport import build_report
from jupyter_pause.policy.render import render_report

HERE = os.path.dirname(__file__)
J = os.path.join(HERE, "fixtures", "journal_two_days.jsonl")
END = parse_time("2026-11-04T00:00:00Z")


@pytest.fixture()
def journal():
    return read_journal(J)


def test_torn_last_line_is_skipped_not_fatal(journal):
    assert journal.skipped_lines == 1
    assert len(journal.events) == 29


def test_daily_accelerator_hours(journal):
    r = build_report(journal, period="day", until=END)
    d1, d2 = r["periods"]
    assert d1["start"] == "2026-11-02T00:00:00Z" and d2["start"] == "2026-11-03T00:00:00Z"
    assert d1["accelerator_hours_released"] == pytest.approx(16.266667, abs=1e-5)
    assert d1["accelerator_hours_held"] == pytest.approx(31.733333, abs=1e-5)
    assert d2["accelerator_hours_released"] == pytest.approx(27.966667, abs=1e-5)
    assert d2["accelerator_hours_held"] == pytest.approx(20.033333, abs=1e-5)
    t = r["totals"]
    assert t["accelerator_hours_held"] + t["accelerator_hours_released"] == pytest.approx(96)
    assert t["accelerator_hours_released"] == pytest.approx(16.266667 + 27.966667, abs=1e-5)


def test_pauses_and_resumes_by_outcome_and_reason(journal):
    r = build_report(journal, period="day", until=END)
    d1, d2 = r["periods"]
    assert d1["pauses"] == {"total": 2, "completed": 2, "failed": 0,
                            "by_trigger": {"manual": 1, "idle": 1}, "failed_by_reason": {}}
    assert d2["pauses"]["failed_by_reason"] == {"disk full": 1}
    assert d2["pauses"]["completed"] == 1
    assert d1["resumes"]["live"] == 1 and d1["resumes"]["total"] == 1
    assert d2["resumes"]["restored"] == 1 and d2["resumes"]["failed"] == 1
    assert d2["resumes"]["failed_by_reason"] == {"no capacity": 1}


def test_sizes(journal):
    r = build_report(journal, period="day", until=END)
    s = r["periods"][0]["sizes"]
    assert s["checkpoints"] == 2
    assert s["checkpoint_bytes_written"] == 3000
    assert s["checkpoint_bytes_total_max"] == 6000
    assert s["snapshots"] == 1 and s["snapshot_bytes"] == 5000  # the local "skipped" one is not


def test_time_to_pause_and_resume_distributions(journal):
    t = build_report(journal, period="all", until=END)["totals"]
    assert t["time_to_pause_s"] == {"n": 3, "p50": 60.0, "p90": pytest.approx(84.0), "max": 90.0}
    assert t["time_to_resume_s"] == {"n": 2, "p50": 350.0, "p90": pytest.approx(598.0),
                                     "max": 660.0}


def test_week_period_has_one_bucket(journal):
    r = build_report(journal, period="week", until=END)
    assert len(r["periods"]) == 1
    assert r["periods"][0]["accelerator_hours_released"] == pytest.approx(44.233333, abs=1e-5)


def test_empty_and_missing_journal(tmp_path):
    r = build_report(read_journal(str(tmp_path / "nope.jsonl")), period="day")
    assert r["totals"]["accelerator_hours_held"] == 0
    assert "Accelerator report" in render_report(r)


def test_bad_period(journal):
    with pytest.raises(ValueError, match="period"):
        build_report(journal, period="month")


def test_table_renders_every_period(journal):
    text = render_report(build_report(journal, period="day", until=END))
    assert "2026-11-02" in text and "2026-11-03" in text and "total" in text
    assert "disk full x1" in text and "no capacity x1" in text


def test_window_starting_while_paused(journal):
    # day 2 only: the workspace was paused at its start (p2 released the day before)
    r = build_report(journal, period="all", since=parse_time("2026-11-03T00:00:00Z"), until=END)
    t = r["totals"]
    assert t["accelerator_hours_released"] == pytest.approx(27.966667, abs=1e-5)
    assert t["accelerator_hours_held"] == pytest.approx(20.033333, abs=1e-5)
    assert t["pauses"]["total"] == 2 and t["resumes"]["total"] == 2
