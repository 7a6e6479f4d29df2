"""Faults end in a state a person can act on: a kernel that dies mid-pause, a variable that never
finishes pickling, a server killed mid-checkpoint, two servers on one state directory.

Real servers and kernels throughout; every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import pytest
from server_process import Server

from jupyter_pause.server import bridge as kbridge
from tests.harness import SLOW_PICKLE, until

pytestmark = pytest.mark.timeout(240)


def _pid(ws, kid):
    return ws.serverapp.kernel_manager.get_kernel(kid).provisioner.pid


async def _server_checkpoint(ws, kid):
    """A checkpoint of the kernel written the way a pause writes it (the previous good one)."""
    app = ws.lifecycle.app
    (rec,) = [r for r in await kbridge.running_kernels(ws.serverapp) if r.kernel_id == kid]
    res = await kbridge.call(ws.serverapp, kid, "checkpoint", timeout=120,
                             store_url=app.store_url, key_path=app.key_path, stream=rec.stream)
    assert res["ok"], res
    return res["checkpoint_id"]


# ------------------------------------------------------------------ a kernel dies mid-pause


async def test_kernel_killed_mid_checkpoint_ends_the_pause_with_the_truth(ws, tmp_path):
    nb = await ws.open_notebook("dies.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "x = 41")
    first = await _server_checkpoint(ws, kid)
    marker = tmp_path / "pickling"
    await ws.run(kid, SLOW_PICKLE + f"slow = Slow({str(marker)!r}, 60)")
    old_pid = _pid(ws, kid)

    await ws.api("POST", "pause", {"trigger": "manual"})
    await until(marker.exists, what="the slow variable being pickled")
    os.kill(old_pid, signal.SIGKILL)
    # bridge_timeout is an hour: only the death watcher can end the flight this soon.
    await asyncio.wait_for(ws.lifecycle.wait(), 45)

    st = await ws.status()
    assert st["state"] == "failed", st
    assert "dies.ipynb died during the checkpoint" in st["reason"], st["reason"]
    assert f"its last checkpoint is {first}" in st["reason"], st["reason"]
    assert "untouched" not in (st["hint"] or ""), st["hint"]
    assert st["resume_available"] is True
    offered = st["resume_from"]
    assert offered["offered"] and offered["checkpoints"][0]["checkpoint_id"] == first
    assert offered["checkpoints"][0]["age_s"] >= 0
    # the flight's own entry: the restarter's death watch journals beside it (every 3 s)
    assert [e for e in ws.journal() if e["event"] == "failed"][-1]["reason"] == "kernel_died"

    # The one action offered works: resume restores the last checkpoint into the new process.
    await until(lambda: _pid(ws, kid) not in (None, old_pid), what="the kernel restarted")
    await ws.wait_ready(kid)
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    (k,) = st["last_report"]["kernels"]
    assert k["checkpoint_id"] == first
    assert (await ws.run(k["kernel_id"], "print(x + 1)")).strip() == "42"


# ------------------------------------------------- a kernel that jupyter_server restarted itself

# jupyter_client's restarter (restarter.py, KernelRestarter.poll) restarts a dead kernel on new
# random ports until it has run for stable_start_time (when ports are not cached: KernelManager
# .cache_ports, which keeps the same ports either way), on the same ports after: both regimes,
# made certain by configuration.
NEW_PORTS = {"KernelRestarter": {"stable_start_time": 3600.0, "time_to_dead": 0.5},
             "KernelManager": {"cache_ports": False}}
SAME_PORTS = {"KernelRestarter": {"random_ports_until_alive": False, "time_to_dead": 0.5}}


@pytest.mark.parametrize("pause_config", [NEW_PORTS, SAME_PORTS], ids=["new-ports", "same-ports"])
async def test_a_kernel_that_died_in_a_cell_and_was_restarted_is_not_busy(ws, pause_config):
    """jupyter_server keeps a restarted kernel's last state ("busy": jupyter_server#1395) and,
    after a restart on new ports, watches the old IOPub port (#481): the pause would refuse it
    as busy and the resume would wait on it for bridge_timeout. Nobody talks to the new process
    here, as after a crash in an unattended notebook."""
    nb = await ws.open_notebook("crashes.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "x = 41")
    kernel = ws.serverapp.kernel_manager.get_kernel(kid)
    ports, old_pid = list(kernel.ports), _pid(ws, kid)
    # the old process runs the cell (a request still in flight at the kill would reach a
    # restarted process on the same ports); then its client goes, so nobody waits on the kernel
    cell = await ws.start_cell(kid, "import time; time.sleep(3600)")
    cell.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cell
    os.kill(old_pid, signal.SIGKILL)
    await until(lambda: _pid(ws, kid) not in (None, old_pid), what="the kernel restarted")
    assert (kernel.ports != ports) == (pause_config is NEW_PORTS), (ports, kernel.ports)

    await until(lambda: kbridge.execution_state(ws.serverapp, kid) == "idle", 30,
                what="the restarted kernel read idle")
    # x died with the process; the empty new one pauses (not "still running a cell") and
    # resumes.
    _, st = await ws.flight("pause")
    assert st["state"] == "paused", st
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    (k,) = st["last_report"]["kernels"]
    assert (await ws.run(k["kernel_id"], "print('x' in dir())")).strip() == "False"


async def test_a_restart_asked_through_the_api_still_ends(ws):
    """The same restart event comes for a restart asked through /api/kernels; jupyter_server
    waits for the new process's kernel_info reply there, and re-arming the watch meanwhile
    would cancel that wait (the request would never end)."""
    nb = await ws.open_notebook("restarted.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "x = 1")
    r = await asyncio.wait_for(
        ws.fetch("api", "kernels", kid, "restart", method="POST", body=""), 60)
    assert r.code == 200
    await until(lambda: kbridge.execution_state(ws.serverapp, kid) == "idle", 30,
                what="the restarted kernel read idle")
    assert (await ws.run(kid, "print('x' in dir())")).strip() == "False"


# ------------------------------------------------------------------ a pickle that never ends


@pytest.mark.parametrize("pause_config", [{"PauseApp": {"variable_timeout": 2.0},
                                           "LocalBackend": {"stop_kernels": False}}])
async def test_variable_that_never_finishes_pickling_is_skipped(ws, tmp_path):
    nb = await ws.open_notebook("hangs.ipynb")
    kid = nb["kernel"]["id"]
    marker = tmp_path / "pickling"
    await ws.run(kid, SLOW_PICKLE + f"hung = Slow({str(marker)!r}, 10**6)\nkept = [1, 2, 3]")

    await ws.api("POST", "pause", {"trigger": "manual"})
    await asyncio.wait_for(ws.lifecycle.wait(), 120)  # not bridge_timeout (an hour)
    st = await ws.status()
    assert st["state"] == "paused", st
    (rec,) = ws.lifecycle.state["pause"]["kernels"]
    rows = {v["name"]: v for v in rec["variables"]}
    assert rows["hung"]["status"] == "skipped", rows["hung"]
    assert rows["hung"]["reason"] == "took longer than 2 s to serialize", rows["hung"]
    assert rows["kept"]["status"] == "saved"
    # The kernel is free: a cell runs at once, and the abandoned pickle left nothing behind.
    assert kbridge.execution_state(ws.serverapp, kid) == "idle"
    assert (await ws.run(kid, "print(sum(kept))")).strip() == "6"

    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "live", st


# ------------------------------------------------------------------ request validation


async def _status_code(ws, method, route, raw=None, params=None):
    import tornado.httpclient

    try:
        await ws.fetch("jupyter-pause", "api", *route.split("/"), method=method, body=raw,
                       params=params)
    except tornado.httpclient.HTTPClientError as e:
        return e.code, json.loads(e.response.body)["message"]
    return 200, None


@pytest.mark.parametrize(("route", "body", "words"), [
    ("pause", {"interrupt": "false"}, "interrupt must be true or false"),
    ("pause", {"trigger": "t" * 201}, "trigger is longer than 200"),
    ("pause", {"trigger": 5}, "trigger must be a string"),
    ("pause", {"mode": "hibernate"}, "mode must be one of pause, stop"),
    ("pause", {"interupt": True}, "unknown field 'interupt'"),
    ("resume", {"trigger": ["x"]}, "trigger must be a string"),
    ("recompute", {"path": "a.ipynb", "names": "x"}, "names must be a list"),
    ("recompute", {"names": ["x"]}, "path is required"),
    ("gc", {"keep": True}, "keep must be an integer"),
    ("gc", {"keep": "3"}, "keep must be an integer"),
    ("gc", {"older_than": "1h"}, "older_than must be a finite number"),
    ("gc", {"dry_run": "yes"}, "dry_run must be true or false"),
])
async def test_request_bodies_are_typed(ws, route, body, words):
    code, message = await _status_code(ws, "POST", route, json.dumps(body))
    assert code == 400 and words in message, (code, message)
    assert ws.lifecycle.flight is None and (await ws.status())["state"] == "running"


@pytest.mark.parametrize(("raw", "words"), [
    ("[" * 100000, "larger than 64 KiB"),
    ("[" * 1000, "nests deeper than"),
    ('{"trigger": ' + "[" * 50 + "]" * 50 + "}", "nests deeper than"),
    ('{"trigger": "' + "x" * 70000 + '"}', "larger than 64 KiB"),
    ('{"keep": 1e400}', "keep must be an integer"),
    ('{"older_than": NaN}', "not JSON"),
    ("[]", "must be a JSON object"),
])
async def test_request_bodies_are_bounded(ws, raw, words):
    route = "gc" if "keep" in raw or "older_than" in raw else "pause"
    code, message = await _status_code(ws, "POST", route, raw)
    assert code == 400 and words in message, (code, message)


@pytest.mark.parametrize("query", [
    {"accelerators": "nan"}, {"accelerators": "inf"}, {"accelerators": "1e400"},
    {"accelerators": "-1"}, {"capture_s": "nan"}, {"since": "1e400"},
    {"whatif": "1", "thresholds": "inf"}, {"nosuch": "1"}, {"period": "x" * 100},
])
async def test_report_query_values_are_finite_and_bounded(ws, query):
    code, message = await _status_code(ws, "GET", "report", params=query)
    assert code == 400, (code, message)
    assert (await _status_code(ws, "GET", "report", params={"accelerators": "2"}))[0] == 200


async def test_query_values_of_checkpoints(ws):
    code, message = await _status_code(ws, "DELETE", "checkpoints/a b")
    assert code == 400 and "not allowed" in message, message
    code, message = await _status_code(ws, "GET", "checkpoints", params={"stream": "s" * 5000})
    assert code == 400 and "longer than" in message, message


async def test_free_text_trigger_never_becomes_a_metric_label(ws):
    from jupyter_pause.server import metrics

    text = "a trigger nobody expects 7f3a"
    _, st = await ws.flight("pause", {"trigger": text})
    assert st["state"] == "paused" and st["timeline"][0]["trigger"] == text  # journaled as sent
    labels = {s.labels.get("trigger") for m in metrics.FLIGHTS.collect() for s in m.samples}
    assert text not in labels and "other" in labels


# ------------------------------------------------------------------ real server processes


@pytest.fixture
def servers(tmp_path):
    made = []

    def make(name):
        s = Server(tmp_path / name, shared=tmp_path)
        made.append(s)
        return s

    yield make
    for s in made:
        if s.proc and s.proc.poll() is None:
            s.kill()


def _wait(predicate, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.1)


def test_server_killed_mid_checkpoint_offers_the_previous_checkpoint(servers, tmp_path):
    srv = servers("a").start()
    _, session = srv.call("POST", "api/sessions", {
        "path": "k.ipynb", "name": "k.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
    kid = session["kernel"]["id"]
    # The previous good checkpoint, written in the kernel into the server's store.
    srv.run_cell(kid, "keep = 'safe'\n%load_ext jupyter_pause\n%checkpoint")
    _, listing = srv.call("GET", "jupyter-pause/api/checkpoints")
    (first,) = [c["id"] for c in listing["checkpoints"]]

    # The next pause: its checkpoint is under way (a temp file of it in the store) when the
    # server and its kernels are SIGKILLed.
    marker = tmp_path / "pickling"
    srv.run_cell(kid, "import numpy as np\nbig = np.ones(4 * 2**20)\n" + SLOW_PICKLE
                 + f"slow = Slow({str(marker)!r}, 120)")
    srv.call("POST", "jupyter-pause/api/pause", {"trigger": "manual"})
    _wait(marker.exists, what="the checkpoint under way")
    tmp = tmp_path / "store" / "tmp"
    left = sorted(p.name for p in tmp.iterdir())
    assert left, "a checkpoint under way has its lease in the store's tmp/"
    srv.kill()

    srv.start()
    st = srv.state("failed")
    assert "server stopped during checkpointing" in st["reason"], st
    assert first in st["reason"]
    assert st["resume_available"] is True
    (offer,) = st["resume_from"]["checkpoints"]
    assert offer["checkpoint_id"] == first and offer["path"] == "k.ipynb"
    assert offer["age_s"] >= 0
    assert "Resume" in st["hint"]
    # The dead writer's temp files are cleaned at start.
    _wait(lambda: not set(left) & {p.name for p in tmp.iterdir()}, what="temp files cleaned")

    code, _ = srv.call("POST", "jupyter-pause/api/resume", {"trigger": "manual"})
    assert code == 202
    st = srv.state("ready", "failed")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    (k,) = st["last_report"]["kernels"]
    assert k["checkpoint_id"] == first
    srv.run_cell(k["kernel_id"], "assert keep == 'safe'")


def test_one_server_per_state_directory(servers):
    first = servers("first").start()
    second = servers("second").start()
    code, body = second.call("GET", "jupyter-pause/api/status")
    assert code == 503, body
    assert "another Jupyter server" in body["message"]
    assert f"pid {first.proc.pid}" in body["message"]
    code, _ = second.call("POST", "jupyter-pause/api/pause", {"trigger": "manual"})
    assert code == 503
    assert second.call("GET", "api/status")[0] == 200  # the Jupyter server itself runs
    assert "uses the state directory" in second.log_path.read_text()
    code, _ = first.call("GET", "jupyter-pause/api/status")
    assert code == 200

    # Once the holder is gone (its flock went with it), a new server takes over.
    first.kill()
    third = servers("third").start()
    code, st = third.call("GET", "jupyter-pause/api/status")
    assert code == 200 and st["state"] == "running", st
