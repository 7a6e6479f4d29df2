"""A pause with a kernel that cannot be checkpointed: refused (409, nothing changed) unless the
request lets that kernel lose its state; then it is shut down without a checkpoint, named in the
journal and the reports, and its resume starts it fresh. Real kernels: a Python notebook beside
the echo wrapper kernel (echo_kernel.py) or a Python kernel without jupyter-pause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tornado.httpclient

from tests.server.echo_kernel import BARE_PYTHON, ECHO, install_kernelspecs

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def kernelspecs(jp_kernel_dir):
    install_kernelspecs(jp_kernel_dir)


async def open_kernel(ws, path, kernel_name):
    """A notebook session on ``kernel_name`` (POST /api/sessions, as JupyterLab does)."""
    r = await ws.fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": path, "name": path, "type": "notebook", "kernel": {"name": kernel_name}}))
    model = json.loads(r.body)
    await ws.wait_ready(model["kernel"]["id"])
    return model["kernel"]["id"]


async def pause_refused(ws, body=None):
    """POST pause that must be refused with 409: its JSON body. (``ws.run`` returns once the
    server has read the cell's end: POST pause does not ask a kernel it reads as busy.)"""
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await ws.api("POST", "pause", body or {})
    assert e.value.code == 409, e.value
    return json.loads(e.value.response.body)


async def test_a_pause_that_would_lose_a_kernels_state_is_refused_and_changes_nothing(ws):
    py = await open_kernel(ws, "model.ipynb", "python3")
    echo = await open_kernel(ws, "notes.ipynb", ECHO)
    await ws.run(py, "weights = [1.5, 2.5]")
    assert await ws.run(echo, "hello") == "hello"

    body = await pause_refused(ws)
    assert body["reason"] == "uncheckpointable"
    [k] = body["uncheckpointable"]
    assert k["kernel_id"] == echo and k["path"] == "notes.ipynb" and k["kernel"] == ECHO
    assert k["language"] == "echo" and "Python kernels" in k["why"], k
    assert "notes.ipynb" in body["message"] and "Nothing was changed" in body["message"]
    # A lose_state that names another kernel is no answer for this one.
    assert (await pause_refused(ws, {"lose_state": [py]}))["uncheckpointable"][0]["kernel_id"] \
        == echo

    # Nothing changed: no flight, both kernels run on with their memory.
    st = await ws.status()
    assert st["state"] == "running" and st["flight"] is None
    assert not any(e["event"] == "pause_requested" for e in ws.journal())
    assert sorted(ws.serverapp.kernel_manager.list_kernel_ids()) == sorted([py, echo])
    assert await ws.run(py, "print(weights)") == "[1.5, 2.5]\n"
    assert await ws.run(echo, "recall") == "hello\n"


async def test_pause_anyway_saves_the_python_kernel_and_names_the_lost_one(ws):
    py = await open_kernel(ws, "model.ipynb", "python3")
    echo = await open_kernel(ws, "notes.ipynb", ECHO)
    await ws.run(py, "weights = [1.5, 2.5]")
    await ws.run(echo, "hello")

    _, st = await ws.flight("pause", {"lose_state": [echo]})
    assert st["state"] == "paused", st
    assert list(ws.serverapp.kernel_manager.list_kernel_ids()) == []
    [written] = [e for e in ws.journal() if e["event"] == "checkpoint_written"]
    assert written["state_not_saved"] == [
        {"path": "notes.ipynb", "kernel_id": echo, "kernel": ECHO,
         "why": written["state_not_saved"][0]["why"]}]
    assert "Python kernels" in written["state_not_saved"][0]["why"]
    by_path = {k["path"]: k for k in written["kernels"]}
    assert by_path["model.ipynb"]["checkpoint_id"] and not by_path["model.ipynb"][
        "state_not_saved"]
    assert by_path["notes.ipynb"]["checkpoint_id"] is None
    # What a resume would bring back says so before the resume.
    waiting = {c["path"]: c for c in st["resume_from"]["checkpoints"]}
    assert waiting["notes.ipynb"]["state_not_saved"] and waiting["model.ipynb"]["checkpoint_id"]

    _, st = await ws.flight("resume")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    report = {k["path"]: k for k in st["last_report"]["kernels"]}
    notes, model = report["notes.ipynb"], report["model.ipynb"]
    assert notes["outcome"] == "fresh" and notes["state_not_saved"], notes
    assert notes["reason"].startswith("state not saved: ") and "fresh kernel" in notes["reason"]
    assert "restored" not in notes["reason"]
    assert model["outcome"] == "restored"
    # The next cells: the Python notebook's variables are back, the echo kernel is new.
    assert await ws.run(model["kernel_id"], "print(weights)") == "[1.5, 2.5]\n"
    assert await ws.run(notes["kernel_id"], "recall") == ""
    assert notes["kernel_id"] != echo


async def test_a_python_kernel_without_the_kernel_side_is_named_with_its_install_command(ws):
    bare = await open_kernel(ws, "other.ipynb", BARE_PYTHON)
    await ws.run(bare, "x = 1")
    body = await pause_refused(ws)
    [k] = body["uncheckpointable"]
    assert k["kernel_id"] == bare and k["language"] == "python", k
    assert "not installed" in k["why"] and "pip install" in (k["install_command"] or ""), k
    assert (await ws.status())["state"] == "running"

    _, st = await ws.flight("pause", {"allow_uncheckpointable": True})
    assert st["state"] == "paused", st
    _, st = await ws.flight("resume")
    [k] = st["last_report"]["kernels"]
    assert k["outcome"] == "fresh" and "not installed" in k["state_not_saved"], k


async def test_lose_state_must_be_a_list_of_kernel_ids(ws):
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await ws.api("POST", "pause", {"lose_state": "all"})
    assert e.value.code == 400
    assert "lose_state" in json.loads(e.value.response.body)["message"]


async def test_the_pause_magic_refuses_then_pauses_anyway_with_lose_state(ws, monkeypatch,
                                                                          jp_http_port,
                                                                          jp_base_url):
    # The kernel finds this in-process server through the variables a kernel may be given
    # (server_api.find_server), set before the kernels start so they inherit them.
    monkeypatch.setenv("JUPYTER_PAUSE_SERVER_URL", f"http://127.0.0.1:{jp_http_port}{jp_base_url}")
    monkeypatch.setenv("JUPYTER_PAUSE_SERVER_TOKEN", ws.serverapp.identity_provider.token)
    py = await open_kernel(ws, "model.ipynb", "python3")
    echo = await open_kernel(ws, "notes.ipynb", ECHO)
    await ws.run(py, "%load_ext jupyter_pause\nweights = [1.5, 2.5]")

    with pytest.raises(AssertionError) as e:
        await ws.run(py, "%pause")
    said = str(e.value)
    assert "UsageError" in said and "nothing was changed" in said, said
    assert "notes.ipynb" in said and "%pause --lose-state" in said, said
    assert (await ws.status())["state"] == "running"
    assert not any(e["event"] == "pause_requested" for e in ws.journal())

    assert "Pause requested" in await ws.run(py, "%pause --lose-state")
    await ws.lifecycle.wait()
    st = await ws.status()
    assert st["state"] == "paused", st
    [written] = [e for e in ws.journal() if e["event"] == "checkpoint_written"]
    assert [k["kernel_id"] for k in written["state_not_saved"]] == [echo]


async def test_a_kernel_side_installed_since_the_refusal_is_checkpointed_not_lost(ws):
    """The refusal's answer is not reused: the person installs the package into the running
    kernel's environment and pauses anyway; the kernel is asked again, can be checkpointed
    now, and its state is saved (never "lost" on an old answer)."""
    bare = await open_kernel(ws, "other.ipynb", BARE_PYTHON)
    await ws.run(bare, "x = 41")
    assert (await pause_refused(ws))["uncheckpointable"][0]["kernel_id"] == bare
    # What an install into that environment does for the running process: the package is
    # importable from now on (here: the source tree back on its path).
    root = str(Path(__file__).resolve().parents[2])
    await ws.run(bare, f"import sys; sys.path.insert(0, {root!r}); x += 1")

    _, st = await ws.flight("pause", {"allow_uncheckpointable": True})
    assert st["state"] == "paused", st
    [written] = [e for e in ws.journal() if e["event"] == "checkpoint_written"]
    assert not written.get("state_not_saved"), written
    [k] = written["kernels"]
    assert k["path"] == "other.ipynb" and k["checkpoint_id"], k  # saved, not lost
    # (Its resume would start the bare kernel again, without the path added by hand above.)


async def test_the_pause_magic_is_not_asked_while_it_runs_whatever_the_server_has_heard(
        ws, monkeypatch, jp_http_port, jp_base_url):
    """``%pause`` sends its request while its cell runs. jupyter_server learns that the kernel
    is busy from the kernel's IOPub status message, which races the request over HTTP; a
    server that has not heard it yet would ask the kernel whether it can be checkpointed, and
    that question waits behind the very cell waiting for the answer. The magic names its
    kernel; here the server is made to have heard nothing, so only the name can spare it."""
    from jupyter_pause.server import bridge, checkpointable

    monkeypatch.setenv("JUPYTER_PAUSE_SERVER_URL", f"http://127.0.0.1:{jp_http_port}{jp_base_url}")
    monkeypatch.setenv("JUPYTER_PAUSE_SERVER_TOKEN", ws.serverapp.identity_provider.token)
    py = await open_kernel(ws, "model.ipynb", "python3")
    await ws.run(py, "%load_ext jupyter_pause\nweights = [1.5, 2.5]")
    # Nothing has told the server yet what runs on this kernel's side of the bridge.
    assert checkpointable.kernel_side_of(ws.serverapp.kernel_manager.get_kernel(py)
                                         ).installed is None

    # The kernels asked while POST pause is answered (the flight asks again later, once the
    # cell has ended: that question is right, and not counted).
    asked: list[str] = []
    answering = False
    real_ask, real_state = checkpointable.ask_kernel_side, bridge.execution_state
    real_checked = type(ws.lifecycle).checked_pause

    async def ask(serverapp, kernel_id, timeout=10.0, **kw):
        if answering:
            asked.append(kernel_id)
        return await real_ask(serverapp, kernel_id, timeout, **kw)

    async def checked_pause(self, *a, **kw):
        nonlocal answering
        answering = True
        try:
            return await real_checked(self, *a, **kw)
        finally:
            answering = False

    monkeypatch.setattr(checkpointable, "ask_kernel_side", ask)
    monkeypatch.setattr(type(ws.lifecycle), "checked_pause", checked_pause)
    monkeypatch.setattr(bridge, "execution_state",
                        lambda app, kid: "idle" if kid == py else real_state(app, kid))
    assert "Pause requested" in await ws.run(py, "%pause")
    assert asked == []
    monkeypatch.setattr(bridge, "execution_state", real_state)
    await ws.lifecycle.wait()
    assert (await ws.status())["state"] == "paused"
    [written] = [e for e in ws.journal() if e["event"] == "checkpoint_written"]
    assert [k["path"] for k in written["kernels"] if k["checkpoint_id"]] == ["model.ipynb"]
