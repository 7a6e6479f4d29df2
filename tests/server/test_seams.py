"""Where the server meets the policy, the kernels and the cluster backends: own clients, our
bridge calls not counted as activity, checkpoint-less stops, and why a resume was cold."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pause_test_backends import ColdStarted

from jupyter_pause.server import bridge as kbridge

pytestmark = pytest.mark.timeout(180)


async def test_two_own_clients_open_at_once_each_get_their_reply(ws):
    nb = await ws.open_notebook("two.ipynb")
    kid = nb["kernel"]["id"]
    a, b = ws.client(kid), ws.client(kid)
    try:
        await asyncio.gather(a.wait_for_ready(timeout=60), b.wait_for_ready(timeout=60))
        assert a.session.session != b.session.session  # distinct shell socket identities
        ra, rb = await asyncio.gather(
            a.execute_interactive("import time; time.sleep(0.5); 1", timeout=30),
            b.execute_interactive("2", timeout=30))
        assert ra["content"]["status"] == rb["content"]["status"] == "ok"
    finally:
        a.stop_channels()
        b.stop_channels()


async def _last_activity(ws):
    return json.loads((await ws.fetch("api", "status")).body)["last_activity"]


async def _settled(ws, kid, quiet=0.3, timeout=10.0):
    """Until the server has seen the kernel idle and its activity still for ``quiet`` s: its
    IOPub watch reads the cell's messages on a socket of its own, so it may lag our client's
    reply. Fails after ``timeout`` s."""
    kernel = ws.serverapp.kernel_manager.get_kernel(kid)
    deadline = time.monotonic() + timeout
    seen, since = kernel.last_activity, time.monotonic()
    while True:
        now = time.monotonic()
        if kernel.last_activity != seen or kernel.execution_state != "idle":
            seen, since = kernel.last_activity, now
        elif now - since >= quiet:
            return
        if now > deadline:
            raise AssertionError(f"kernel {kid} not idle and quiet within {timeout} s: "
                                 f"{kernel.execution_state}, last activity {seen}")
        await asyncio.sleep(0.05)


async def test_our_bridge_calls_and_status_polls_are_not_user_activity(ws):
    nb = await ws.open_notebook("quiet.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "q = 1")
    await _settled(ws, kid)
    before = await _last_activity(ws)
    app = ws.lifecycle.app
    res = await kbridge.call(ws.serverapp, kid, "liveness", timeout=30)
    assert res["pid"]
    res = await kbridge.call(ws.serverapp, kid, "checkpoint", timeout=60,
                             store_url=app.store_url, key_path=app.key_path, stream="quiet",
                             token=None, meta={}, keep=None)
    assert res["ok"], res
    for _ in range(3):  # a UI polling status and the checkpoint list
        await ws.status()
        await ws.api("GET", "checkpoints")
    assert await _last_activity(ws) == before
    # a cell the person runs still counts
    await ws.run(kid, "q += 1")
    await _settled(ws, kid)
    assert await _last_activity(ws) > before


async def test_stop_mode_skips_checkpoint_and_resumes_fresh(ws, jp_serverapp, pause_dirs):
    nb = await ws.open_notebook("small.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "gone = 1\nopen('kept.txt', 'w').write('files survive')")
    flight, st = await ws.flight("pause", {"trigger": "idle", "mode": "stop"})
    assert st["state"] == "paused", st
    assert list(jp_serverapp.kernel_manager.list_kernel_ids()) == []  # released
    events = [e for e in ws.journal() if e.get("flight") == flight["id"]]
    names = [e["event"] for e in events]
    assert names == ["pause_requested", "accelerator_released", "paused"], names
    assert events[0]["mode"] == "stop" and events[0]["trigger"] == "idle"
    assert st["last_checkpoint"] is None
    assert list(pause_dirs["store"].rglob("*.json")) == []  # no checkpoint written

    flight, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "fresh", st
    (k,) = st["last_report"]["kernels"]
    assert k["outcome"] == "fresh" and "without a checkpoint" in k["reason"]
    assert k["kernel_id"] != kid and k["variables"] == []
    names = [e["event"] for e in ws.journal() if e.get("flight") == flight["id"]]
    assert "verified" not in names and "restored" not in names
    out = await ws.run(k["kernel_id"], "print('gone' in globals(), open('kept.txt').read())")
    assert out.strip() == "False files survive"
    sessions = json.loads((await ws.fetch("api", "sessions")).body)
    assert [s["kernel"]["id"] for s in sessions if s["path"] == "small.ipynb"] == [k["kernel_id"]]


async def test_unknown_pause_mode_is_refused(ws):
    from tornado.httpclient import HTTPClientError

    with pytest.raises(HTTPClientError) as e:
        await ws.api("POST", "pause", {"mode": "hibernate"})
    assert e.value.code == 400
    assert ws.lifecycle.flight is None and (await ws.status())["state"] == "running"


@pytest.mark.parametrize("pause_config", [
    {"PauseApp": {"backend": "pause_test_backends.ColdStarted"}, "LocalBackend": {}}])
async def test_cold_start_reason_reaches_the_report(ws):
    nb = await ws.open_notebook("cold.ipynb")
    await ws.run(nb["kernel"]["id"], "c = 3")
    await ws.flight("pause")
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    (k,) = st["last_report"]["kernels"]
    assert k["outcome"] == "restored" and ColdStarted.REASON in k["reason"], k["reason"]
    verified = [e for e in ws.journal() if e["event"] == "verified"][-1]
    assert verified["platform_live"] is False and verified["restore_reason"] == ColdStarted.REASON


@pytest.mark.parametrize("pause_config", [
    {"PauseApp": {"backend": "pause_test_backends.ReleaseFails"}, "LocalBackend": {}}])
async def test_a_stop_the_backend_refuses_ends_failed_not_paused(ws):
    # A stop writes no checkpoint, so "paused" would promise a way back that does not exist.
    nb = await ws.open_notebook("stop.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "kept = 7")
    _, st = await ws.flight("pause", {"mode": "stop"})
    assert st["state"] == "failed" and "no owner" in st["reason"], st
    assert (await ws.run(kid, "print(kept)")).strip() == "7"


@pytest.mark.parametrize("pause_config", [
    {"PauseApp": {"backend": "pause_test_backends.HeldThenReleaseFails"}, "LocalBackend": {}}])
async def test_a_failure_after_a_held_snapshot_writes_nothing(ws):
    # Writes after a snapshot whose pod the cluster stops make its restore fail (GKE's
    # troubleshooting page, "Post-checkpoint mutation risks with PVCs"): the failure is shown
    # but not journaled, and the journal still ends at the checkpoint, which settles the pause.
    nb = await ws.open_notebook("held.ipynb")
    await ws.run(nb["kernel"]["id"], "h = 1")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused" and "timed out" in (st["reason"] or ""), st
    assert ws.journal()[-1]["event"] == "checkpoint_written", ws.journal()[-3:]


def test_a_stop_journals_its_kernels_so_a_restart_mid_stop_can_resume():
    from jupyter_pause.server.state import apply, default_state

    st = default_state()
    kernels = [{"kernel_id": "k1", "path": "small.ipynb", "stream": "small.ipynb"}]
    apply(st, {"seq": 1, "at": "2026-01-01T00:00:00Z", "flight": "pause-1", "kind": "pause",
               "event": "pause_requested", "trigger": "idle", "mode": "stop",
               "kernels": kernels})
    # no checkpoint step: load() settles "releasing" as paused (not "the pause did not happen")
    assert st["state"] == "releasing" and st["inflight"]["kernels"] == kernels
    apply(st, {"seq": 2, "at": "2026-01-01T00:00:01Z", "flight": "pause-1", "kind": "pause",
               "event": "paused", "recovered": True})
    assert st["pause"]["mode"] == "stop" and st["pause"]["kernels"] == kernels
    assert st["last_checkpoint"] is None
