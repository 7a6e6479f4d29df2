"""jupyter_pause as a single-user server extension under a real JupyterHub: hub authentication
and the ``/user/<name>/`` base URL through configurable-http-proxy; a server the hub stops (its
REST API, as jupyterhub-idle-culler does it, and the culler itself) checkpoints its kernels, and
the next spawn restores them when the notebook is opened again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hub_process import TOKEN, Hub, chp_bin, wait_for

pytest.importorskip("jupyterhub")
pytest.importorskip("jupyterhub_idle_culler")

pytestmark = pytest.mark.timeout(240)

USER = "alice"
NOTEBOOK = "work/model.ipynb"
STATE = "import numpy\nx = 41\narr = numpy.arange(1000)\ndef f():\n    return x + 1\nprint('set')"
CHECK = "print(x, arr.sum(), f())"


@pytest.fixture
def make_hub(tmp_path: Path) -> Iterator[Callable[..., Hub]]:
    chp = chp_bin()
    if chp is None:
        pytest.skip(f"no configurable-http-proxy at {os.environ.get('CHP_BIN') or 'PATH'}: "
                    "tests/run.sh installs it from npm and sets CHP_BIN")
    hubs: list[Hub] = []

    def make(**kwargs: Any) -> Hub:
        hub = Hub(tmp_path / f"hub{len(hubs)}", chp, **kwargs)
        hubs.append(hub)
        hub.prepare_home(USER)
        hub.start()
        return hub

    yield make
    for hub in hubs:
        hub.stop()


def status(hub: Hub) -> dict[str, Any]:
    return hub.get(f"/user/{USER}/jupyter-pause/api/status")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_restored_after_hub_stop(hub: Hub, first_pid: int) -> None:
    """The server stopped by the hub saved the notebook; the next spawn restores it."""
    wait_for("the first server's process to exit", lambda: gone(first_pid), 30)
    pid = hub.start_server(USER)
    assert pid != first_pid
    st = status(hub)
    assert st["outcome"] == "stopped", st
    assert st["stopped"]["pending"] == [NOTEBOOK], st["stopped"]

    # Reopening the notebook restores it before the session answers: the first cell sees it.
    kid = hub.open_notebook(USER, NOTEBOOK)
    assert hub.run_cell(USER, kid, CHECK) == "41 499500 42\n"

    st = status(hub)
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    report = st["last_report"]
    # A hub stops a local server with SIGINT, which jupyter_server handles as a stop signal.
    assert report["after_stop"] == {**report["after_stop"], "trigger": "signal", "hub": True}
    [k] = report["kernels"]
    assert k["path"] == NOTEBOOK and k["outcome"] == "restored", k
    assert k["reason"].startswith("restored after the server was stopped (stop signal, "
                                  "JupyterHub)"), k["reason"]
    assert {v["name"] for v in k["variables"] if v["status"] == "restored"} >= {"x", "arr", "f"}

    # `jupyter pause report` on the home's state directory counts the stop.
    state_dir = hub.home_root / USER / ".jupyter-pause" / "state"
    r = subprocess.run([sys.executable, "-m", "jupyter_pause.cli", "report", "--json",
                        "--state-dir", str(state_dir), "--period", "all"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    stops = json.loads(r.stdout)["report"]["totals"]["stops"]
    assert stops["total"] == 1 and stops["by_trigger"] == {"signal": 1}, stops
    assert stops["kernels_saved"] == 1 and stops["restored_after"] == 1, stops


def test_hub_stop_checkpoints_and_the_next_spawn_restores(make_hub: Callable[..., Hub]) -> None:
    hub = make_hub()
    pid = hub.start_server(USER)

    # The extension answers under /user/alice/ with the hub's authentication.
    st = status(hub)
    assert st["state"] == "running", st
    # JupyterLab through the proxy lists the jupyter-pause labextension.
    extensions = hub.get(f"/user/{USER}/lab/api/extensions")
    assert any(e.get("name") == "jupyter-pause" and e.get("enabled") for e in extensions), \
        [e.get("name") for e in extensions]
    _, page = hub.request("GET", f"/user/{USER}/lab")
    assert "jupyter-pause" in page  # the page's federated_extensions

    # The CLI reaches the server through the proxy with the hub's token.
    r = subprocess.run([sys.executable, "-m", "jupyter_pause.cli", "status", "--json",
                        "--url", f"{hub.url}/user/{USER}/", "--token", TOKEN],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr

    # A notebook holding state, its cells run over the kernel websocket through the proxy.
    kid = hub.open_notebook(USER, NOTEBOOK)
    assert hub.run_cell(USER, kid, STATE) == "set\n"
    assert hub.run_cell(USER, kid, CHECK) == "41 499500 42\n"

    t0 = time.monotonic()
    hub.stop_server(USER)  # DELETE /hub/api/users/alice/server, as the idle culler does
    assert time.monotonic() - t0 < 60
    assert_restored_after_hub_stop(hub, pid)


@pytest.mark.slow_hub
def test_idle_culler_culls_and_the_next_spawn_restores(make_hub: Callable[..., Hub]) -> None:
    # jupyterhub-idle-culler as a hub service: servers idle for 20 s are stopped. The servers
    # report their activity to the hub every 2 s, so the idle time counts from the last cell
    # (not from the spawn), and whatever the extension does in the background must not count.
    hub = make_hub(culler=["--timeout=20", "--cull-every=5"], activity_interval=2)
    pid = hub.start_server(USER)
    kid = hub.open_notebook(USER, NOTEBOOK)
    assert hub.run_cell(USER, kid, STATE) == "set\n"
    last_cell = time.monotonic()

    # Left idle, the culler stops the server.
    wait_for("the idle culler to stop the server", lambda: hub.server(USER) is None, 90, 0.5)
    assert time.monotonic() - last_cell >= 15, "culled before the server was idle for 20 s"
    # ... and it was the culler that asked (not this test's token).
    assert f"DELETE /hub/api/users/{USER}/server (idle-culler@" in hub.log_tail(2000)
    assert_restored_after_hub_stop(hub, pid)
