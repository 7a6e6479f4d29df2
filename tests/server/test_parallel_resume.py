"""A resume of several notebooks starts their kernels together, through the server's own session
and kernel managers (so the pause guard still sees every start), and restores them all."""

from __future__ import annotations

import json
import time

from jupyter_pause.cluster import local


async def test_resume_starts_all_kernels_before_the_first_answers(ws, jp_serverapp, monkeypatch):
    paths = [f"par-{i}.ipynb" for i in range(3)]
    for i, path in enumerate(paths):
        nb = await ws.open_notebook(path)
        await ws.run(nb["kernel"]["id"], f"v = {i}; name = {path!r}")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused", st

    # when each start was asked of the server's session manager, and when each kernel answered
    sm = jp_serverapp.session_manager
    starts: list[float] = []
    answered: list[float] = []
    real_start, real_answers = sm.start_kernel_for_session, local._answers

    async def start_kernel_for_session(*a, **kw):
        starts.append(time.monotonic())
        return await real_start(*a, **kw)  # the guard's mixin runs in here

    async def answers(*a, **kw):
        why = await real_answers(*a, **kw)
        answered.append(time.monotonic())
        return why

    monkeypatch.setattr(sm, "start_kernel_for_session", start_kernel_for_session)
    monkeypatch.setattr(local, "_answers", answers)
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    assert len(starts) == 3 and len(answered) == 3, (starts, answered)
    # one after another, each start would come after the previous kernel answered
    assert max(starts) < min(answered), (starts, answered)

    sessions = json.loads((await ws.fetch("api", "sessions")).body)
    kernels = {s["path"]: s["kernel"]["id"] for s in sessions}
    assert sorted(kernels) == paths
    assert len(set(kernels.values())) == 3
    for i, path in enumerate(paths):
        assert (await ws.run(kernels[path], "print(v, name)")).strip() == f"{i} {path}"
