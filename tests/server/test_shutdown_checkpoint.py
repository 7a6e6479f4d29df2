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


def test_a_notebook_not_saved_at_the_stop_offers_its_previous_checkpoint(make_server):
    """Busy past the budget: not saved. The next start offers its previous checkpoint (never
    restored by itself, the offer survives a restart), Resume restores it into a fresh kernel
    and leaves the kernel the person used as it is; the saved notebook restores on opening."""
    budget = 2.0
    s = make_server(shutdown_checkpoint_budget=budget)
    ka = s.open_notebook("a.ipynb")["kernel"]["id"]
    s.output(ka, "x = 41")
    kb = s.open_notebook("b.ipynb")["kernel"]["id"]
    s.output(kb, "%load_ext jupyter_pause\nkeep = 'safe'\n%checkpoint")
    [first] = checkpoint_ids(s)
    s.output(kb, "keep = 'new'")
    s.send("import time\ntime.sleep(600)", kb)  # busy past the budget
    s.wait_for("b.ipynb busy", lambda: kernel_state(s, kb) == "busy")

    s.signal(signal.SIGTERM)
    assert s.wait_exit(budget + SLACK_S) is not None, f"the server did not exit:\n{s.log_tail()}"
    by_path = rows(stopped(s))
    assert by_path["a.ipynb"]["status"] == "saved"
    assert by_path["b.ipynb"]["status"] == "not_saved", by_path
    assert by_path["b.ipynb"]["previous_checkpoint"] == first

    def offered(st: dict[str, Any]) -> None:
        assert st["resume_available"] is True, st
        ro = st["resume_from"]
        assert ro["offered"] is True, ro
        [c] = ro["checkpoints"]
        assert c["path"] == "b.ipynb" and c["checkpoint_id"] == first, c
        assert isinstance(c["age_s"], float) and c["age_s"] >= 0, c
        assert "b.ipynb was not saved at the stop (busy: still running a cell" in st["hint"], st
        assert "before the stop can be restored: Resume" in st["hint"], st["hint"]

    s.start()
    st = s.get("jupyter-pause/api/status")
    assert st["state"] == "running" and st["flight"] is None, st  # never by itself
    assert st["stopped"]["pending"] == ["a.ipynb"], st
    offered(st)
    s.kill()  # nothing runs: the offer must come back from the journal and state.json
    s.start()
    offered(s.get("jupyter-pause/api/status"))

    # The saved notebook is still restored when opened, and the offer stays.
    ka2 = s.open_notebook("a.ipynb")["kernel"]["id"]
    assert s.output(ka2, "print(x)") == "41\n"
    st = s.get("jupyter-pause/api/status")
    assert st["outcome"] == "restored" and st["stopped"]["pending"] == [], st
    offered(st)
    # Opened, the not-saved notebook is empty; the person uses that kernel.
    kb2 = s.open_notebook("b.ipynb")["kernel"]["id"]
    assert s.output(kb2, "mine = 1\nprint('keep' in dir())") == "False\n"
    offered(s.get("jupyter-pause/api/status"))

    s.request("POST", "jupyter-pause/api/resume", {})
    st = s.state("ready", "failed")
    assert st["state"] == "ready", st
    assert st["resume_available"] is False and st["resume_from"] is None, st
    [k] = st["last_report"]["kernels"]
    assert k["path"] == "b.ipynb" and k["outcome"] == "restored", k
    assert k["checkpoint_id"] == first and k["kernel_id"] not in (kb, kb2), k
    assert s.output(k["kernel_id"], "print(keep, 'mine' in dir())") == "safe False\n"
    assert s.output(kb2, "print(mine, 'keep' in dir())") == "1 False\n"  # left as it was
    sessions = {m["path"]: m["kernel"]["id"] for m in s.get("api/sessions")}
    assert sessions["b.ipynb"] == k["kernel_id"] and sessions["a.ipynb"] == ka2, sessions


def test_a_notebook_saved_at_a_stop_is_still_restored_after_a_second_stop(make_server):
    """Saved at one stop, not reopened, then the server stops again with no kernel: its
    checkpoint is still the one restored when it is opened (a second stop used to replace the
    pending list with its own, empty one, and the notebook opened empty)."""
    s = make_server()
    ka = s.open_notebook("a.ipynb")["kernel"]["id"]
    s.output(ka, "x = 41")
    s.signal(signal.SIGTERM)
    assert s.wait_exit(30 + SLACK_S) is not None, s.log_tail()
    first = rows(stopped(s))["a.ipynb"]
    assert first["status"] == "saved", first

    s.start()  # nobody opens a.ipynb
    s.signal(signal.SIGTERM)
    assert s.wait_exit(30 + SLACK_S) is not None, s.log_tail()

    s.start()
    st = s.get("jupyter-pause/api/status")
    assert st["stopped"]["pending"] == ["a.ipynb"], st["stopped"]
    ka = s.open_notebook("a.ipynb")["kernel"]["id"]
    assert s.output(ka, "print(x)") == "41\n"
