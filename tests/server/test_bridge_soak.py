"""The bridge never loses a reply: many calls, each on a fresh client, some on a loaded machine;
a client that hears nothing on IOPub still gets its answer; an unanswered liveness call is
retried on a new connection, and a state-changing call never is."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
import zmq

from jupyter_pause.server import bridge

pytestmark = pytest.mark.timeout(300)

IDLE_CALLS = 250
LOADED_CALLS = 250
CALL_TIMEOUT = 30  # generous: a failure here means a lost reply, not a slow machine


async def _kernel_pid(ws, kid: str) -> int:
    return int((await ws.run(kid, "import os; print(os.getpid())")).strip())


def _burn(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


async def _calls(ws, kid: str, pid: int, n: int, failures: list[str]) -> None:
    for i in range(n):
        try:
            res = await bridge.call(ws.serverapp, kid, "liveness", timeout=CALL_TIMEOUT)
        except bridge.BridgeError as e:
            failures.append(f"call {i}: {e}")
            continue
        if not (res.get("ok") is True and res.get("pid") == pid):
            failures.append(f"call {i}: wrong result {res}")


async def test_500_bridge_calls_on_fresh_clients_lose_no_reply(ws):
    nb = await ws.open_notebook("soak.ipynb")
    kid = nb["kernel"]["id"]
    pid = await _kernel_pid(ws, kid)
    failures: list[str] = []
    started = time.monotonic()
    await _calls(ws, kid, pid, IDLE_CALLS, failures)
    burners = _burn(2)  # both cores busy with other processes
    try:
        await _calls(ws, kid, pid, LOADED_CALLS, failures)
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.wait()
    print(f"{IDLE_CALLS + LOADED_CALLS} bridge calls in {time.monotonic() - started:.1f} s")
    assert failures == [], failures[:5]


async def test_a_client_that_hears_nothing_on_iopub_still_gets_its_reply(ws):
    """The old failure: a fresh SUB socket whose subscription has not reached the kernel misses
    the request's ``status: idle``; ``execute_interactive`` then waited out its whole timeout
    although the reply was on the shell channel. Here IOPub hears nothing at all."""
    nb = await ws.open_notebook("deaf.ipynb")
    kid = nb["kernel"]["id"]
    pid = await _kernel_pid(ws, kid)
    kc = bridge.own_client(ws.serverapp, kid)
    kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
    try:
        kc.iopub_channel.socket.setsockopt(zmq.UNSUBSCRIBE, b"")  # deaf from now on
        for _ in range(3):
            res = await bridge.run_bridge(kc, "liveness", timeout=CALL_TIMEOUT)
            assert "timeout" not in res, res
            assert res["ok"] is True and res["pid"] == pid, res
    finally:
        kc.stop_channels()


async def test_an_unanswered_liveness_call_is_retried_on_a_new_connection(ws, monkeypatch):
    nb = await ws.open_notebook("retry.ipynb")
    kid = nb["kernel"]["id"]
    pid = await _kernel_pid(ws, kid)
    real = bridge.own_client
    made = []

    def first_one_unheard(serverapp, kernel_id):
        kc = real(serverapp, kernel_id)
        if not made:
            kc.session.key = b"not-the-kernel-key"  # the kernel drops what this one signs
        made.append(kc)
        return kc

    monkeypatch.setattr(bridge, "own_client", first_one_unheard)
    res = await bridge.call(ws.serverapp, kid, "liveness", timeout=3, retries=1)
    assert res["ok"] is True and res["pid"] == pid, res
    assert len(made) == 2 and made[0].session.session != made[1].session.session

    def never_heard(serverapp, kernel_id):
        kc = real(serverapp, kernel_id)
        kc.session.key = b"not-the-kernel-key"
        made.append(kc)
        return kc

    made.clear()
    monkeypatch.setattr(bridge, "own_client", never_heard)
    with pytest.raises(bridge.BridgeError, match="2 attempts"):
        await bridge.call(ws.serverapp, kid, "liveness", timeout=2, retries=1)
    assert len(made) == 2


async def test_state_changing_calls_are_never_retried(ws):
    nb = await ws.open_notebook("once.ipynb")
    for func in ("checkpoint", "restore", "recompute"):
        with pytest.raises(ValueError, match="never retried"):
            await bridge.call(ws.serverapp, nb["kernel"]["id"], func, timeout=5, retries=1)


@pytest.mark.parametrize("how", ["shutdown", "sigkill"])
async def test_a_call_to_a_kernel_that_goes_away_ends_at_once(ws, how, monkeypatch):
    """Not at its timeout: a stopped kernel, or one jupyter_server restarted (memory gone)."""
    nb = await ws.open_notebook(f"gone-{how}.ipynb")
    kid = nb["kernel"]["id"]
    pid = await _kernel_pid(ws, kid)
    km = ws.serverapp.kernel_manager
    busy = await ws.start_cell(kid, "import time; time.sleep(600)")
    try:
        sent = asyncio.Event()
        real = bridge.own_client

        def spied(serverapp, kernel_id):
            return _tell_when_sent(real(serverapp, kernel_id), sent)

        monkeypatch.setattr(bridge, "own_client", spied)
        call = asyncio.ensure_future(bridge.call(ws.serverapp, kid, "liveness", timeout=600))
        await asyncio.wait_for(sent.wait(), 30)  # sent; it queues behind the running cell
        assert not call.done()
        if how == "shutdown":
            await km.shutdown_kernel(kid, now=True)
        else:
            os.kill(pid, signal.SIGKILL)  # jupyter_server restarts it: the memory is gone
        with pytest.raises(bridge.BridgeError, match="stopped|restarted"):
            await asyncio.wait_for(call, 60)
    finally:
        busy.cancel()


def _tell_when_sent(kc, sent: asyncio.Event):
    """The client, made to set ``sent`` once its execute request is on the wire."""
    execute = kc.execute

    def execute_and_tell(*args, **kwargs):
        msg_id = execute(*args, **kwargs)
        sent.set()
        return msg_id

    kc.execute = execute_and_tell
    return kc


async def test_a_liveness_call_across_a_kernel_restart_gets_the_new_process_answer(
        ws, monkeypatch):
    """A retried read-only call asks the restarted process (the restore decision needs it)."""
    nb = await ws.open_notebook("reborn.ipynb")
    kid = nb["kernel"]["id"]
    pid = await _kernel_pid(ws, kid)
    # the old process runs the cell before the kill: a request still on its way would reach
    # the restarted process on the same ports, and the call asked again would queue behind it
    busy = await ws.start_cell(kid, "import time; time.sleep(600)")
    sent = asyncio.Event()
    real = bridge.run_bridge

    async def spied(kc, func, **kwargs):
        return await real(_tell_when_sent(kc, sent), func, **kwargs)

    monkeypatch.setattr(bridge, "run_bridge", spied)
    try:
        call = asyncio.ensure_future(
            bridge.call(ws.serverapp, kid, "liveness", timeout=600, retries=1))
        await asyncio.wait_for(sent.wait(), 30)
        os.kill(pid, signal.SIGKILL)  # jupyter_server restarts it under the same kernel id
        res = await asyncio.wait_for(call, 120)
    finally:
        busy.cancel()
    assert res["ok"] is True and res["pid"] != pid and res["token"] is None, res


async def test_a_resume_whose_first_liveness_reply_is_lost_still_restores(ws, monkeypatch):
    """The liveness call is retried on a new connection before anything is declared failed."""
    nb = await ws.open_notebook("lost.ipynb")
    await ws.run(nb["kernel"]["id"], "w = 5")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused", st
    monkeypatch.setattr(ws.lifecycle.app, "liveness_timeout", 3.0)
    real = bridge.own_client
    made = []

    def first_one_unheard(serverapp, kernel_id):
        kc = real(serverapp, kernel_id)
        if not made:  # the resume's first bridge client is its liveness call
            kc.session.key = b"not-the-kernel-key"
        made.append(kc)
        return kc

    monkeypatch.setattr(bridge, "own_client", first_one_unheard)
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    assert len(made) >= 3  # liveness unheard, liveness again, restore
    kid = st["last_report"]["kernels"][0]["kernel_id"]
    assert (await ws.run(kid, "print(w)")).strip() == "5"


async def test_a_kernel_that_dies_at_start_up_is_asked_again_once_restarted(ws, monkeypatch):
    """A kernel started for a resume can die binding a port another process took meanwhile
    (ports are chosen before the kernel binds them). jupyter_server restarts it on new ports;
    the liveness call sent to the old ports can never be answered, so it is asked again."""
    import socket

    from jupyter_client.connect import LocalPortCache
    from traitlets.utils.importstring import import_item

    nb = await ws.open_notebook("taken.ipynb")
    await ws.run(nb["kernel"]["id"], "t = 11")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused", st
    monkeypatch.setattr(ws.lifecycle.app, "liveness_timeout", 30.0)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = LocalPortCache.find_available_port
    handed = []

    def first_port_taken(self, ip):
        if not handed:
            handed.append(taken.getsockname()[1])
            return handed[0]
        return real(self, ip)

    # The port is free again by the restart (a passing collision, e.g. another process's
    # outgoing connection): jupyter_server restarts the kernel on the same ports.
    kernel_class = import_item(ws.serverapp.kernel_manager.kernel_manager_class)
    real_restart = kernel_class.restart_kernel
    restarts = []

    async def restart_once_free(self, *args, **kwargs):
        taken.close()
        restarts.append(self.kernel_id)
        return await real_restart(self, *args, **kwargs)

    monkeypatch.setattr(LocalPortCache, "find_available_port", first_port_taken)
    monkeypatch.setattr(kernel_class, "restart_kernel", restart_once_free)
    try:
        _, st = await ws.flight("resume")
    finally:
        taken.close()
    assert handed and restarts, "the kernel did not die at start-up"
    # The whole reason on failure (pytest cuts a long dict short): reason, hint, per kernel.
    why = (st.get("reason"), st.get("hint"),
           [(k.get("outcome"), k.get("reason")) for k in
            (st.get("last_report") or {}).get("kernels") or []])
    assert st["state"] == "ready" and st["outcome"] == "restored", why
    kid = st["last_report"]["kernels"][0]["kernel_id"]
    assert (await ws.run(kid, "print(t)")).strip() == "11"
