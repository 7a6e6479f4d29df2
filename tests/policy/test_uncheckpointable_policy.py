"""An idle workspace with a kernel that cannot be checkpointed (the echo wrapper kernel, beside a
Python notebook): nobody is there to say "pause anyway", so the profile's ``uncheckpointable``
rule decides, and GET policy says what it decided. Real server and kernels, fake clock."""

from __future__ import annotations

import json

import pytest

from tests.server.echo_kernel import ECHO, install_kernelspecs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def kernelspecs(jp_kernel_dir):
    install_kernelspecs(jp_kernel_dir)


async def open_echo(srv, path="notes.ipynb"):
    r = await srv.fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": path, "name": path, "type": "notebook", "kernel": {"name": ECHO}}))
    kid = json.loads(r.body)["kernel"]["id"]
    await srv.run(kid, "hello")
    return kid


async def test_the_default_skips_an_auto_pause_that_would_lose_a_kernels_state(srv):
    py = await srv.open_notebook("model.ipynb")
    await srv.run(py, "weights = [1.5, 2.5]")
    echo = await open_echo(srv)
    clock = srv.fake_clock()
    clock.advance(61)
    d = await srv.monitor.tick()
    assert d.kind == "none" and "would lose the state of notes.ipynb" in d.reason, d
    assert "uncheckpointable: skip" in d.reason
    p = await srv.api("GET", "policy")
    assert p["profile"]["uncheckpointable"] == "skip"
    assert [k["kernel_id"] for k in p["uncheckpointable"]] == [echo], p
    assert p["idle"]["idle"] is False and any("notes.ipynb" in b for b in p["idle"]["blockers"])
    # Still so an hour later: nothing was paused, both kernels run on.
    clock.advance(3600)
    assert (await srv.monitor.tick()).kind == "none"
    assert (await srv.api("GET", "status"))["state"] == "running"
    assert not any(e["event"] == "pause_requested" for e in srv.journal())
    assert sorted(srv.serverapp.kernel_manager.list_kernel_ids()) == sorted([py, echo])


PAUSE_ANYWAY = {"enabled": True, "profile": "gpu-experiment", "interval": 3600.0,
                "profiles": {"gpu-experiment": {"idle_after": 60.0, "grace_period": 30.0,
                                                "uncheckpointable": "pause_anyway"}}}


@pytest.mark.parametrize("policy_config", [PAUSE_ANYWAY], ids=["pause_anyway"])
async def test_pause_anyway_auto_pauses_and_names_the_lost_kernel(srv):
    assert (await srv.api("GET", "policy"))["profile"]["uncheckpointable"] == "pause_anyway"
    py = await srv.open_notebook("model.ipynb")
    await srv.run(py, "weights = [1.5, 2.5]")
    echo = await open_echo(srv)
    clock = srv.fake_clock()
    clock.advance(61)
    d = await srv.monitor.tick()
    assert d.kind == "fire", d.reason
    await srv.lifecycle.wait()
    st = await srv.api("GET", "status")
    assert st["state"] == "paused", st
    [written] = [e for e in srv.journal() if e["event"] == "checkpoint_written"]
    assert [k["kernel_id"] for k in written["state_not_saved"]] == [echo]
    await srv.api("POST", "resume")
    await srv.lifecycle.wait()
    report = {k["path"]: k for k in (await srv.api("GET", "status"))["last_report"]["kernels"]}
    assert report["model.ipynb"]["outcome"] == "restored"
    assert report["notes.ipynb"]["outcome"] == "fresh"
    assert report["notes.ipynb"]["state_not_saved"]

