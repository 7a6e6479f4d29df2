"""The per-variable report row and its rules, as the kernel, the server and the frontend read it."""

from __future__ import annotations

from jupyter_pause.checkpoint import VariableReport
from jupyter_pause.variables import RECOMPUTABLE, as_row, row, set_status, summary

CELL = {"execution_count": 3, "source": "model = fit()"}


def test_recomputable_needs_a_missing_value_and_the_cell_that_made_it():
    for status in RECOMPUTABLE:
        assert row("m", status, cell=CELL)["recomputable"]
        assert not row("m", status)["recomputable"]
        assert not row("m", status, cell={"execution_count": 3, "source": ""})["recomputable"]
    for status in ("saved", "restored", "recomputed", "live"):
        assert not row("m", status, cell=CELL)["recomputable"]


def test_rows_from_the_engine_and_from_json_agree():
    engine = VariableReport("m", "sklearn", 0, "skipped", "not picklable", dict(CELL))
    journaled = {**as_row(engine), "recomputable": False, "extra": 1}  # a stale flag is re-derived
    assert as_row(engine) == as_row(journaled) == {
        "name": "m", "kind": "sklearn", "size": 0, "status": "skipped", "reason": "not picklable",
        "cell": CELL, "recomputable": True}


def test_status_changes_carry_recomputable_along():
    r = row("m", "skipped", cell=CELL)
    set_status(r, "recomputed", "re-ran cell [3]")
    assert (r["status"], r["reason"], r["recomputable"]) == ("recomputed", "re-ran cell [3]", False)
    set_status(r, "failed", "re-running cell [3] failed")  # a failed re-run may be retried
    assert r["recomputable"]


def test_summary_counts_in_status_order():
    rows = [row("a", "failed"), row("b", "saved"), row("c", "odd"), row("d", "saved")]
    assert summary(rows) == "2 saved, 1 failed, 1 odd"
    assert summary([]) == "no variables"
