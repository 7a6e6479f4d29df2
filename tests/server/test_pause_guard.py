"""What a pause means to the rest of the server: no kernel starts
while paused, pausing or resuming except the resume's own; a kernel no paused session owned is
never restored into; a notebook renamed while paused comes back at its new path.

Real in-process servers and kernels; every wait is a condition with a deadline.
"""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_pause.cluster.base import BackendError
from jupyter_pause.server import kernelguard
from jupyter_pause.server.state import apply, default_state
from tests.harness import SLOW_PICKLE, until

pytestmark = pytest.mark.timeout(180)

KEEP = [{"PauseApp": {}, "LocalBackend": {"stop_kernels": False}}]


async def refused(ws, *parts, method="POST", body="{}", headers=None):
    """The 409 answer of a request that must be refused: its JSON body."""
    with pytest.raises(HTTPClientError) as e:
        await ws.fetch(*parts, method=method, body=body, headers=headers)
    assert e.value.code == 409, (parts, e.value.code, e.value.response.body)
    return json.loads(e.value.response.body)


def session_body(path):
    return json.dumps({"path": path, "name": path, "type": "notebook",
                       "kernel": {"name": "python3"}})


async def sessions(ws):
    return json.loads((await ws.fetch("api", "sessions")).body)


async def test_no_kernel_starts_while_paused_but_the_resumes_own(ws, jp_serverapp):
    nb = await ws.open_notebook("guarded.ipynb")
    await ws.run(nb["kernel"]["id"], "x = 7")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused"
    km = jp_serverapp.kernel_manager

    # Reopening the paused notebook, opening another one, a bare kernel: all refused, with
    # jupyter_server's JSON error shape and nothing started.
    for path in ("guarded.ipynb", "other.ipynb"):
        body = await refused(ws, "api", "sessions", body=session_body(path))
        assert body["message"] == "the workspace is paused; resume it first", body
    body = await refused(ws, "api", "kernels", body=json.dumps({"name": "python3"}))
    assert body["message"] == kernelguard.PAUSED
    assert list(km.list_kernel_ids()) == [] and await sessions(ws) == []
    # Any other caller of the kernel manager is refused too.
    with pytest.raises(kernelguard.KernelStartRefused):
        await km.start_kernel(kernel_name="python3")
    # Still authenticated first: a caller without the token learns nothing of the pause.
    with pytest.raises(HTTPClientError) as e:
        await ws.fetch("api", "sessions", method="POST", body=session_body("x.ipynb"),
                       headers={"Authorization": "token not-the-token"})
    assert e.value.code == 403

    # The resume's own start is allowed, and restores; afterwards kernels start again.
    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    (k,) = st["last_report"]["kernels"]
    assert st["last_report"]["other_kernels"] == []
    assert (await ws.run(k["kernel_id"], "print(x)")).strip() == "7"
    other = await ws.open_notebook("other.ipynb")
    assert other["kernel"]["id"] in km


@pytest.mark.parametrize("pause_config", KEEP)
async def test_kept_kernels_cannot_be_restarted_or_swapped_while_paused(ws, jp_serverapp):
    nb = await ws.open_notebook("kept.ipynb")
    kid, sid = nb["kernel"]["id"], nb["id"]
    await ws.run(kid, "x = 1")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused" and kid in jp_serverapp.kernel_manager

    body = await refused(ws, "api", "kernels", kid, "restart")
    assert body["message"] == kernelguard.PAUSED
    for change in ({"name": "python3"}, {"id": None, "name": "python3"}):
        body = await refused(ws, "api", "sessions", sid, method="PATCH",
                             body=json.dumps({"kernel": change}))
        assert body["message"] == kernelguard.PAUSED
    # What starts nothing still works: interrupting, the existing session for its path.
    r = await ws.fetch("api", "kernels", kid, "interrupt", method="POST", body="{}")
    assert r.code == 204
    again = await ws.new_session("kept.ipynb")
    assert again["id"] == sid and again["kernel"]["id"] == kid
    assert list(jp_serverapp.kernel_manager.list_kernel_ids()) == [kid]

    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "live", st
    assert (await ws.run(kid, "print(x)")).strip() == "1"  # never restarted
    r = await ws.fetch("api", "kernels", kid, "restart", method="POST", body="{}")
    assert r.code == 200


async def test_no_kernel_starts_while_pausing(ws, tmp_path):
    nb = await ws.open_notebook("slow.ipynb")
    marker = tmp_path / "pickling"
    await ws.run(nb["kernel"]["id"], SLOW_PICKLE + f"slow = Slow({str(marker)!r}, 4)")
    await ws.api("POST", "pause")
    await until(marker.exists, what="the slow variable being pickled")
    assert ws.lifecycle.flight is not None
    body = await refused(ws, "api", "sessions", body=session_body("new.ipynb"))
    assert body["message"] == kernelguard.PAUSING
    await ws.lifecycle.wait()
    assert (await ws.status())["state"] == "paused"


async def test_resume_never_restores_into_a_kernel_it_did_not_start(ws, jp_serverapp,
                                                                     monkeypatch):
    nb = await ws.open_notebook("work.ipynb")
    await ws.run(nb["kernel"]["id"], "x = 'from the checkpoint'")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused"

    # A resume that fails before any kernel came back leaves the workspace failed (not
    # paused): the person may open notebooks then, the paused one among them.
    async def no_capacity(ctx):
        raise BackendError("no capacity", reason="capacity")

    monkeypatch.setattr(ws.lifecycle.backend, "resume", no_capacity)
    _, st = await ws.flight("resume")
    assert st["state"] == "failed" and st["resume_available"], st
    monkeypatch.undo()
    reopened = await ws.open_notebook("work.ipynb")
    foreign = reopened["kernel"]["id"]
    await ws.run(foreign, "y = 'new work'\nx = 'newer than the checkpoint'")
    side = (await ws.open_notebook("side.ipynb"))["kernel"]["id"]

    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    report = st["last_report"]
    (k,) = report["kernels"]
    assert k["outcome"] == "restored" and k["kernel_id"] not in (foreign, side)
    # The kernels no paused session owned are named, and nothing was restored into them.
    others = {o["kernel_id"]: o for o in report["other_kernels"]}
    assert set(others) == {foreign, side}, others
    assert others[foreign]["path"] == "work.ipynb" and "nothing" in others[foreign]["reason"]
    assert others[side]["path"] == "side.ipynb"
    assert (await ws.run(foreign, "print(x, '|', y)")).strip() == (
        "newer than the checkpoint | new work")
    assert (await ws.run(k["kernel_id"], "print(x)")).strip() == "from the checkpoint"
    # The journal says it too (the report is in "ready"), and the notebook is on its kernel.
    ready = [e for e in ws.journal() if e["event"] == "ready"][-1]
    assert ready["report"]["other_kernels"] == report["other_kernels"]
    (s,) = [s for s in await sessions(ws) if s["path"] == "work.ipynb"]
    assert s["kernel"]["id"] == k["kernel_id"]
    assert foreign in jp_serverapp.kernel_manager  # kept running with its work


async def test_notebook_renamed_while_paused_comes_back_at_its_new_path(ws):
    await ws.fetch("api", "contents", "old.ipynb", method="PUT",
                   body=json.dumps({"type": "notebook", "format": "json", "content": {
                       "cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}}))
    nb = await ws.open_notebook("old.ipynb")
    await ws.run(nb["kernel"]["id"], "x = 5")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused"

    # JupyterLab renames an open notebook through the contents API (no session exists now).
    r = await ws.fetch("api", "contents", "old.ipynb", method="PATCH",
                       body=json.dumps({"path": "new name.ipynb"}))
    assert json.loads(r.body)["path"] == "new name.ipynb"
    await until(lambda: any(e["event"] == "renamed" for e in ws.journal()),
                what="the rename being journaled")
    (e,) = [e for e in ws.journal() if e["event"] == "renamed"]
    assert (e["old_path"], e["new_path"]) == ("old.ipynb", "new name.ipynb")
    # The journal alone carries it (a server restarted while paused resumes it there too).
    replayed = default_state()
    for entry in ws.journal():
        apply(replayed, entry)
    assert [k["path"] for k in replayed["pause"]["kernels"]] == ["new name.ipynb"]

    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    (k,) = st["last_report"]["kernels"]
    assert k["path"] == "new name.ipynb"
    (s,) = await sessions(ws)
    assert s["path"] == "new name.ipynb" and s["id"] == nb["id"]
    assert s["kernel"]["id"] == k["kernel_id"]
    assert (await ws.run(k["kernel_id"], "print(x)")).strip() == "5"


@pytest.mark.parametrize("pause_config", KEEP)
async def test_session_moved_while_paused_is_not_recreated_at_the_old_path(ws):
    nb = await ws.open_notebook("a.ipynb")
    kid = nb["kernel"]["id"]
    _, st = await ws.flight("pause")
    assert st["state"] == "paused"
    # A path-only PATCH starts nothing: allowed while paused, and followed.
    r = await ws.fetch("api", "sessions", nb["id"], method="PATCH",
                       body=json.dumps({"path": "sub/b.ipynb"}))
    assert json.loads(r.body)["path"] == "sub/b.ipynb"
    assert ws.lifecycle.state["pause"]["kernels"][0]["path"] == "sub/b.ipynb"

    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "live", st
    (k,) = st["last_report"]["kernels"]
    assert k["path"] == "sub/b.ipynb" and k["kernel_id"] == kid
    assert [(s["id"], s["path"]) for s in await sessions(ws)] == [(nb["id"], "sub/b.ipynb")]


def test_a_folder_rename_moves_every_recorded_notebook_in_it():
    st = default_state()
    st["pause"] = {"kernels": [
        {"kernel_id": "1", "path": "proj/a.ipynb", "session_name": "a.ipynb"},
        {"kernel_id": "2", "path": "proj/sub/b.ipynb", "session_name": "proj/sub/b.ipynb"},
        {"kernel_id": "3", "path": "project.ipynb"}]}
    st["stopped"] = {"kernels": [{"path": "proj/a.ipynb"}], "pending": ["proj/a.ipynb"]}
    apply(st, {"seq": 1, "event": "renamed", "old_path": "proj", "new_path": "work"})
    assert [(k["path"], k.get("session_name")) for k in st["pause"]["kernels"]] == [
        ("work/a.ipynb", "a.ipynb"), ("work/sub/b.ipynb", "work/sub/b.ipynb"),
        ("project.ipynb", None)]
    assert st["stopped"]["pending"] == ["work/a.ipynb"]
    assert st["stopped"]["kernels"][0]["path"] == "work/a.ipynb"
