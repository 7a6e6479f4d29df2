"""`jupyter pause ...` against a real `jupyter server` process, and a SIGKILL mid-checkpoint."""

from __future__ import annotations

import json
import time

import pytest
from server_process import Server

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("cli"))
    s.start()
    yield s
    s.stop()


def test_usage_and_no_server(server, tmp_path):
    code, out = server.cli("frobnicate")
    assert code == 2 and "invalid choice" in out
    empty = {**server.env, "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    code, out = server.cli("status", env=empty)
    assert code == 3 and "no running Jupyter server" in out
    code, out = server.cli("status", "--url", "http://127.0.0.1:9/", env=empty)
    assert code == 3 and "cannot reach" in out


def test_status_list_and_resume_refused(server):
    code, out = server.cli("status")  # found through the runtime dir, like `jupyter server list`
    assert code == 0, out
    assert "State:    running" in out and "Backend:  local" in out
    code, out = server.cli("--json", "status")
    assert code == 0 and json.loads(out)["state"] == "running"
    code, out = server.cli("status", "--url", server.url, "--token", "wrong")
    assert code == 1 and ("403" in out or "Forbidden" in out), out
    code, out = server.cli("list")
    assert code == 0 and "No checkpoints." in out
    code, out = server.cli("resume")
    assert code == 1 and "not paused" in out


def _wait_state(server, *states, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = server.get("jupyter-pause/api/status")
        if st["state"] in states and st["flight"] is None:
            return st
        time.sleep(0.2)
    raise AssertionError(f"state {st['state']} after {timeout} s: {st}")


def _new_session(server, path):
    return server.request("POST", "api/sessions", {
        "path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})


def test_magics_pause_then_no_new_kernel_until_resume(server):
    import urllib.error

    kid = _new_session(server, "m.ipynb")["kernel"]["id"]
    # %pause returns while its cell still runs: the server waits for the cell to end.
    server.run_cell(kid, "%load_ext jupyter_pause\nmagic_value = [3, 1, 4]\nother = 'x'\n%pause")
    st = _wait_state(server, "paused")
    assert st["timeline"][0]["trigger"] == "magic"
    # A new kernel for the notebook would hold the accelerator the pause gave back, and the
    # resume would merge the checkpoint over its work: the server refuses it, whatever client
    # asks (JupyterLab's frontend holds the same paths).
    with pytest.raises(urllib.error.HTTPError) as e:
        _new_session(server, "m.ipynb")
    assert e.value.code == 409
    assert "paused" in json.loads(e.value.read())["message"]
    assert server.get("api/kernels") == []
    code, out = server.cli("resume", "--wait")
    assert code == 0 and "ready: restored from checkpoint" in out, out
    st = server.get("jupyter-pause/api/status")
    (k,) = [k for k in st["last_report"]["kernels"] if k["path"] == "m.ipynb"]
    rows = {v["name"]: v for v in k["variables"]}
    assert set(rows) == {"magic_value", "other"}, k["variables"]
    assert {v["status"] for v in rows.values()} == {"restored"}
    assert rows["magic_value"]["kind"] == "list" and rows["magic_value"]["size"] > 0
    code, out = server.cli("status")
    assert code == 0 and "m.ipynb: restored (2 restored)" in out, out
    kid2 = k["kernel_id"]
    # %resume in the restored kernel says so and restores nothing again
    out = server.output(kid2, "%load_ext jupyter_pause\n%resume")
    assert "already restored from checkpoint" in out, out
    server.run_cell(kid2, "assert magic_value == [3, 1, 4]")
    server.request("DELETE", f"api/kernels/{kid2}")


def test_pause_resume_and_sigkill_mid_checkpoint(server):
    session = server.request("POST", "api/sessions", {
        "path": "k.ipynb", "name": "k.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
    kid = session["kernel"]["id"]
    server.run_cell(kid, "keep = 'safe'")
    code, out = server.cli("pause", "--wait")
    assert code == 0 and "State:    paused" in out, out
    first = server.get("jupyter-pause/api/status")["last_checkpoint"]["id"]
    code, out = server.cli("list")
    assert code == 0 and first in out and "k.ipynb" in out
    code, out = server.cli("resume", "--wait")
    assert code == 0 and "ready: restored from checkpoint" in out, out
    assert "k.ipynb: restored" in out

    # A pause with a large variable; the server dies while the kernel writes the checkpoint.
    kid = server.get("jupyter-pause/api/status")["kernels"][0]["id"]
    server.run_cell(kid, "import numpy as np; big = np.random.default_rng(1).random(24 * 2**20)")
    server.request("POST", "jupyter-pause/api/pause", {"trigger": "manual"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = server.get("jupyter-pause/api/status")
        if st["state"] == "checkpointing" and (st["step"] or {}).get("total"):
            break
        assert st["state"] in ("running", "checkpointing"), st
        time.sleep(0.01)
    else:
        raise AssertionError(f"the checkpoint was not under way within 60 s: {st}")
    server.kill()

    server.start()
    # The kernels died with the server: the pause failed, and the previous good checkpoint is
    # offered (named, with its age) as the way back.
    code, out = server.cli("status")
    assert code == 1, out
    assert "State:    failed" in out and "server stopped during checkpointing" in out, out
    assert first in out
    st = server.get("jupyter-pause/api/status")
    assert st["last_checkpoint"]["id"] == first
    assert st["resume_available"] is True
    assert st["resume_from"]["checkpoints"][0]["checkpoint_id"] == first
    code, out = server.cli("list")
    assert first in out  # no checkpoint lost
    ids = [c["id"] for c in server.get("jupyter-pause/api/checkpoints")["checkpoints"]]
    assert first in ids
    code, out = server.cli("resume", "--wait")
    assert code == 0 and "restored from checkpoint" in out, out
    kid = server.get("jupyter-pause/api/status")["kernels"][0]["id"]
    server.run_cell(kid, "assert keep == 'safe'")


def test_example_notebook_runs(server):
    """examples/local_demo.ipynb, cell by cell as a person runs it: pause, new kernel, resume."""
    import pathlib

    import nbformat

    path = pathlib.Path(__file__).parents[2] / "examples" / "local_demo.ipynb"
    cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    at_pause = next(i for i, c in enumerate(cells) if c.strip() == "%pause")
    kid = _new_session(server, "local_demo.ipynb")["kernel"]["id"]
    for source in cells[: at_pause + 1]:
        server.run_cell(kid, source)
    _wait_state(server, "paused")
    # the notebook's next step: Resume (the status bar's button does the same as the CLI)
    code, out = server.cli("resume", "--wait")
    assert code == 0, out
    st = _wait_state(server, "ready")
    assert st["outcome"] == "restored"
    (kid,) = [k["kernel_id"] for k in st["last_report"]["kernels"]
              if k["path"] == "local_demo.ipynb"]
    for source in cells[at_pause + 1:]:
        server.run_cell(kid, source)
    server.request("DELETE", f"api/kernels/{kid}")
