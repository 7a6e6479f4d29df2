"""POST recompute updates the server's last report: journaled, persisted, announced."""

from __future__ import annotations

import asyncio
import json

import pytest

from jupyter_pause.server.events import SCHEMA_ID
from jupyter_pause.server.lifecycle import Lifecycle

pytestmark = pytest.mark.timeout(180)


def _vars(st, path="gen.ipynb"):
    (k,) = [k for k in st["last_report"]["kernels"] if k["path"] == path]
    return {v["name"]: v for v in k["variables"]}


async def test_recompute_marks_variables_in_last_report(ws, jp_serverapp):
    nb = await ws.open_notebook("gen.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "x = 3")
    await ws.run(kid, "gen = (i * x for i in range(3))")

    _, st = await ws.flight("pause")
    assert st["state"] == "paused", st
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    before = _vars(st)
    assert before["gen"]["status"] == "skipped" and before["gen"]["recomputable"], before
    new_kid = st["last_report"]["kernels"][0]["kernel_id"]

    events: list[dict] = []

    async def listen(logger, schema_id, data):
        events.append(data)

    jp_serverapp.event_logger.add_listener(schema_id=SCHEMA_ID, listener=listen)
    r = await ws.api("POST", "recompute", {"path": "gen.ipynb", "names": ["gen", "nothere"]})
    rows = {v["name"]: v for v in r["variables"]}
    assert rows["gen"]["status"] == "recomputed", rows
    assert rows["nothere"]["status"] == "failed", rows

    st = await ws.status()
    after = _vars(st)
    assert after["gen"]["status"] == "recomputed" and after["gen"]["recomputable"] is False
    assert after["gen"]["reason"].startswith("re-ran cell")
    assert after["x"]["status"] == "restored"  # the others are as they were
    assert after["nothere"]["status"] == "failed" and after["nothere"]["reason"]
    assert after["nothere"]["recomputable"] is False
    assert (await ws.run(new_kid, "print(list(gen))")).strip() == "[0, 3, 6]"

    # Journaled (one line, flight-less) and in state.json.
    (entry,) = [e for e in ws.journal() if e["event"] == "recomputed"]
    assert entry["path"] == "gen.ipynb" and entry["flight"] is None
    saved = json.loads(ws.lifecycle.journal.state_path.read_text())
    assert _vars(saved)["gen"]["status"] == "recomputed"
    # The UI hears about it (it re-reads status on each lifecycle event).
    for _ in range(50):
        if any(e["event"] == "recomputed" for e in events):
            break
        await asyncio.sleep(0.05)
    assert any(e["event"] == "recomputed" and e["state"] == "ready" for e in events), events

    # Rebuilt from the journal alone (a server restart after a crash) it is the same.
    app = ws.lifecycle.app
    ws.lifecycle.journal.state_path.unlink()
    lc = Lifecycle(app)
    lc.load()
    assert _vars(lc.state)["gen"]["status"] == "recomputed"
    await lc.stop()
