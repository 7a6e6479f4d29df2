"""One rule finds the running server, for the kernel's magics and the CLI alike.

The runtime files are written as jupyter_server writes them (``ServerApp.write_server_info_file``:
``jpserver-<pid>.json`` with ``url``, ``token``, ``pid``, ``root_dir``, ...); a real server found
this way is in tests/server/test_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_pause.cli import client as cli_client
from jupyter_pause.kernel import server_api


def _runtime_file(runtime: Path, name: str, pid: int, root: Path) -> str:
    url = f"http://127.0.0.1:{8000 + len(list(runtime.iterdir()))}/"
    (runtime / f"jpserver-{name}.json").write_text(json.dumps(
        {"url": url, "token": f"token-{name}", "pid": pid, "root_dir": str(root)}))
    return url


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "runtime"
    d.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(d))
    for var in ("JUPYTER_PAUSE_SERVER_URL", "JUPYTER_PAUSE_SERVER_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return d


def _both(runtime: Path) -> tuple[str, str]:
    """What the kernel and the CLI choose: (url, token) each, asserted equal."""
    kernel = server_api.find_server(str(runtime))
    cli = cli_client.find_server()
    assert (cli.url, cli.token) == (kernel["url"], kernel["token"])
    return kernel["url"], kernel["token"]


def test_kernel_and_cli_choose_the_same_server(runtime: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    outer, inner = tmp_path / "work", tmp_path / "work" / "project"
    (inner / "sub").mkdir(parents=True)
    monkeypatch.chdir(inner / "sub")
    me = os.getpid()  # alive, and not an ancestor of this process
    _runtime_file(runtime, "gone", _dead_pid(), inner / "sub")  # a stale file: never chosen
    _runtime_file(runtime, "elsewhere", me, tmp_path / "other")
    _runtime_file(runtime, "outer", me, outer)
    url = _runtime_file(runtime, "inner", me, inner)
    # the server whose root holds the current folder most closely
    assert _both(runtime) == (url, "token-inner")
    # an ancestor of this process (a terminal or kernel of that server) wins over any folder
    parent = _runtime_file(runtime, "parent", os.getppid(), tmp_path / "other")
    assert _both(runtime) == (parent, "token-parent")


def test_no_server_or_no_telling_is_one_line_each(runtime: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(server_api.ServerError, match="^no running Jupyter server found for "
                       "this kernel"):
        server_api.find_server(str(runtime))
    with pytest.raises(cli_client.NoServer, match=r"^no running Jupyter server found \(start"):
        cli_client.find_server()
    _runtime_file(runtime, "a", os.getpid(), tmp_path / "a")
    _runtime_file(runtime, "b", _dead_pid(), tmp_path)
    assert _both(runtime)[1] == "token-a"  # the one live server, whatever its folder
    _runtime_file(runtime, "c", os.getpid(), tmp_path / "c")
    with pytest.raises(server_api.ServerError, match="2 Jupyter servers are running"):
        server_api.find_server(str(runtime))
    with pytest.raises(cli_client.NoServer, match="cannot tell which one to ask: pass --url"):
        cli_client.find_server()
