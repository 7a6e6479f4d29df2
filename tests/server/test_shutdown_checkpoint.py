"""Checkpoint on shutdown: a real `jupyter server` process asked to stop (SIGTERM, SIGINT, the
shutdown API) checkpoints its kernels within the budget, and the next server on the same
directories restores them when their notebooks are opened again."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
from server_process import Server

pytestmark = pytest.mark.timeout(300)

# Exit deadlines are generous: they prove the server did not hang, they measure nothing.
SLACK_S = 60.0

# A variable whose serialization takes minutes: a shutdown checkpoint holding it cannot finish.
SLOW = """
class Slow:
    def __reduce__(self):
        import time
        time.sleep(600)
        return (Slow, ())

slow = Slow()
keep = 'new'
"""


def stopped(server: Server) -> dict[str, Any]:
    entries = [e for e in server.journal() if e["event"] == "stopped"]
    assert entries, [e["event"] for e in server.journal()]
    return entries[-1]


def rows(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["path"]: r for r in entry["rows"]}


def kernel_state(server: Server, kernel_id: str) -> str:
    return server.get(f"api/kernels/{kernel_id}")["execution_state"]


def checkpoint_ids(server: Server) -> list[str]:
    return [c["id"] for c in server.get("jupyter-pause/api/checkpoints")["checkpoints"]]


@pytest.fixture
def make_server(tmp_path):
    servers: list[Server] = []

    def make(**pause: Any) -> Server:
        s = Server(tmp_path, pause=pause)
        s.start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def test_sigterm_saves_kernels_and_the_next_start_restores_them(make_server):
    budget = 8.0
    s = make_server(shutdown_checkpoint_budget=budget)
    ka = s.open_notebook("a.ipynb")["kernel"]["id"]
    s.output(ka, "import numpy\nx = 41\narr = numpy.arange(1000)\ndef f():\n    return x + 1")
    kb = s.open_notebook("b.ipynb")["kernel"]["id"]
    s.output(kb, "y = 'lost'")
    s.send("import time\nwhile True:\n    time.sleep(0.05)", kb)  # busy through the stop
    s.wait_for("b.ipynb busy", lambda: kernel_state(s, kb) == "busy")

    s.signal(signal.SIGTERM)
    assert s.wait_exit(budget + SLACK_S) is not None, f"the server did not exit:\n{s.log_tail()}"
    entry = stopped(s)
    assert entry["trigger"] == "signal" and entry["kind"] == "stop"
    assert entry["durations"]["total_s"] >= 0
    by_path = rows(entry)
    assert by_path["a.ipynb"]["status"] == "saved" and by_path["a.ipynb"]["checkpoint_id"]
    assert by_path["b.ipynb"]["status"] == "not_saved"
    assert "busy" in by_path["b.ipynb"]["reason"]

    s.start()
    st = s.get("jupyter-pause/api/status")
    assert st["outcome"] == "stopped" and st["stopped"]["pending"] == ["a.ipynb"], st
    assert "b.ipynb (busy" in st["reason"], st["reason"]
    # The session request answers once the restore is done: the first cell sees the variables.
    ka2 = s.open_notebook("a.ipynb")["kernel"]["id"]
    assert s.output(ka2, "print(x, arr.sum(), f())") == "41 499500 42\n"
    kb2 = s.open_notebook("b.ipynb")["kernel"]["id"]
    assert s.output(kb2, "print('y' in dir())") == "False\n"  # not saved: a fresh kernel

    st = s.get("jupyter-pause/api/status")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    assert st["stopped"]["pending"] == []
    report = st["last_report"]
    assert report["after_stop"]["trigger"] == "signal"
    [k] = report["kernels"]
    assert k["path"] == "a.ipynb" and k["outcome"] == "restored"
    assert k["reason"].startswith("restored after the server was stopped")
    assert {v["name"] for v in k["variables"] if v["status"] == "restored"} >= {"x", "arr", "f"}
    code, out = s.cli("status")
    assert code == 0 and "restored after the server was stopped (stop signal)" in out, out
    assert "b.ipynb: not saved (busy" in out, out

    code, out = s.cli("report", "--json", "--state-dir", str(s.tmp / "state"), "--period", "all")
    assert code == 0, out
    stops = json.loads(out)["report"]["totals"]["stops"]
    assert stops["total"] == 1 and stops["by_trigger"] == {"signal": 1}, stops
    assert stops["kernels_saved"] == 1 and stops["kernels_not_saved"] == 1
    assert stops["not_saved_by_reason"] == {"busy": 1} and stops["restored_after"] == 1
    code, out = s.cli("report", "--state-dir", str(s.tmp / "state"))
    assert code == 0 and "Server stops: 1 (signal 1)" in out, out


def _previous_checkpoint(s: Server, path: str) -> tuple[str, str]:
    """A notebook with an earlier checkpoint (keep == 'safe'), then state too slow to save."""
    kid = s.open_notebook(path)["kernel"]["id"]
    s.output(kid, "%load_ext jupyter_pause\nkeep = 'safe'\n%checkpoint")
    [first] = checkpoint_ids(s)
    s.output(kid, SLOW)
    return kid, first


def _previous_still_restores(s: Server, path: str, first: str) -> None:
    """The earlier checkpoint is listed (verified) and restores."""
    assert checkpoint_ids(s) == [first]  # the abandoned one was never published
    kid = s.open_notebook(path)["kernel"]["id"]
    assert s.output(kid, "print('keep' in dir())") == "False\n"  # nothing restored by itself
    s.output(kid, f"%load_ext jupyter_pause\n%restore --id {first}")
    assert s.output(kid, "print(keep)") == "safe\n"


def test_sigkill_during_the_shutdown_checkpoint_keeps_the_previous_one(make_server):
    s = make_server(shutdown_checkpoint_budget=120)
    _, first = _previous_checkpoint(s, "c.ipynb")

    s.signal(signal.SIGTERM)
    s.wait_for("the shutdown checkpoint to start",
               lambda: any(e["event"] == "shutdown_requested" for e in s.journal()))
    s.kill()  # the grace period is over
    assert not any(e["event"] == "stopped" for e in s.journal())

    s.start()
    entry = stopped(s)
    assert entry["interrupted"] is True and entry["trigger"] == "signal"
    row = rows(entry)["c.ipynb"]
    assert row["status"] == "not_saved" and "killed" in row["reason"], row
    assert row["previous_checkpoint"] == first and first in row["reason"]
    st = s.get("jupyter-pause/api/status")
    assert st["stopped"]["interrupted"] is True and st["stopped"]["pending"] == []
    _previous_still_restores(s, "c.ipynb", first)
    code, out = s.cli("report", "--json", "--state-dir", str(s.tmp / "state"), "--period", "all")
    assert code == 0, out
    stops = json.loads(out)["report"]["totals"]["stops"]
    assert stops["interrupted"] == 1 and stops["not_saved_by_reason"] == {"killed": 1}, stops


def test_a_budget_too_small_keeps_the_old_checkpoint_and_says_why(make_server):
    budget = 3.0
    s = make_server(shutdown_checkpoint_budget=budget)
    _, first = _previous_checkpoint(s, "d.ipynb")

    s.signal(signal.SIGTERM)
    assert s.wait_exit(budget + SLACK_S) is not None, f"the server did not exit:\n{s.log_tail()}"
    row = rows(stopped(s))["d.ipynb"]
    assert row["status"] == "not_saved" and row["previous_checkpoint"] == first, row
    assert "budget of 3 s ran out during its checkpoint" in row["reason"], row
    assert f"previous checkpoint {first} is intact" in row["reason"], row

    s.start()
    _previous_still_restores(s, "d.ipynb", first)
    code, out = s.cli("report", "--json", "--state-dir", str(s.tmp / "state"), "--period", "all")
    assert code == 0, out
    stops = json.loads(out)["report"]["totals"]["stops"]
    assert stops["not_saved_by_reason"] == {"budget": 1}, stops


@pytest.mark.parametrize("how", ["api", "sigint"])
def test_shutdown_api_and_sigint(make_server, how):
    s = make_server()
    kid = s.open_notebook("e.ipynb")["kernel"]["id"]
    s.output(kid, "z = {'a': [1, 2, 3]}")
    if how == "api":  # what `jupyter server stop` does
        try:
            s.request("POST", "api/shutdown")
        except OSError:  # the server may end before its answer is on the wire
            pass
    else:
        s.signal(signal.SIGINT)
    assert s.wait_exit(20 + SLACK_S) is not None, f"the server did not exit:\n{s.log_tail()}"
    entry = stopped(s)
    assert entry["trigger"] == ("api" if how == "api" else "signal")
    assert rows(entry)["e.ipynb"]["status"] == "saved"

    s.start()
    t0 = time.monotonic()
    kid = s.open_notebook("e.ipynb")["kernel"]["id"]
    assert time.monotonic() - t0 < SLACK_S
    assert s.output(kid, "print(z)") == "{'a': [1, 2, 3]}\n"
    assert s.get("jupyter-pause/api/status")["outcome"] == "restored"


def test_a_failed_restore_after_stop_still_opens_the_notebook(make_server):
    s = make_server()
    kid = s.open_notebook("f.ipynb")["kernel"]["id"]
    s.output(kid, "w = 7")
    s.signal(signal.SIGTERM)
    assert s.wait_exit(20 + SLACK_S) is not None, f"the server did not exit:\n{s.log_tail()}"
    assert rows(stopped(s))["f.ipynb"]["status"] == "saved"

    (s.tmp / "key").unlink()  # the checkpoint can no longer be verified
    s.start()
    kid = s.open_notebook("f.ipynb")["kernel"]["id"]
    assert s.output(kid, "print('w' in dir())") == "False\n"
    st = s.get("jupyter-pause/api/status")
    assert st["state"] == "running" and "restore after the server was stopped failed" in \
        st["reason"], st
    assert st["stopped"]["pending"] == []  # tried once, never again over later work
    [k] = st["last_report"]["kernels"]
    assert k["outcome"] == "failed" and k["path"] == "f.ipynb"
