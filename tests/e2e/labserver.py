"""Helpers for the real-browser tests: start a real `jupyter lab` subprocess, take screenshots.

Python Playwright drives the system Chromium (never `playwright install`). Each server gets
its own temp root, settings, workspaces, checkpoint store, key and journal, so tests never
touch the user's files.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TOKEN = "e2e-token"
REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-output" / "screenshots"

needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"no Chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def notebook_json(*sources: str) -> dict[str, Any]:
    """A minimal nbformat 4 notebook with one code cell per source."""
    return {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"cell-{i}",
                "metadata": {},
                "outputs": [],
                "source": src,
            }
            for i, src in enumerate(sources or ("",))
        ],
        "metadata": {
            "kernelspec": {
                "display_name": "Python 3 (ipykernel)",
                "language": "python",
                "name": "python3",
            },
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@dataclass
class LabServer:
    url: str
    root: Path
    home: Path
    proc: subprocess.Popen
    log_path: Path
    extra: list[str] = field(default_factory=list)

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
        """Call the server with the token (no XSRF needed with a token header)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}/{path.lstrip('/')}",
            data=data,
            method=method,
            headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return json.loads(text) if text else None

    def pause_status(self) -> dict[str, Any]:
        return self.api("GET", "jupyter-pause/api/status")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def write_notebook(self, name: str, *sources: str) -> str:
        (self.root / name).write_text(json.dumps(notebook_json(*sources)))
        return name

    def lab_url(self, path: str = "") -> str:
        return (
            f"{self.url}/lab/tree/{path}?token={TOKEN}" if path else f"{self.url}/lab?token={TOKEN}"
        )

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            self.api("POST", "api/shutdown", timeout=5)
        except (OSError, ValueError):  # already going down, or hung: use signals below
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _defaults_not_in(extra: list[str], defaults: list[str]) -> list[str]:
    """The defaults that `extra` does not set: a trait given twice on the command line is a
    config error (the server would then run with that trait and later ones at their defaults)."""
    given = {arg.split("=", 1)[0] for arg in extra}
    return [arg for arg in defaults if arg.split("=", 1)[0] not in given]


def start_lab(
    base: Path, extra: list[str], settings_overrides: dict[str, dict] | None = None
) -> LabServer:
    """Start `jupyter lab`; `settings_overrides` maps "@scope/pkg-extension/plugin" to settings."""
    root, home = base / "root", base / "home"
    settings, workspaces = home / "settings", home / "workspaces"
    for d in (root, settings, workspaces):
        d.mkdir(parents=True, exist_ok=True)
    # No "get notified about Jupyter news?" toast over the screenshots.
    overrides = {
        "@jupyterlab/apputils-extension/notification": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
        **(settings_overrides or {}),
    }
    for plugin, values in overrides.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port = _free_port()
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
        PYTHONUNBUFFERED="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={TOKEN}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={workspaces}",
        "--LabServerApp.extension_manager=readonly",
        *_defaults_not_in(extra, [
            f"--PauseApp.state_dir={home / 'state'}",
            f"--PauseApp.store_url={home / 'store'}",
            f"--PauseApp.key_path={home / 'checkpoint.key'}",
        ]),
        *extra,
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    if os.environ.get("E2E_SERVER_DEBUG"):  # every request and kernel message in the log
        cmd.append("--ServerApp.log_level=DEBUG")
    log_path = base / "jupyter-lab.log"
    log = log_path.open("w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = LabServer(f"http://127.0.0.1:{port}", root, home, proc, log_path, extra)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited early:\n{server.log()[-4000:]}")
        try:
            server.api("GET", "api/status", timeout=2)
            return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"jupyter lab did not answer in 90 s:\n{server.log()[-4000:]}")


def shot(page, name: str) -> Path:
    """Save a screenshot to test-output/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
