"""`jupyter pause report` end to end through the CLI functions (table, --json, --plot)."""

from __future__ import annotations

import json
import os
import struct
import sys

import pytest

from jupyter_pause.cli import main

HERE = os.path.dirname(__file__)
J = os.path.join(HERE, "fixtures", "journal_two_days.jsonl")
TRACE = os.path.join(HERE, "fixtures", "trace_168_40.csv")


def test_report_json_with_seed_whatif(capsys):
    rc = main(["report", "--journal", J, "--until", "2026-11-04T00:00:00Z", "--trace", TRACE,
               "--thresholds", "15m,1h,4h", "--capture-s", "0", "--restore-s", "0", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["report"]["totals"]["accelerator_hours_held"] == pytest.approx(51.766667, 1e-5)
    w = data["whatif"]
    assert (w["allocated_h"], w["used_h"], w["upper_bound_h"]) == (168, 40, 128)
    assert [r["released_h"] for r in w["thresholds"]] == pytest.approx([126.5, 122, 104])


def test_report_table_and_plot(tmp_path, capsys):
    png = tmp_path / "r.png"
    rc = main(["report", "--journal", J, "--until", "2026-11-04T00:00:00Z", "--whatif",
               "--plot", str(png)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Accelerator report" in out and "What-if" in out and str(png) in out
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", head[16:24])
    assert w >= 600 and h >= 300


def test_whatif_from_journal_measures_costs(capsys):
    rc = main(["report", "--journal", J, "--until", "2026-11-04T00:00:00Z", "--whatif",
               "--json"])
    assert rc == 0
    w = json.loads(capsys.readouterr().out)["whatif"]
    assert w["capture_s"] == 60.0 and w["restore_s"] == 350.0  # medians of the journal
    assert "measured from 3 pauses and 2 resumes" in w["costs_source"]


def test_plot_without_matplotlib_is_a_clear_message(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m.startswith("matplotlib")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    rc = main(["report", "--journal", J, "--plot", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc == 1 and "needs matplotlib" in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()


def test_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "t.csv"
    bad.write_text("start,end\nnope,never\n")
    assert main(["report", "--journal", J, "--trace", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    assert main(["report", "--journal", J, "--thresholds", "soon"]) == 1
