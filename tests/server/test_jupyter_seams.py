"""Where jupyter_pause depends on jupyter_server's code (jupyter_pause.server.jupyter_seams), and
the hooks it uses instead: the idle shutdown asks ``current_activity``, which holds it off while
a resume is in flight, and the journal says the stop was the idle shutdown's."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import time

import jupyter_server
import pytest
from jupyter_server._tz import utcnow
from server_process import Server

from jupyter_pause.server.jupyter_seams import PINNED

pytestmark = pytest.mark.timeout(240)


def source_hash(target: str) -> str:
    """The first 16 hex digits of the sha256 of ``module:qualname``'s source, each line's
    trailing space removed (what jupyter_seams.PINNED holds)."""
    module, qualname = target.split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    obj = getattr(obj, "func", obj)  # a traitlets @default handler
    source = "\n".join(line.rstrip() for line in inspect.getsource(obj).splitlines())
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@pytest.mark.parametrize("target", sorted(PINNED))
def test_the_jupyter_server_code_a_seam_depends_on_is_unchanged(target):
    pin = PINNED[target]
    found = source_hash(target)
    assert found in pin["sha256"].values(), (
        f"jupyter_server {jupyter_server.__version__} changed {target} (source hash {found}; "
        f"checked: {pin['sha256']}). Read it and re-check what jupyter_pause.server."
        f"jupyter_seams says of it (seam {pin['seam']}); if that still holds, add "
        f"{{{jupyter_server.__version__!r}: {found!r}}} to PINNED[{target!r}]['sha256'], "
        "else change the seam.")


async def _idle_for(serverapp, seconds: float, timeout: float = 30) -> None:
    """Wait until the server saw no activity for more than ``seconds`` (what
    ``shutdown_no_activity`` compares with ``shutdown_no_activity_timeout``)."""
    deadline = time.monotonic() + timeout
    while (utcnow() - serverapp.web_app.last_activity()).total_seconds() <= seconds:
        assert time.monotonic() < deadline, "the server never went idle"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("pause_config", [
    {"PauseApp": {"backend": "pause_test_backends.GatedResume"}, "LocalBackend": {}}])
async def test_the_idle_shutdown_never_stops_the_server_in_the_middle_of_a_resume(
        ws, jp_serverapp, monkeypatch):
    # jupyter_server's own shutdown_no_activity is called here, as its once-a-minute periodic
    # callback calls it; only the stop it would make is recorded instead of run, since it
    # would stop this test's event loop.
    stops: list[bool] = []
    monkeypatch.setattr(jp_serverapp, "stop", lambda from_signal=False: stops.append(from_signal))
    monkeypatch.setattr(jp_serverapp, "shutdown_no_activity_timeout", 1)
    app, km = ws.lifecycle.app, jp_serverapp.kernel_manager
    nb = await ws.open_notebook("gpu.ipynb")
    await ws.run(nb["kernel"]["id"], "weights = list(range(5))")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused" and len(km) == 0, st

    # Paused with nothing in flight is idle: the idle shutdown may stop it.
    await _idle_for(jp_serverapp, 1)
    assert not app.current_activity()
    jp_serverapp.shutdown_no_activity()
    assert stops == [False]

    backend = ws.lifecycle.backend
    await ws.api("POST", "resume")
    await asyncio.wait_for(backend.entered.wait(), 30)  # held before any kernel starts
    await _idle_for(jp_serverapp, 1)
    assert len(km) == 0
    jp_serverapp.shutdown_no_activity()
    assert stops == [False], "the idle shutdown stopped the server in the middle of a resume"
    [busy] = app.current_activity()
    assert busy.startswith("jupyter_pause resume "), busy

    backend.gate.set()
    await ws.lifecycle.wait()
    st = await ws.status()
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    [k] = st["last_report"]["kernels"]
    assert (await ws.run(k["kernel_id"], "print(sum(weights))")).strip() == "10"
    # A checkpoint the kernel writes on its own is no activity of the extension.
    await ws.run(k["kernel_id"], "%load_ext jupyter_pause\n%checkpoint")
    assert not app.current_activity()


def test_an_idle_shutdown_checkpoints_and_is_journaled_as_idle(tmp_path):
    s = Server(tmp_path)
    s.args.append("--ServerApp.shutdown_no_activity_timeout=1")
    s.start()
    try:
        # jupyter_server checks once a minute (ServerApp.init_shutdown_no_activity)
        code = s.wait_exit(60 + 60)
        assert code is not None, f"the idle shutdown did not stop the server:\n{s.log_tail()}"
    finally:
        s.stop()
    assert "shutting down" in s.log_text()
    [entry] = [e for e in s.journal() if e["event"] == "stopped"]
    assert entry["trigger"] == "idle" and entry["rows"] == [], entry
