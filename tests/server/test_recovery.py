"""A server that died mid-flight comes back to a consistent state from its journal.

The files are what a crashed server leaves: the journal is durable up to the last event it
wrote and state.json may lag behind it. The Lifecycle is then rebuilt from those files, as a
restarted server does at start (a real SIGKILL of a server process is in test_cli.py).
"""

from __future__ import annotations

import json

import pytest

from jupyter_pause.journal import utcnow_iso
from jupyter_pause.server.lifecycle import Lifecycle

pytestmark = pytest.mark.timeout(180)


def crash(ws, keep_events, extra=()):
    """Cut the journal after the first ``keep_events`` lines, append ``extra`` events, and leave
    state.json one event behind (the crash came between the two writes)."""
    lc = ws.lifecycle
    lines = lc.journal.journal_path.read_text().splitlines()[:keep_events]
    seq = json.loads(lines[-1])["seq"]
    flight = json.loads(lines[-1])["flight"]
    for i, (event, kind) in enumerate(extra, start=1):
        lines.append(json.dumps({"seq": seq + i, "at": utcnow_iso(), "flight": flight,
                                 "kind": kind, "event": event, "trigger": "manual"}))
    lc.journal.journal_path.write_text("\n".join(lines) + "\n")
    lc.journal.state_path.unlink()  # the strictest case: rebuilt from the journal alone


async def restart(ws):
    app = ws.lifecycle.app
    await ws.lifecycle.stop()
    lc = Lifecycle(app)
    lc.load()
    app.lifecycle = lc
    ws.serverapp.web_app.settings["jupyter_pause_lifecycle"] = lc
    ws.lifecycle = lc
    await lc.start()
    return lc


def events(ws):
    return [e["event"] for e in ws.journal()]


async def test_crash_mid_checkpoint_goes_back_to_running(ws, pause_dirs):
    nb = await ws.open_notebook("a.ipynb")
    await ws.run(nb["kernel"]["id"], "a = 1")
    _, st = await ws.flight("pause")
    first = st["last_checkpoint"]["id"]
    _, st = await ws.flight("resume")
    assert st["state"] == "ready"
    # The next pause crashed right after it was requested (mid-checkpoint).
    crash(ws, len(ws.journal()), extra=[("pause_requested", "pause")])
    await restart(ws)
    st = await ws.status()
    assert st["state"] == "running", st
    assert "server stopped during checkpointing" in st["reason"]
    assert st["hint"] and "previous checkpoint" in st["hint"]
    assert events(ws)[-2:] == ["pause_requested", "failed"]
    assert ws.journal()[-1]["reason"] == "interrupted"
    assert st["last_checkpoint"]["id"] == first  # the previous checkpoint is still the last
    manifests = [p.name for p in pause_dirs["store"].rglob("*") if first in p.name]
    assert manifests, "the previous checkpoint must still be in the store"
    # And the workspace works again.
    _, st = await ws.flight("pause")
    assert st["state"] == "paused"


@pytest.mark.parametrize("last_event", ["checkpoint_written", "snapshot_ready"])
async def test_crash_after_the_checkpoint_counts_as_paused(ws, jp_serverapp, last_event):
    nb = await ws.open_notebook("b.ipynb")
    await ws.run(nb["kernel"]["id"], "b = [1, 2]; c = {'b': b}")
    _, st = await ws.flight("pause")
    names = events(ws)
    crash(ws, names.index(last_event) + 1)  # died while snapshotting / releasing
    await restart(ws)
    st = await ws.status()
    assert st["state"] == "paused", st
    assert ws.journal()[-1]["event"] == "paused" and ws.journal()[-1]["recovered"] is True
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    kid = st["last_report"]["kernels"][0]["kernel_id"]
    assert (await ws.run(kid, "print(c['b'] is b, b)")).strip() == "True [1, 2]"


async def test_crash_mid_resume_can_resume_again(ws):
    nb = await ws.open_notebook("c.ipynb")
    await ws.run(nb["kernel"]["id"], "q = 'value'")
    await ws.flight("pause")
    crash(ws, len(ws.journal()), extra=[("resume_requested", "resume")])
    await restart(ws)  # local backend: no resume by itself at start
    st = await ws.status()
    assert st["state"] == "paused" and "server stopped during resuming" in st["reason"], st
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored"
    assert events(ws).count("restored") == 1


@pytest.mark.parametrize("pause_config", [{"PauseApp": {"resume_on_start": True},
                                           "LocalBackend": {}}])
async def test_paused_at_start_resumes_when_configured(ws):
    nb = await ws.open_notebook("d.ipynb")
    await ws.run(nb["kernel"]["id"], "d = 4")
    await ws.flight("pause")
    await restart(ws)  # starts the resume by itself (trigger "startup")
    assert ws.lifecycle.flight is not None and ws.lifecycle.flight.trigger == "startup"
    await ws.lifecycle.wait()
    st = await ws.status()
    assert st["state"] == "ready" and st["outcome"] == "restored"
    assert st["last_report"]["trigger"] == "startup"
