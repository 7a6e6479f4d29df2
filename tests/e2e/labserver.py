"""Helpers for the real-browser tests: start a real `jupyter lab` subprocess, take screenshots.

Python Playwright drives the system Chromium (never `playwright install`). Each server gets
its own temp root, settings, workspaces, checkpoint store, key and journal, so tests never
touch the user's files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.harness import JupyterProcess, pause_server_config

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
REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-output" / "screenshots"

needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"no Chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)",
)


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


class LabServer(JupyterProcess):
    """A `jupyter lab` process: root under ``base/root``; its settings, workspaces, Jupyter
    directories and jupyter_pause's state, store and key under ``base/home``."""

    module = "jupyterlab"
    name = "jupyter lab"

    def __init__(self, base: Path, extra: list[str],
                 settings_overrides: dict[str, dict] | None = None):
        """``extra``: command-line options, over the config (``--PauseApp.store_url=...``);
        ``settings_overrides`` maps "@scope/pkg-extension/plugin" to settings."""
        home = base / "home"
        settings, workspaces = home / "settings", home / "workspaces"
        for d in (settings, workspaces):
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
        args = [
            "--no-browser",
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={workspaces}",
            "--LabServerApp.extension_manager=readonly",
            *extra,
        ]
        if os.environ.get("E2E_SERVER_DEBUG"):  # every request and kernel message in the log
            args.append("--ServerApp.log_level=DEBUG")
        super().__init__(
            home,
            pause_server_config(home / "state", home / "store", home / "checkpoint.key"),
            root=base / "root",
            env={"IPYTHONDIR": str(home / "ipython"), "PYTHONUNBUFFERED": "1"},
            args=args,
            start_timeout=90,
        )
        self.extra = extra

    def api(self, method: str, path: str, body: Any = None, timeout: float = 30) -> Any:
        """Call the server with the token (no XSRF needed with a token header)."""
        return self.request(method, path, body, timeout)

    def pause_status(self) -> dict[str, Any]:
        return self.api("GET", "jupyter-pause/api/status")

    def write_notebook(self, name: str, *sources: str) -> str:
        (self.root / name).write_text(json.dumps(notebook_json(*sources)))
        return name

    def lab_url(self, path: str = "") -> str:
        page = f"lab/tree/{path}" if path else "lab"
        return f"{self.url}{page}?token={self.token}"

    def stop(self, grace: float = 30.0) -> None:
        super().stop(grace)


def start_lab(
    base: Path, extra: list[str], settings_overrides: dict[str, dict] | None = None
) -> LabServer:
    """Start `jupyter lab`; `settings_overrides` maps "@scope/pkg-extension/plugin" to settings."""
    return LabServer(base, extra, settings_overrides).start()


def shot(page, name: str) -> Path:
    """Save a screenshot to test-output/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
