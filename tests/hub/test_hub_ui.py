"""JupyterLab under a real JupyterHub, in Chromium: log in through configurable-http-proxy,
open a notebook at ``/user/<name>/lab``, and use jupyter_pause's toolbar button and status bar
item there (Pause until paused, Resume until restored), as under a plain ``jupyter lab``."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_process import Hub, chp_bin

from tests.e2e.labserver import CHROMIUM, CHROMIUM_ARGS, needs_chromium, notebook_json

pytest.importorskip("jupyterhub")

pytestmark = [pytest.mark.e2e, needs_chromium, pytest.mark.timeout(240)]

USER = "alice"
NOTEBOOK = "hub-ui.ipynb"
SLOW = 120_000  # ms: a pause or resume stops and starts a real kernel on a busy machine


# pytest-jupyter's autouse loop fixtures would close the event loop that Playwright's sync API
# runs in this thread (as in tests/e2e/conftest.py); the hub runs in a subprocess.
@pytest.fixture
def jp_asyncio_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def jp_server_cleanup() -> Iterator[None]:
    return


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    """A hub with alice's server started and a notebook in her home."""
    chp = chp_bin()
    if chp is None:
        pytest.skip(f"no configurable-http-proxy at {os.environ.get('CHP_BIN') or 'PATH'}: "
                    "tests/run.sh installs it from npm and sets CHP_BIN")
    h = Hub(tmp_path / "hub", chp)
    home = h.prepare_home(USER)
    (home / NOTEBOOK).write_text(json.dumps(notebook_json("x = 41\nprint('set', x)", "")))
    # No "get notified about Jupyter news?" toast over the page.
    settings = home / ".jupyter" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    try:
        h.start()
        h.start_server(USER)
        yield h
    finally:
        h.stop()


def test_toolbar_and_status_through_the_hub(hub: Hub, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(60_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            # The dummy authenticator takes any password; the hub then sends the browser on to
            # the server, which logs it in with the hub's OAuth.
            page.goto(f"{hub.url}/hub/login?next=/user/{USER}/lab/tree/{NOTEBOOK}")
            page.fill("input[name=username]", USER)
            page.fill("input[name=password]", "any")
            page.click("#login_submit")
            page.wait_for_url(re.compile(rf"/user/{USER}/lab"), timeout=60_000)

            panel = page.locator(".jp-NotebookPanel:visible")
            expect(panel).to_have_count(1, timeout=60_000)
            expect(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=60_000)
            status = page.locator(".jp-PauseStatus")
            expect(status).to_have_attribute("data-state", "running", timeout=30_000)
            expect(status).to_have_text(re.compile("Workspace running"))

            # A variable, so there is something to checkpoint and restore.
            panel.locator(".jp-Cell").nth(0).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            output = panel.locator(".jp-Cell").nth(0).locator(".jp-OutputArea-output")
            expect(output).to_contain_text("set 41", timeout=60_000)

            # JupyterLab 4 toolbar buttons are <jp-button> web components.
            button = panel.locator(".jp-PauseButton jp-button")
            expect(button).to_have_text("Pause")
            expect(button).to_have_attribute("aria-disabled", "false", timeout=30_000)
            button.click()
            expect(status).to_have_attribute("data-state", "paused", timeout=SLOW)
            expect(status).to_have_text(re.compile("Paused"))
            expect(button).to_have_text("Resume")
            expect(button).to_have_attribute("aria-disabled", "false", timeout=30_000)
            server = hub.get(f"/user/{USER}/jupyter-pause/api/status")
            assert server["state"] == "paused" and server["last_checkpoint"], server

            button.click()
            # Run a cell at once: it waits for the resume and runs on the restored kernel.
            panel.locator(".jp-Cell").nth(1).locator(".cm-content").click()
            page.keyboard.insert_text("print(x + 1)")
            page.keyboard.press("Shift+Enter")
            expect(status).to_have_attribute("data-state", "ready", timeout=SLOW)
            expect(status).to_have_text("Restored from checkpoint")
            expect(button).to_have_text("Pause")
            after = panel.locator(".jp-Cell").nth(1).locator(".jp-OutputArea-output")
            expect(after).to_contain_text("42", timeout=60_000)
            server = hub.get(f"/user/{USER}/jupyter-pause/api/status")
            assert server["state"] == "ready" and server["outcome"] == "restored", server
            assert not errors, f"JavaScript errors on the page: {errors}"
        except BaseException:
            page.screenshot(path=str(tmp_path / "failure.png"))
            print(f"screenshot: {tmp_path / 'failure.png'}\nhub log:\n{hub.log_tail()}")
            raise
        finally:
            browser.close()
