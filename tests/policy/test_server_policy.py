"""Auto-pause inside a real jupyter_server with real kernels (the monitor's clock is faked)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime

import pytest
import tornado.httpclient

from jupyter_pause.kernelclient import OWN_SESSION_PREFIX
from jupyter_pause.server import activity
from jupyter_pause.server import bridge as kbridge
from jupyter_pause.server.activity import not_activity
from jupyter_pause.server.bridge import run_bridge as call_bridge
from tests.harness import person_client, until

pytestmark = pytest.mark.timeout(60)

ROUTES = [("GET", "policy"), ("POST", "policy/cancel"), ("GET", "report")]


@pytest.mark.parametrize("method,route", ROUTES)
async def test_routes_refuse_unauthenticated(jp_fetch, method, route):
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await jp_fetch("jupyter-pause", "api", *route.split("/"), method=method,
                       headers={"Authorization": ""},
                       body=None if method == "GET" else "{}")
    assert e.value.code in (401, 403)


async def test_policy_describes_profile_and_choice(srv):
    p = await srv.api("GET", "policy")
    assert p["enabled"] is True and p["state"] == "watching"
    assert p["profile"]["name"] == "gpu-experiment" and p["profile"]["idle_after"] == 60.0
    assert p["why"] == "configured" and p["cancellable"] is False


async def test_idle_kernel_is_auto_paused_through_the_lifecycle_and_resumes(srv):
    kid = await srv.open_notebook()
    await srv.run(kid, "model_state = {'w': [1.0, 2.0, 3.0]}")
    clock = srv.fake_clock()
    d = await srv.monitor.tick()
    assert d.kind == "none"  # active seconds ago
    clock.advance(61)
    d = await srv.monitor.tick()
    assert d.kind == "fire", d.reason  # nobody connected: no announcement needed
    await srv.lifecycle.wait()
    st = await srv.api("GET", "status")
    assert st["state"] == "paused"
    requested = [e for e in srv.journal() if e["event"] == "pause_requested"]
    assert [e["trigger"] for e in requested] == ["idle"]
    assert not any(e["event"] == "auto_pause_announced" for e in srv.journal())
    # paused: the monitor does not fire again
    clock.advance(3600)
    assert (await srv.monitor.tick()).kind == "none"
    # resume as usual: the variable comes back from the checkpoint
    await srv.api("POST", "resume")
    await srv.lifecycle.wait()
    st = await srv.api("GET", "status")
    assert st["state"] == "ready" and st["outcome"] == "restored"
    # and the idle clock restarted at the resume (no immediate re-pause)
    assert (await srv.monitor.tick()).kind == "none"


async def test_busy_kernel_is_never_auto_paused(srv):
    kid = await srv.open_notebook()
    clock = srv.fake_clock()
    await srv.run(kid, "import time; time.sleep(4)", wait=False)
    for _ in range(50):
        if srv.serverapp.kernel_manager.get_kernel(kid).execution_state == "busy":
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the server never saw the kernel busy within 5 s")
    clock.advance(10 * 3600)
    d = await srv.monitor.tick()
    assert d.kind == "none" and d.reason.startswith("kernel busy")
    assert srv.lifecycle.flight is None and srv.lifecycle.state["state"] == "running"


async def test_pause_never_opts_out(srv):
    kid = await srv.open_notebook()
    await srv.run(kid, "%load_ext jupyter_pause\n%pause --never")
    clock = srv.fake_clock()
    clock.advance(3600)
    d = await srv.monitor.tick()
    assert d.kind == "none" and "--never" in d.reason
    p = await srv.api("GET", "policy")
    assert any("--never" in b for b in p["idle"]["blockers"])
    assert srv.lifecycle.state["state"] == "running"
    await srv.run(kid, "%pause --allow")
    clock.advance(3600)
    assert (await srv.monitor.tick()).kind == "fire"
    await srv.lifecycle.wait()


async def test_connected_client_gets_a_grace_period_it_can_cancel(srv, jp_ws_fetch):
    kid = await srv.open_notebook()
    ws = await jp_ws_fetch("api", "kernels", kid, "channels")
    try:
        clock = srv.fake_clock()
        clock.advance(61)
        d = await srv.monitor.tick()
        assert d.kind == "announce"
        p = await srv.api("GET", "policy")
        assert p["state"] == "announced" and p["cancellable"] and p["seconds_left"] == 30.0
        assert p["connections"] == 1
        # the person comes back and runs a cell: that cancels it
        await srv.run(kid, "x = 1")
        clock.now = time.time()  # "now" is just after that cell (kernel times are real)
        d = await srv.monitor.tick()
        assert d.kind == "cancel" and d.reason.startswith("active")
        # announced again an idle period later; the person cancels from the UI
        clock.advance(61)
        assert (await srv.monitor.tick()).kind == "announce"
        p = await srv.api("POST", "policy/cancel")
        assert p["state"] == "watching" and not p["cancellable"]
        with pytest.raises(tornado.httpclient.HTTPClientError) as e:
            await srv.api("POST", "policy/cancel")
        assert e.value.code == 409
        clock.advance(31)
        assert (await srv.monitor.tick()).kind == "none"  # the old deadline is gone
        # idle for another full period: announced, nobody reacts, it fires at the deadline
        clock.advance(30)
        assert (await srv.monitor.tick()).kind == "announce"
        clock.advance(29)
        assert (await srv.monitor.tick()).kind == "none"
        clock.advance(1)
        assert (await srv.monitor.tick()).kind == "fire"
        await srv.lifecycle.wait()
    finally:
        ws.close()
    def auto_pause_events():
        return [(e["event"], e.get("by")) for e in srv.journal()
                if e["event"].startswith("auto_pause")]

    # the cancellations' journal writes run in tasks of their own
    await until(lambda: len(auto_pause_events()) >= 5, 30, "five auto-pause journal lines")
    assert auto_pause_events() == [("auto_pause_announced", None), ("auto_pause_cancelled", "activity"),
                      ("auto_pause_announced", None), ("auto_pause_cancelled", "user"),
                      ("auto_pause_announced", None)]
    assert srv.lifecycle.state["state"] == "paused"
    assert [e["trigger"] for e in srv.journal() if e["event"] == "pause_requested"] == ["idle"]


async def _status_last_activity(jp_fetch):
    # parsed: isoformat() leaves out a zero fraction, so "...:05Z" sorts after "...:05.3Z"
    r = await jp_fetch("api", "status")
    return datetime.fromisoformat(json.loads(r.body)["last_activity"].replace("Z", "+00:00"))


async def _activity_after(jp_fetch, before):
    """The server's last_activity once it is later than ``before`` (it reads IOPub on a socket
    of its own, after the client has its reply)."""
    async def later():
        now = await _status_last_activity(jp_fetch)
        return now if now > before else None

    return await until(later, 30, f"last_activity later than {before}")


async def test_our_kernel_calls_are_not_user_activity(srv, jp_fetch):
    kid = await srv.open_notebook()  # returns once the server has read the cell's last message
    before = await _status_last_activity(jp_fetch)
    async with not_activity(srv.serverapp, kid):
        res = await kbridge.call(srv.serverapp, kid, "liveness", timeout=30)
    assert res["ok"]
    await srv.barrier(kid)  # the server has read our call's messages: none of them counted
    assert await _status_last_activity(jp_fetch) == before
    # reading our policy and report endpoints is not activity either
    await srv.api("GET", "policy")
    await srv.api("GET", "report")
    assert await _status_last_activity(jp_fetch) == before
    # kbridge.call guards itself: the server's own bridge calls never count either
    await kbridge.call(srv.serverapp, kid, "liveness", timeout=30)
    await srv.barrier(kid)
    assert await _status_last_activity(jp_fetch) == before
    # the same call from a client that is not ours counts (what Kubeflow's probe would see,
    # were our calls not told apart)
    kc = person_client(srv.serverapp, kid)
    kc.start_channels(hb=False)
    try:
        assert (await call_bridge(kc, "liveness", timeout=30))["pid"]
    finally:
        kc.stop_channels()
    assert await _activity_after(jp_fetch, before) > before


async def test_our_calls_stay_uncounted_however_late_the_server_reads_iopub(srv, jp_fetch):
    """jupyter_server reads IOPub on a socket of its own, in its own turn of the event loop:
    under load it reads our call's messages after the call has returned. They must not count,
    and the person's must, however late."""
    kid = await srv.open_notebook()
    km = srv.serverapp.kernel_manager
    kernel = km.get_kernel(kid)
    await kbridge.call(srv.serverapp, kid, "liveness", timeout=30)
    stream = kernel._activity_stream
    read = stream._recv_callback  # the server's own reading (and whatever wraps it)
    loop = asyncio.get_running_loop()
    pending, done = [], []

    def late(msg_list):
        pending.append(msg_list)

        def now():
            pending.remove(msg_list)
            read(msg_list)
            done.append(msg_list)

        loop.call_later(0.5, now)

    stream.on_recv(late)
    try:
        before = await _status_last_activity(jp_fetch)
        await kbridge.call(srv.serverapp, kid, "liveness", timeout=30)
        # busy then idle (and our subscription's welcome), all read half a second late
        await until(lambda: len(done) >= 2 and not pending
                    and kernel.execution_state == "idle", 30, "the late reads")
        assert await _status_last_activity(jp_fetch) == before
        await srv.run(kid, "z = 3")
        assert await _activity_after(jp_fetch, before) > before
    finally:
        stream.on_recv(read)


async def test_a_persons_thread_output_after_our_call_still_counts(srv, jp_fetch):
    """ipykernel gives output from a thread the person started the parent of the latest
    request, which after a bridge call is ours: once our call has ended, that output is the
    person's work going on and must keep the kernel active (an idle rule must not pause it)."""
    kid = await srv.open_notebook()
    marker = "thread-printing"
    await srv.run(kid, "import threading, time\n"
                       "stop_printing = threading.Event()\n"
                       "def _printer():\n"
                       "    while not stop_printing.wait(0.2):\n"
                       f"        print({marker!r}, flush=True)\n"
                       "threading.Thread(target=_printer, daemon=True).start()")
    try:
        # not srv.barrier: a person's request would become the threads' parent instead of ours
        seen = srv.watch_activity(kid)
        seen_before = set(seen)
        await kbridge.call(srv.serverapp, kid, "liveness", timeout=30)
        await until(lambda: any(m.startswith(OWN_SESSION_PREFIX) for m in seen - seen_before),
                    30, "the server reading our call's trailing idle")
        after_call = await _status_last_activity(jp_fetch)
        assert await _activity_after(jp_fetch, after_call) > after_call
    finally:
        await srv.run(kid, "stop_printing.set()")


async def test_activity_watch_has_a_session_of_its_own(srv, monkeypatch):
    """not_activity's IOPub client (where jupyter_server's activity watch cannot be wrapped)
    must not share the manager's session id (ZMQ identity)."""
    monkeypatch.setattr(activity, "keep_own_out", lambda km, kernel: False)
    kid = await srv.open_notebook()
    kernel = srv.serverapp.kernel_manager.get_kernel(kid)
    made = []
    real = type(kernel).client

    def spy(self, **kwargs):
        c = real(self, **kwargs)
        made.append(c)
        return c

    monkeypatch.setattr(type(kernel), "client", spy)
    async with not_activity(srv.serverapp, kid):
        await asyncio.sleep(0)
    (c,) = made
    assert c.session.session != kernel.session.session
    assert c.session.key == kernel.session.key  # still signs messages the kernel accepts


async def test_a_person_running_a_cell_meanwhile_still_counts(srv, jp_fetch):
    kid = await srv.open_notebook()
    before = await _status_last_activity(jp_fetch)
    async with not_activity(srv.serverapp, kid):
        await srv.run(kid, "y = 2")
    assert await _status_last_activity(jp_fetch) > before


async def test_report_endpoint_reads_the_servers_journal(srv):
    kid = await srv.open_notebook()
    await srv.run(kid, "z = 3")
    await srv.api("POST", "pause", {"trigger": "manual"})
    await srv.lifecycle.wait()
    await srv.api("POST", "resume")
    await srv.lifecycle.wait()
    data = await srv.api("GET", "report", params={"period": "all", "whatif": "1",
                                                  "thresholds": "1m,1h"})
    t = data["report"]["totals"]
    assert t["pauses"]["completed"] == 1 and t["resumes"]["restored"] == 1
    assert t["time_to_pause_s"]["n"] == 1 and t["time_to_resume_s"]["n"] == 1
    assert t["sizes"]["checkpoints"] == 1 and t["sizes"]["checkpoint_bytes_written"] > 0
    assert [r["threshold_s"] for r in data["whatif"]["thresholds"]] == [60, 3600]
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await srv.api("GET", "report", params={"period": "month"})
    assert e.value.code == 400


async def test_gc_in_the_server_never_deletes_the_way_back(srv):
    from jupyter_pause.policy.gc import run_gc_for_app

    kid = await srv.open_notebook()
    await srv.run(kid, "precious = list(range(5))")
    await srv.api("POST", "pause", {"trigger": "manual"})
    await srv.lifecycle.wait()
    app = srv.settings["jupyter_pause"]
    res = await run_gc_for_app(app, keep=0, older_than=0.0, dry_run=False)
    assert res["checkpoints"]["deleted"] == [] and len(res["protected"]) == 1
    assert res["backend"]["name"] == "local"
    await srv.api("POST", "resume")
    await srv.lifecycle.wait()
    st = await srv.api("GET", "status")
    assert st["state"] == "ready" and st["outcome"] == "restored"
    # once resumed, the same policy may delete it
    res = await run_gc_for_app(app, keep=0, older_than=0.0, dry_run=False)
    assert len(res["checkpoints"]["deleted"]) == 1 and res["remaining"]["bytes"] == 0


TRAINING = {"enabled": False, "profile": "training",
            "autosave": {"training": {"keep": 5}}}


@pytest.mark.parametrize("policy_config", [TRAINING], ids=["training"])
async def test_the_policy_plugin_is_found_by_entry_point_and_sets_autosave(srv):
    """The server never imports the policy tools: the entry point names them, and their
    autosave defaults (the profile's, then IdlePolicy.autosave) reach the kernels."""
    app = srv.lifecycle.app
    assert app.extension_modules == ["jupyter_pause.policy.handlers"]
    app.autosave = {"idle_delay": 1.0}  # the harness turns autosave off; PauseApp's keys win
    settings = app.autosave_settings()
    assert settings["idle_delay"] == 1.0, settings
    assert settings["every_s"] == 300.0 and settings["keep"] == 5, settings
    p = await srv.api("GET", "policy")
    assert p["profile"]["name"] == "training", p
