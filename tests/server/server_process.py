"""A real `jupyter server` process with jupyter_pause enabled, for tests that need a process
(signals, SIGKILL, the shutdown API, the CLI): start, stop, kill and start it again on the same
directories."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.harness import JupyterProcess, pause_server_config, wait_for


class Server(JupyterProcess):
    """A `jupyter server` process with jupyter_pause, its directories under ``tmp`` (kept
    across restarts, as a persistent volume keeps them)."""

    def __init__(self, tmp: Path, pause: dict[str, Any] | None = None, *,
                 shared: Path | None = None):
        """``shared``: where the state directory, store and key live when several servers
        share them (default: ``tmp``)."""
        shared = shared or tmp
        config = pause_server_config(shared / "state", shared / "store", shared / "key",
                                     **{"activity_interval": 0, **(pause or {})})
        super().__init__(tmp, config)
        self.tmp = tmp

    def state(self, *states: str, timeout: float = 90) -> dict[str, Any]:
        """The status once the workspace is in one of ``states`` with no flight running."""
        deadline = time.monotonic() + timeout
        while True:
            _, st = self.call("GET", "jupyter-pause/api/status")
            if st["state"] in states and st["flight"] is None:
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"state {st['state']} after {timeout} s: {st}")
            time.sleep(0.2)

    def cli(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        """``jupyter pause ARGS`` against this server: (exit code, stdout and stderr)."""
        r = subprocess.run([sys.executable, "-m", "jupyter_pause.cli", *args],
                           env=env or self.env, capture_output=True, text=True, timeout=120,
                           check=False)
        return r.returncode, r.stdout + r.stderr

    def run_cell(self, kernel_id: str, code: str) -> None:
        self.output(kernel_id, code)

    def journal(self) -> list[dict[str, Any]]:
        path = self.tmp / "state" / "journal.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written
                pass
        return out

    def wait_for(self, what: str, check: Any, timeout: float = 60) -> Any:
        """Poll ``check()`` until it returns something true; fail with ``what`` after timeout."""
        return wait_for(what, check, timeout, 0.05)
