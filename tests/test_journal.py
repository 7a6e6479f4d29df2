"""The journal's one vocabulary and one time parser, shared by the server and the reports."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from jupyter_pause.journal import (
    EVENTS,
    JOURNAL_FILE,
    Journal,
    parse_iso,
    parse_time,
    read_journal,
)
from jupyter_pause.policy.costreport import COMPUTE_BACK
from jupyter_pause.statefile import STATE_FILE, read_state
from jupyter_pause.vocabulary import FLIGHT_REQUESTS


def test_the_writer_refuses_an_event_outside_the_vocabulary(tmp_path):
    j = Journal(tmp_path / "state")
    j.open()
    j.append({"seq": j.next_seq(), "at": "2026-01-01T00:00:00Z", "event": "paused"})
    with pytest.raises(ValueError, match="not a journal event"):
        j.append({"seq": j.next_seq(), "event": "pasued"})
    lines = (tmp_path / "state" / JOURNAL_FILE).read_text().splitlines()
    assert [json.loads(x)["event"] for x in lines] == ["paused"]
    assert [e.event for e in read_journal(str(tmp_path / "state" / JOURNAL_FILE)).events] == [
        "paused"]


def test_the_reports_read_only_events_of_the_vocabulary():
    assert set(FLIGHT_REQUESTS) <= EVENTS and set(COMPUTE_BACK) <= EVENTS


def test_state_is_written_and_read_through_one_file_name(tmp_path):
    j = Journal(tmp_path)
    j.open()
    assert j.load_state() is None
    j.save_state({"seq": 3, "state": "paused"})
    assert j.state_path.name == STATE_FILE
    assert read_state(tmp_path) == j.load_state() == {"seq": 3, "state": "paused"}


@pytest.mark.parametrize("text", ["2026-11-03T09:30:00.250Z", "2026-11-03T10:30:00.250+01:00",
                                  "2026-11-03T09:30:00.250", "1793698200.25"])
def test_one_time_parser(text):
    assert parse_time(text) == 1793698200.25
    assert parse_iso(text) == datetime(2026, 11, 3, 9, 30, 0, 250000, tzinfo=timezone.utc)
