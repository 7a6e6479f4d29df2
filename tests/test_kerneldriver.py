"""The tests' one kernel driver (tests/kerneldriver.py) against a real `jupyter server` and its
kernel: ZMQ (blocking and asynchronous) and the kernel websocket read a cell the same way, and
a failed cell fails ``ok``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.asynchronous import AsyncKernelClient

from tests.harness import JupyterProcess
from tests.kerneldriver import run_cell, run_websocket

pytestmark = pytest.mark.timeout(180)

CELL = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nx = 6 * 7\nx"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[JupyterProcess, str]]:
    srv = JupyterProcess(tmp_path_factory.mktemp("driver")).start()
    try:
        yield srv, srv.open_notebook("d.ipynb")["kernel"]["id"]
    finally:
        srv.stop()


def test_blocking_driver_runs_evaluates_and_reports_failures(server) -> None:
    srv, kid = server
    with srv.driver(kid) as k:
        out = k.ok(CELL)
        assert (out.stdout, out.stderr) == ("out\n", "err\n")
        assert out.results == [{"text/plain": "42"}]
        assert k.eval("x + 1") == 43
        count = out.execution_count
        assert k.silent("x - 1") == 41
        assert k.ok("1").execution_count == count + 1  # the silent request took no number

        bad = k.run("1 / 0")
        assert bad.status == "error" and bad.errors[0]["ename"] == "ZeroDivisionError"
        assert "ZeroDivisionError" in bad.text
        with pytest.raises(AssertionError, match="ZeroDivisionError"):
            k.ok("1 / 0")
        with pytest.raises(AssertionError, match="Traceback"):  # status ok, a traceback shown
            k.ok("import traceback\ntry:\n    1 / 0\nexcept Exception:\n    traceback.print_exc()")
    assert srv.output(kid, "print(x)") == "42\n"


def test_async_client_and_websocket_read_a_cell_as_the_blocking_one(server) -> None:
    srv, kid = server

    async def over_zmq():
        kc = AsyncKernelClient()
        kc.load_connection_info(
            json.loads((Path(srv.home) / "runtime" / f"kernel-{kid}.json").read_text()))
        kc.start_channels(hb=False)
        try:
            return await run_cell(kc, CELL, user_expressions={"v": "x * 2"})
        finally:
            kc.stop_channels()

    ws_url = f"ws://127.0.0.1:{srv.port}/api/kernels/{kid}/channels"
    for out in (asyncio.run(over_zmq()),
                asyncio.run(run_websocket(ws_url, CELL, token=srv.token,
                                          user_expressions={"v": "x * 2"}))):
        out.check(CELL)
        assert (out.stdout, out.stderr) == ("out\n", "err\n")
        assert out.results == [{"text/plain": "42"}]
        assert out.expr("v") == 84
    bad = asyncio.run(run_websocket(ws_url, "raise KeyError('k')", token=srv.token))
    assert bad.status == "error" and bad.errors[0]["ename"] == "KeyError"


def test_start_returns_while_the_cell_still_runs(server, tmp_path: Path) -> None:
    srv, kid = server
    marker = tmp_path / "go"
    # The cell runs until the marker exists, and the marker is made only once start returned:
    # a start that waited for the cell's end would time out here.
    code = (f"import os, time\ndeadline = time.monotonic() + 60\n"
            f"while not os.path.exists({str(marker)!r}) and time.monotonic() < deadline:\n"
            f"    time.sleep(0.05)\nseen = os.path.exists({str(marker)!r})")
    with srv.driver(kid) as k:
        k.start(code)
        marker.touch()
        assert k.eval("seen", timeout=90) is True


def test_a_server_whose_port_was_taken_first_starts_on_another(tmp_path, monkeypatch) -> None:
    """Two test runs on one machine: another process binds the port ``free_port`` chose before
    the server does. The server exits with "port N is not available"; the harness starts it
    again on a new port instead of failing the test that asked for it."""
    import socket

    from tests import harness

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    real = harness.free_port
    monkeypatch.setattr(harness, "free_port", lambda: next(ports, None) or real())
    srv = JupyterProcess(tmp_path).start()
    try:
        assert srv.port != taken.getsockname()[1]
        assert srv.request("GET", "api/status", timeout=10)
    finally:
        srv.stop()
        taken.close()
