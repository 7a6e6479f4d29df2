"""Pause -> resume end to end with real kernels, on the local backend."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from tornado.httpclient import HTTPClientError

pytestmark = pytest.mark.timeout(180)

SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [1, 2, 3]
box = {"data": data}
x = 42
"""

CHECK = """
import json
print(json.dumps({
    "x": x, "aliased": box["data"] is data, "data": data,
    "opt_linked": opt.param_groups[0]["params"][0] is model.weight,
    "w": round(float(model.weight.detach().sum()), 5),
}))
"""


async def test_pause_stops_kernels_and_resume_restores(ws, jp_serverapp):
    nb = await ws.open_notebook("analysis.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, SETUP)
    before = json.loads(await ws.run(kid, CHECK))
    await ws.run(kid, "import random\nrandom.seed(7)")  # reported below as "RNG: random"

    flight, st = await ws.flight("pause", {"trigger": "manual"})
    assert st["state"] == "paused", st
    assert st["last_checkpoint"]["kernels"] == 1 and st["last_checkpoint"]["bytes_total"] > 0
    assert list(jp_serverapp.kernel_manager.list_kernel_ids()) == []  # the kernel is gone
    assert st["kernels"] == []

    flight, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    report = st["last_report"]
    assert report["flight_id"] == flight["id"] and report["outcome"] == "restored"
    (k,) = report["kernels"]
    assert k["path"] == "analysis.ipynb" and k["outcome"] == "restored"
    assert "restored from checkpoint" in k["reason"]
    statuses = {v["name"]: v["status"] for v in k["variables"]}
    assert statuses["x"] == "restored" and statuses["model"] == "restored"
    assert report["usable"] and report["durations"]["total_s"] > 0
    # The process state is reported beside the variables, not among them.
    process = {v["name"]: v["status"] for v in k["process_state"]}
    assert process["RNG: random"] == "restored" and "x" not in process

    # The notebook's session now points at the new kernel, which holds the old state.
    sessions = json.loads((await ws.fetch("api", "sessions")).body)
    (s,) = [s for s in sessions if s["path"] == "analysis.ipynb"]
    assert s["id"] == nb["id"] and s["kernel"]["id"] == k["kernel_id"] != kid
    after = json.loads(await ws.run(k["kernel_id"], CHECK))
    assert after == before and after["aliased"] and after["opt_linked"]

    # That cell was the first one after the resume.
    for _ in range(50):
        events = [e["event"] for e in ws.journal()]
        if "first_cell_ran" in events:
            break
        await asyncio.sleep(0.1)
    assert events[-4:] == ["restored", "kernel_usable", "ready", "first_cell_ran"], events
    st = await ws.status()
    assert st["last_report"]["first_cell"] and st["last_report"]["durations"]["first_cell_s"] > 0
    names = [e["event"] for e in st["timeline"]]
    assert names[0] == "resume_requested" and "verified" in names and "restored" in names


@pytest.mark.parametrize(
    "pause_config", [{"PauseApp": {}, "LocalBackend": {"stop_kernels": False}}])
async def test_kernel_that_stayed_is_live_and_not_overwritten(ws, jp_serverapp):
    nb = await ws.open_notebook("live.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "x = 1")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused"
    assert kid in jp_serverapp.kernel_manager  # the backend did not stop it
    await ws.run(kid, "x = 2")  # newer than the checkpoint
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "live", st
    (k,) = st["last_report"]["kernels"]
    assert k["outcome"] == "live" and k["kernel_id"] == kid
    assert {v["name"]: v["status"] for v in k["variables"]}["x"] == "live"
    assert (await ws.run(kid, "print(x)")).strip() == "2"
    assert "restored" not in [e["event"] for e in ws.journal()]


async def test_reopened_notebook_is_not_reported_live(ws, jp_serverapp):
    nb = await ws.open_notebook("re.ipynb")
    await ws.run(nb["kernel"]["id"], "y = 'kept'")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused"
    # The person reopens the notebook before resuming: refused, no kernel starts while paused
    # (one would get the checkpoint merged over its work at resume).
    with pytest.raises(HTTPClientError) as e:
        await ws.open_notebook("re.ipynb")
    assert e.value.code == 409
    assert json.loads(e.value.response.body)["message"] == (
        "the workspace is paused; resume it first")
    _, st = await ws.flight("resume")
    (k,) = st["last_report"]["kernels"]
    # The resume's fresh kernel has no liveness token: restored, never reported live.
    assert st["outcome"] == "restored" and k["outcome"] == "restored", st
    assert (await ws.run(k["kernel_id"], "print(y)")).strip() == "kept"
    assert list(jp_serverapp.kernel_manager.list_kernel_ids()) == [k["kernel_id"]]


async def test_concurrent_requests_make_one_flight(ws, jp_serverapp):
    nb = await ws.open_notebook("many.ipynb")
    await ws.run(nb["kernel"]["id"], "z = list(range(10))")

    async def post(kind):
        try:
            r = await ws.fetch("jupyter-pause", "api", kind, method="POST", body="{}")
            return r.code, json.loads(r.body)
        except HTTPClientError as e:
            return e.code, json.loads(e.response.body)

    # 25 pauses + 25 resumes at once while running: the pauses join one flight, resumes refused.
    replies = await asyncio.gather(*(post("pause" if i % 2 else "resume") for i in range(50)))
    pauses = [b for c, b in replies if c == 202]
    assert len(pauses) == 25 and len({b["flight"]["id"] for b in pauses}) == 1
    assert all(c == 409 and b["message"] for c, b in replies if c != 202)
    await ws.lifecycle.wait()
    assert (await ws.status())["state"] == "paused"

    # 50 resumes at once while paused: one flight, one restore.
    replies = await asyncio.gather(*(post("resume") for _ in range(50)))
    assert {c for c, _ in replies} == {202}
    assert len({b["flight"]["id"] for _, b in replies}) == 1
    await ws.lifecycle.wait()
    st = await ws.status()
    assert st["state"] == "ready" and st["outcome"] == "restored"
    journal = [e["event"] for e in ws.journal()]
    assert journal.count("pause_requested") == 1 and journal.count("resume_requested") == 1
    assert journal.count("restored") == 1
    assert len(jp_serverapp.kernel_manager.list_kernel_ids()) == 1
    kid = st["last_report"]["kernels"][0]["kernel_id"]
    assert (await ws.run(kid, "print(sum(z))")).strip() == "45"
    # Once ready, a new resume is refused: nothing is paused.
    code, body = await post("resume")
    assert code == 409 and "not paused" in body["message"]


async def test_busy_kernel_refuses_pause_and_changes_nothing(ws, jp_serverapp, pause_dirs):
    nb = await ws.open_notebook("busy.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "v = 7")
    busy = await ws.start_cell(kid, "import time; time.sleep(60)")
    try:
        _, st = await ws.flight("pause")  # busy_timeout is 2 s in these tests
        assert st["state"] == "failed", st
        assert "busy.ipynb" in st["reason"] and "still running a cell" in st["reason"]
        # "failed" with running kernels is fine when the person reads that nothing was lost
        assert st["hint"].startswith("Your kernels are untouched and the last good checkpoint "
                                     "is intact."), st["hint"]
        assert kid in jp_serverapp.kernel_manager
        assert jp_serverapp.kernel_manager.get_kernel(kid).execution_state == "busy"
        assert st["last_checkpoint"] is None
        assert list(pause_dirs["store"].rglob("*.json")) == []  # nothing written
        # interrupt=true interrupts the cell instead, and the pause goes through.
        _, st = await ws.flight("pause", {"interrupt": True})
        assert st["state"] == "paused", st
    finally:
        busy.cancel()  # interrupted, the cell's run ends in an error
        with contextlib.suppress(BaseException):
            await busy
    _, st = await ws.flight("resume")
    kid2 = st["last_report"]["kernels"][0]["kernel_id"]
    assert (await ws.run(kid2, "print(v)")).strip() == "7"


async def test_status_answers_quickly_during_a_large_checkpoint(ws):
    import time

    nb = await ws.open_notebook("big.ipynb")
    # 128 MiB of incompressible data: enough for a checkpoint that lasts a while here.
    await ws.run(nb["kernel"]["id"],
                 "import numpy as np; big = np.random.default_rng(0).random(16 * 2**20)")
    await ws.api("POST", "pause")
    latencies, states, progress = [], set(), []
    while ws.lifecycle.flight is not None:
        t0 = time.perf_counter()
        st = await ws.status()
        latencies.append(time.perf_counter() - t0)
        states.add(st["state"])
        if st["step"] and st["step"]["name"] == "checkpointing" and st["step"]["total"]:
            progress.append((st["step"]["done"], st["step"]["total"]))
        await asyncio.sleep(0.02)
    assert "checkpointing" in states and len(latencies) >= 5
    latencies.sort()
    p50, worst = latencies[len(latencies) // 2], latencies[-1]
    # (the worst: a loaded 2-core runner; bench/bench_status_latency.py measures it)
    assert p50 < 0.1 and worst < 2.0, (p50, worst, len(latencies))
    assert progress and progress[-1][1] >= 128 * 2**20  # bytes done / total across kernels
    assert (await ws.status())["state"] == "paused"


async def test_resume_replaces_a_kernel_that_dies_at_start(ws, monkeypatch):
    """ipykernel binds one extra, OS-chosen port besides the five jupyter_client picks, so a
    kernel starting beside another can find one of its ports taken and die; its restarter then
    reuses the same cached ports until the kernel is removed (jupyter_client#487, seen in the
    lifecycle soak). Resume starts a new kernel (new ports) instead of failing."""
    import socket

    from jupyter_client.connect import LocalPortCache

    nb = await ws.open_notebook("port.ipynb")
    await ws.run(nb["kernel"]["id"], "v = 7")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused", st

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = LocalPortCache.find_available_port
    handed: list[int] = []

    def find(self, ip):  # the next kernel's first port is one another process holds
        if not handed:
            handed.append(taken.getsockname()[1])
            return handed[0]
        return real(self, ip)

    monkeypatch.setattr(LocalPortCache, "find_available_port", find)
    try:
        _, st = await ws.flight("resume")
    finally:
        taken.close()
    assert handed, "the resume started no kernel"
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    kid = st["last_report"]["kernels"][0]["kernel_id"]
    assert (await ws.run(kid, "print(v)")).strip() == "7"
