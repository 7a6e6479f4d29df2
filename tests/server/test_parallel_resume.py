"""A resume of several notebooks starts their kernels together, through the server's own session
and kernel managers (so the pause guard still sees every start), and restores them all."""

from __future__ import annotations

import asyncio
import json
import os
import time

from jupyter_pause.cluster import local
from tests.harness import until


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_kernel_discarded_while_its_restarter_restarts_it_is_gone_whole(jp_serverapp):
    """A kernel that died at start is restarted by jupyter_client's restarter
    (AsyncIOLoopKernelRestarter.poll awaits ``restart_kernel(now=True)``) while the resume gives
    up on it. A shutdown in the middle of that restart raised InvalidStateError in
    MultiKernelManager._async_shutdown_kernel (``ready.exception()`` of a pending future): the
    kernel stayed in the map, its restarted process ran on, and at server stop its second
    shutdown could hang. Here the restart is the restarter's own call, made at the worst time."""
    km = jp_serverapp.kernel_manager
    kid = await km.start_kernel(kernel_name="python3")
    kernel = km.get_kernel(kid)
    await kernel.ready
    first = kernel.provisioner.pid
    restart = asyncio.ensure_future(kernel.restart_kernel(now=True, newports=True))
    await asyncio.sleep(0)  # the restart is in flight: its shutdown has begun
    assert not kernel.ready.done()

    await local._discard(km, kid, 60)
    await asyncio.wait_for(restart, 60)
    assert kid not in km
    second = kernel.provisioner.pid if kernel.provisioner else None
    assert second is not None and second != first  # the restart launched one; the discard ended it
    await until(lambda: not _alive(first) and (second is None or not _alive(second)), 30,
                what="both processes of the discarded kernel ended")
