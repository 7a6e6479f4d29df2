"""Bad input, without a server: the CLI's usage errors, the journal reader under fuzzing, the
configuration checks and the size wording."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jupyter_pause import configcheck as cc
from jupyter_pause.journal import Journal, decode_line, read_journal

ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}  # strict errors, as a UTF-8 terminal


def cli(*args: str, env: dict | None = None) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "jupyter_pause.cli", *args], capture_output=True,
                       text=True, timeout=120, env=env or ENV, check=False,
                       errors="replace")
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("args,words", [
    (("status", "--url", "http://[::1"), "not a valid server URL"),
    (("status", "--url", "ftp://host/"), "not an http:// or https://"),
    (("gc", "--keep", "-3"), "must be 0 or more"),
    (("gc", "--keep", "-1"), "must be 0 or more"),
    (("gc", "--keep", "x"), "not a whole number"),
    (("gc", "--older-than", "1e999"), "not a finite duration"),
    (("gc", "--older-than", "nan"), "not a finite duration"),
    (("snapshots", "ws", "-n", "ns", "--keep", "-2"), "must be 0 or more"),
    (("snapshots", "ws", "-n", "ns", "--older-than", "inf"), "not a finite number"),
    (("report", "--accelerators", "-1"), "at least 0"),
    (("report", "--capture-s", "nan"), "not a finite number"),
    (("pause", "--timeout", "0"), "more than 0"),
    (("validate", "check", "--timeout", "inf"), "not a finite number"),
])
def test_bad_values_are_usage_errors(args, words):
    code, out = cli(*args)
    assert code == 2, out
    assert words in out and "Traceback" not in out, out


def test_global_options_after_the_subcommand(tmp_path):
    journal = tmp_path / "journal.jsonl"
    journal.write_text("")
    code, out = cli("report", "--url", "http://127.0.0.1:9/", "--token", "t",
                    "--journal", str(journal))
    assert code == 0 and "unrecognized" not in out, out
    code, out = cli("report", "--journal", str(journal), "--json")
    assert code == 0 and json.loads(out)["report"] is not None


def test_report_survives_lone_surrogates_in_the_journal(tmp_path):
    journal = tmp_path / "journal.jsonl"
    lines = [{"seq": 1, "at": "2024-01-01T00:00:00Z", "event": "pause_requested",
              "flight": "p-\ud800", "kind": "pause", "trigger": "\ud800x"},
             {"seq": 2, "at": "2024-01-01T00:00:05Z", "event": "paused", "flight": "p-\ud800",
              "kind": "pause"}]
    journal.write_text("".join(json.dumps(e) + "\n" for e in lines))  # "\ud800" escapes
    for extra in ((), ("--json",), ("--whatif",)):
        code, out = cli("report", "--journal", str(journal), *extra)
        assert code == 0 and "Traceback" not in out, out


BAD = ['{"seq": "x"}', "not json", "[1]", "7", "null", '{"seq": 2, "event": "nope", "at": 1}',
       '{"seq": 2, "event": "paused", "at": "x"}', '{"seq": 2, "event": "paused"}',
       '{"seq": 2, "event": "paused", "at": 1, "kernels": "x"}', "[" * 50000,
       '{"seq": 2, "event": "paused", "at": 1, "trigger": 5}']


def test_bad_lines_are_skipped_and_counted(tmp_path):
    good = {"seq": 1, "at": "2024-01-01T00:00:00Z", "event": "activity"}
    (tmp_path / "journal.jsonl").write_text(
        "\n".join([json.dumps(good), *BAD, json.dumps({**good, "seq": 3})]) + "\n")
    j = Journal(tmp_path)
    j.open()
    assert j.seq == 3 and j.skipped_lines == len(BAD)
    assert [e["seq"] for e in j.entries()] == [1, 3]
    assert read_journal(str(tmp_path / "journal.jsonl")).skipped_lines == len(BAD)


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4),
                     max_leaves=20)
_fields = st.fixed_dictionaries({}, optional=dict.fromkeys(("seq", "at", "event", "flight", "kind", "kernels", "checkpoints", "report", "trigger", "rows", "variables", "message", "durations"), _json))


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.one_of(st.text(max_size=200), _json.map(json.dumps), _fields.map(json.dumps)))
def test_fuzzed_lines_never_raise(line):
    from jupyter_pause.server.state import apply, default_state

    entry, why = decode_line(line)
    assert (entry is None) != (why is None)
    if entry is not None:  # whatever passes the reader folds into a state without an error
        apply(default_state(), entry)
        json.dumps(entry).encode("utf-8")


@pytest.mark.parametrize("check,value,ok", [
    (cc.device, "auto", True), (cc.device, "cuda:1", True), (cc.device, "tpu", False),
    (cc.device, "cuda:", False), (cc.count, 0, True), (cc.count, -3, False),
    (cc.seconds(), float("nan"), False), (cc.seconds(), float("inf"), False),
    (cc.seconds(positive=True), 0, False), (cc.seconds(), 0, True),
    (cc.store_memory, "1K", False), (cc.store_memory, "256M", True), (cc.store_memory, "", True),
    (cc.store_memory, "lots", False), (cc.store_url, "/some/dir", True),
    (cc.store_url, "memory://x", True), (cc.store_url, "nope://x", False),
    (cc.store_url, "http://[::1", False), (cc.accelerator, {"type": "l4", "count": 1}, True),
    (cc.accelerator, {"count": -1}, False), (cc.gke_duration, "7d", True),
    (cc.gke_duration, "7 days", False),
])
def test_config_checks(check, value, ok):
    assert (check(value) is None) is ok, check(value)


def test_small_size_limit_is_worded_in_its_unit():
    from jupyter_pause.checkpoint.writer import _mb

    assert _mb(1024) == "1.0 KiB" and _mb(500) == "500 B" and _mb(3 << 20) == "3.0 MiB"
