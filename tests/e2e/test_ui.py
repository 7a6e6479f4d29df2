"""Real-browser tests of the JupyterLab extension: Chromium + a real `jupyter lab` + real kernels.
(Just over 400 lines: the tests share the page helpers above them.)

Run: `python -m pytest tests/e2e -q` (needs Debian's chromium at /usr/bin/chromium).
Screenshots of the main states land in test-output/screenshots/.
"""

from __future__ import annotations

import re
import time

import pytest

from .labserver import LabServer, needs_chromium, shot

pytestmark = [pytest.mark.e2e, needs_chromium]

SLOW = 120_000  # ms: a pause or resume starts and stops real kernels on a 2-core machine

RECORD_STATES = """() => {
  // Every data-state the status item shows, in order (oldValue catches states that changed
  // twice within one observer callback).
  const el = document.querySelector('.jp-PauseStatus');
  const list = (window.__pauseStates = [el.dataset.state]);
  const push = s => { if (s && list[list.length - 1] !== s) list.push(s); };
  new MutationObserver(records => {
    for (const r of records) push(r.oldValue);
    push(el.dataset.state);
  }).observe(el, {attributes: true, attributeFilter: ['data-state'], attributeOldValue: true});
}"""


def expect():
    from playwright.sync_api import expect as _expect

    return _expect


def open_notebook(page, lab: LabServer, name: str):
    page.goto(lab.lab_url(name))
    panel = page.locator(".jp-NotebookPanel:visible")
    expect()(panel).to_have_count(1, timeout=60_000)
    # The kernel is up when the status bar says Idle.
    expect()(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=60_000)
    expect()(page.locator(".jp-PauseStatus")).to_be_visible()
    return panel


def run_cell(page, panel, index: int, code: str, started: bool = True) -> None:
    """Type `code` into cell `index` and run it with Shift+Enter, once the editor shows it.

    A notebook that is still attaching its cells (Notebook 7 right after the page loads,
    under load) can take the click before the cell's editor has focus, and the typed text goes
    nowhere; so the text is typed again until the editor holds it (at most three times), and
    only then run: a run of an empty cell would wait for output that never comes.

    ``started``: the run must start (its prompt leaves "[ ]:"). Seen under load (Notebook 7,
    the first cell after the page loaded): the editor showed the code, Shift+Enter moved to
    the next cell, and the cell never ran, its prompt still "[ ]:"; most likely the run read
    the cell's model before CodeMirror had read the typed text into it. So a run that does
    not start is typed and run once more. False for a run the kernel hold keeps waiting or
    refuses (it starts late, or never: a second run would run it twice), and for a run that
    kills its kernel (a restart clears the prompt back to "[ ]:", often before the busy prompt
    is seen, and the restart dialog then takes the second run's click)."""
    cell = panel.locator(".jp-Cell").nth(index)
    editor = cell.locator(".cm-content")
    prompt = cell.locator(".jp-InputPrompt")
    first = code.splitlines()[0] if code.strip() else ""
    for attempt in range(2 if started else 1):
        for _ in range(3):
            editor.click()
            page.keyboard.press("ControlOrMeta+a")
            page.keyboard.insert_text(code)
            try:
                expect()(editor).to_contain_text(first, timeout=10_000)
                break
            except AssertionError:
                continue
        else:
            raise AssertionError(f"cell {index}'s editor never took the code {first!r}")
        page.keyboard.press("Shift+Enter")
        if not started:
            return
        try:
            expect()(prompt).not_to_have_text(re.compile(r"^\[\s*\]:?$"), timeout=20_000)
            return
        except AssertionError:
            if attempt:
                raise


def cell_output(panel, index: int):
    return panel.locator(".jp-Cell").nth(index).locator(".jp-OutputArea-output")


def pause_button(panel):
    # JupyterLab 4 toolbar buttons are <jp-button> web components: title and aria-* on the host.
    return panel.locator(".jp-PauseButton jp-button")


def expect_enabled(button, enabled: bool = True, timeout: float = 30_000) -> None:
    expect()(button).to_have_attribute(
        "aria-disabled", "false" if enabled else "true", timeout=timeout
    )


def kernel_name(panel):
    """The notebook toolbar's kernel name, which follows SessionContext.kernelChanged. Not the
    status bar's kernel item: its model (KernelStatus.Model._triggerChange, JupyterLab 4.7)
    repaints after a kernel change only when nothing changed, so once a stopped kernel's
    session is let go it keeps "Python 3 (ipykernel) | Disconnected" until another status
    signal comes, which depends on whether the socket closed before or after."""
    return panel.locator(".jp-Toolbar-kernelName")


def status_item(page):
    return page.locator(".jp-PauseStatus")


def test_pause_resume_restores_variables(lab: LabServer, page) -> None:
    """Define variables, Pause, see it reach paused, Resume, report says restored, use them.
    A generator cannot be checkpointed: the report offers to recompute it, and that works."""
    lab.write_notebook("analysis.ipynb", "", "", "", "")
    panel = open_notebook(page, lab, "analysis.ipynb")
    status = status_item(page)
    expect()(status).to_have_attribute("data-state", "running", timeout=30_000)
    expect()(status).to_have_text(re.compile("Workspace running"))

    run_cell(
        page,
        panel,
        0,
        "import numpy as np\nx = 41\nnames = ['a', 'b']\narr = np.arange(5)\nprint('defined', x)",
    )
    expect()(cell_output(panel, 0)).to_contain_text("defined 41", timeout=60_000)
    run_cell(page, panel, 1, "gen = (i * 10 for i in range(3))\nprint('gen ready')")
    expect()(cell_output(panel, 1)).to_contain_text("gen ready", timeout=60_000)
    expect()(page.locator("#jp-main-statusbar")).to_contain_text("Idle")

    button = pause_button(panel)
    expect_enabled(button)
    expect()(button).to_have_text("Pause")
    expect()(button).to_have_attribute("title", re.compile("checkpoint of every kernel"))
    shot(page, "01-running")

    page.evaluate(RECORD_STATES)
    button.click()
    expect()(status).to_have_attribute("data-state", "paused", timeout=SLOW)
    expect()(status).to_have_text(re.compile("Paused"))
    assert "checkpoint" in (status.get_attribute("title") or "").lower()
    # The button turned into Resume.
    expect()(button).to_have_text("Resume")
    expect_enabled(button)
    page.wait_for_timeout(800)  # the "Paused" toast slides in
    shot(page, "02-paused")
    states = page.evaluate("window.__pauseStates")
    assert states[0] == "running" and states[-1] == "paused", states
    assert "checkpointing" in states, states  # the state went through the checkpoint
    server = lab.pause_status()
    assert server["state"] == "paused", server
    assert server["last_checkpoint"], server

    page.evaluate(RECORD_STATES)
    button.click()
    expect()(status).to_have_attribute("data-state", "ready", timeout=SLOW)
    expect()(status).to_have_text("Restored from checkpoint")
    states = page.evaluate("window.__pauseStates")
    assert states[0] == "paused" and states[-1] == "ready", states
    assert set(states) & {"resuming", "verifying", "restoring"}, states

    # The notification offers the report; the report says what came back and how.
    toast = page.locator(".Toastify__toast", has_text="restored from checkpoint")
    expect()(toast).to_contain_text("1 variable did not come back", timeout=30_000)
    expect()(toast).to_be_visible(timeout=30_000)
    page.wait_for_timeout(800)  # let the toast finish sliding in before the screenshot
    shot(page, "03-resumed-notification")
    toast.get_by_role("button", name="Show report").click()
    dialog = page.locator(".jp-Dialog .jp-PauseReport")
    expect()(dialog).to_be_visible()
    expect()(dialog).to_contain_text("restored from checkpoint")
    restored = dialog.locator(".jp-PauseReport-group[data-group='restored']")
    for name in ("x", "names", "arr"):
        expect()(restored).to_contain_text(name)
    expect()(dialog).to_contain_text("Resume request → kernel usable")
    recomputable = dialog.locator(".jp-PauseReport-group[data-group='recomputable']")
    expect()(recomputable).to_contain_text("gen")
    shot(page, "04-report")
    recomputable.get_by_role("button", name=re.compile("Re-run the cells that made gen")).click()
    expect()(dialog.locator(".jp-PauseReport-result")).to_contain_text(
        "Recomputed: gen", timeout=60_000
    )
    expect()(dialog.locator(".jp-PauseReport-group[data-group='recomputed']")).to_contain_text(
        "gen"
    )
    expect()(recomputable).to_have_count(0)
    shot(page, "04b-recomputed")
    page.locator(".jp-Dialog").get_by_role("button", name="Close").click()
    expect()(page.locator(".jp-Dialog")).to_have_count(0)

    # The restored kernel has the variables.
    expect()(button).to_have_text("Pause")
    run_cell(page, panel, 2, "print(x + 1, names, int(arr.sum()))")
    expect()(cell_output(panel, 2)).to_contain_text("42 ['a', 'b'] 10", timeout=60_000)
    run_cell(page, panel, 3, "print('next', next(gen))")
    expect()(cell_output(panel, 3)).to_contain_text("next 0", timeout=60_000)
    shot(page, "05-after-resume")
    # The tab is back on the restored kernel, not on a second session or kernel of its own.
    sessions = [s for s in lab.api("GET", "api/sessions") if s["path"] == "analysis.ipynb"]
    assert len(sessions) == 1, sessions
    assert [k["id"] for k in lab.api("GET", "api/kernels")] == [sessions[0]["kernel"]["id"]]


def test_button_disabled_while_cell_runs(lab: LabServer, page) -> None:
    lab.write_notebook("busy.ipynb", "")
    panel = open_notebook(page, lab, "busy.ipynb")
    button = pause_button(panel)
    expect_enabled(button)

    # The cell runs until the test releases it: the checks below never race its end.
    release = lab.root / "release-busy"
    run_cell(page, panel, 0, "import os, time\nwhile not os.path.exists("
             f"{str(release)!r}):\n    time.sleep(0.05)\nprint('slept')")
    expect_enabled(button, False, timeout=30_000)
    expect()(button).to_have_attribute("title", re.compile(r"running in busy\.ipynb"))
    shot(page, "06-busy-disabled")
    # The palette command follows the same rule.
    page.keyboard.press("ControlOrMeta+Shift+c")
    page.keyboard.insert_text("Pause Workspace")
    item = page.locator(".lm-CommandPalette-item", has_text="Pause Workspace")
    expect()(item).to_have_class(re.compile("lm-mod-disabled"))
    page.keyboard.press("Escape")

    release.touch()
    expect()(cell_output(panel, 0)).to_contain_text("slept", timeout=30_000)
    expect_enabled(button, timeout=10_000)


def test_failed_pause_shows_reason(lab_factory, page) -> None:
    """A pause the server refuses (a kernel busy past busy_timeout): the UI says why, and the
    kernel keeps its state. The button is disabled while a cell runs, so the pause comes from
    outside the page, as `jupyter pause`, `%pause` elsewhere or the idle policy would send it."""
    # Dark theme here, so the screenshots show both themes use the theme's colours.
    lab = lab_factory(
        "--PauseApp.busy_timeout=1",
        settings={"@jupyterlab/apputils-extension/themes": {"theme": "JupyterLab Dark"}},
    )
    lab.write_notebook("fails.ipynb", "", "", "")
    panel = open_notebook(page, lab, "fails.ipynb")
    run_cell(page, panel, 0, "y = 7\nprint('y set')")
    expect()(cell_output(panel, 0)).to_contain_text("y set", timeout=60_000)
    button = pause_button(panel)
    expect_enabled(button)

    run_cell(page, panel, 1, "import time\ntime.sleep(60)")
    expect_enabled(button, False, timeout=10_000)
    lab.api("POST", "jupyter-pause/api/pause", {"trigger": "api", "interrupt": False})
    status = status_item(page)
    expect()(status).to_have_attribute("data-state", "failed", timeout=SLOW)
    expect()(status).to_have_text("Pause failed")
    server = lab.pause_status()
    reason = server["reason"]
    assert "fails.ipynb" in reason, server
    assert reason in (status.get_attribute("title") or "")
    toast = page.locator(".Toastify__toast", has_text="Pause failed")
    expect()(toast).to_be_visible(timeout=10_000)
    expect()(toast).to_contain_text("fails.ipynb")
    page.wait_for_timeout(800)
    shot(page, "07-pause-failed")

    # Keyboard: the status item is focusable and Enter opens the details with the reason.
    status.focus()
    page.keyboard.press("Enter")
    dialog = page.locator(".jp-Dialog .jp-PauseReport")
    expect()(dialog).to_contain_text(reason)
    if server.get("hint"):
        expect()(dialog).to_contain_text(server["hint"])
    shot(page, "08-failed-details")
    page.keyboard.press("Escape")
    expect()(page.locator(".jp-Dialog")).to_have_count(0)

    # Nothing was lost: interrupt the sleep; the kernel still has y; Pause is offered again.
    panel.locator(".jp-Cell").nth(1).click()
    page.keyboard.press("Escape")
    page.keyboard.press("i")
    page.keyboard.press("i")
    expect_enabled(button, timeout=30_000)
    run_cell(page, panel, 2, "print(y * 6)")
    expect()(cell_output(panel, 2)).to_contain_text("42", timeout=60_000)
    expect()(button).to_have_text("Pause")


def test_failed_pause_unwritable_store(lab_factory, page, tmp_path) -> None:
    """The configured checkpoint store cannot be written (its parent is a regular file): Pause
    fails with a reason naming the store, nothing is written elsewhere, the kernel keeps its
    variables, and Pause is offered again."""
    blocker = tmp_path / "afile"
    blocker.write_text("a regular file where a directory should be")
    store = blocker / "store"
    lab = lab_factory(f"--PauseApp.store_url={store}")
    lab.write_notebook("store.ipynb", "", "")
    panel = open_notebook(page, lab, "store.ipynb")
    run_cell(page, panel, 0, "y = 7\nprint('y set')")
    expect()(cell_output(panel, 0)).to_contain_text("y set", timeout=60_000)
    button = pause_button(panel)
    expect_enabled(button)
    button.click()
    status = status_item(page)
    expect()(status).to_have_attribute("data-state", "failed", timeout=SLOW)
    expect()(status).to_have_text("Pause failed")
    server = lab.pause_status()
    assert str(store) in server["reason"] and "store.ipynb" in server["reason"], server
    assert server["hint"].startswith("Your kernels are untouched"), server
    assert server["last_checkpoint"] is None and len(server["kernels"]) == 1, server
    toast = page.locator(".Toastify__toast", has_text="Pause failed")
    expect()(toast).to_contain_text("checkpoint store", timeout=10_000)  # long: truncated
    assert server["reason"] in (status.get_attribute("title") or "")
    page.wait_for_timeout(800)
    shot(page, "07b-pause-failed-store")
    # No other store got the checkpoint (neither the default one nor another directory).
    assert not list(lab.home.rglob("manifests")), list(lab.home.rglob("manifests"))
    expect()(button).to_have_text("Pause")
    run_cell(page, panel, 1, "print(y * 6)")
    expect()(cell_output(panel, 1)).to_contain_text("42", timeout=60_000)


def test_commands_menu_checkpoint_and_restore(lab_factory, page) -> None:
    """Kernel menu > Pause and Resume; Checkpoint Now and Restore from Checkpoint run the
    magics in the current kernel and report in a notification. Autosave is off here: %restore
    loads the newest checkpoint, which would otherwise be the autosave after `z = 2`."""
    lab = lab_factory("--PauseApp.autosave=False")
    lab.write_notebook("cmds.ipynb", "", "", "")
    panel = open_notebook(page, lab, "cmds.ipynb")
    run_cell(page, panel, 0, "z = 1\nprint('z is', z)")
    expect()(cell_output(panel, 0)).to_contain_text("z is 1", timeout=60_000)
    expect()(page.locator("#jp-main-statusbar")).to_contain_text("Idle")

    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text="Pause and Resume").hover()
    submenu = page.locator(".lm-Menu").last
    for label in (
        "Pause Workspace",
        "Resume Workspace",
        "Checkpoint Now",
        "Restore from Checkpoint",
        "Show Pause/Resume Report",
    ):
        expect()(submenu).to_contain_text(label)
    # While running: Pause is on offer, Resume is not.
    resume_item = submenu.locator(".lm-Menu-item", has_text="Resume Workspace")
    expect()(resume_item).to_have_class(re.compile("lm-mod-disabled"))
    shot(page, "09-kernel-menu")
    submenu.locator(".lm-Menu-item", has_text="Checkpoint Now").click()
    toast = page.locator(".Toastify__toast", has_text="Checkpoint of cmds.ipynb written")
    expect()(toast).to_be_visible(timeout=60_000)
    checkpoints = lab.api("GET", "jupyter-pause/api/checkpoints")["checkpoints"]
    # The stream is the notebook's JPY_SESSION_NAME (its full path), as the server uses too.
    assert any(c["stream"].endswith("cmds.ipynb") for c in checkpoints), checkpoints

    run_cell(page, panel, 1, "z = 2\nprint('z is', z)")
    expect()(cell_output(panel, 1)).to_contain_text("z is 2", timeout=60_000)
    expect()(page.locator("#jp-main-statusbar")).to_contain_text("Idle")
    page.keyboard.press("Escape")
    page.keyboard.press("ControlOrMeta+Shift+c")
    page.keyboard.insert_text("Restore from Checkpoint")
    page.keyboard.press("Enter")
    dialog = page.locator(".jp-Dialog")
    expect()(dialog).to_contain_text("Variables with the same names are replaced")
    shot(page, "10-restore-confirm")
    dialog.get_by_role("button", name="Restore").click()
    restored = page.locator(".Toastify__toast", has_text="Restored cmds.ipynb")
    expect()(restored).to_be_visible(timeout=60_000)
    run_cell(page, panel, 2, "print('z is', z)")
    expect()(cell_output(panel, 2)).to_contain_text("z is 1", timeout=60_000)


def test_cells_run_while_paused_or_resuming_never_start_a_kernel(lab: LabServer, page) -> None:
    """A cell run while paused starts no kernel (it would hold the freed accelerator) and says
    to resume; one run right after Resume waits and then runs on the restored kernel.

    Without the hold, JupyterLab's cell executor calls SessionContext.startKernel(), whose
    _changeKernel() POSTs a session under a temporary path and, on completion, shuts down the
    session the notebook adopted meanwhile: the restored kernel (seen as `x` undefined)."""
    lab.write_notebook("hold.ipynb", "", "", "")
    panel = open_notebook(page, lab, "hold.ipynb")
    status = status_item(page)
    run_cell(page, panel, 0, "x = 41\nprint('set', x)")
    expect()(cell_output(panel, 0)).to_contain_text("set 41", timeout=60_000)

    button = pause_button(panel)
    expect_enabled(button)
    button.click()
    expect()(status).to_have_attribute("data-state", "paused", timeout=SLOW)
    expect()(kernel_name(panel)).to_have_text("No Kernel", timeout=30_000)

    run_cell(page, panel, 1, "print('while paused')", started=False)
    notice = page.locator(".Toastify__toast", has_text="the cell did not run")
    expect()(notice).to_be_visible(timeout=30_000)
    assert lab.api("GET", "api/kernels") == []
    expect()(cell_output(panel, 1)).to_have_count(0)
    expect()(page.locator(".jp-Dialog")).to_have_count(0)  # no "Select Kernel" dialog either

    expect()(button).to_have_text("Resume")
    button.click()
    # At once, before the resume finishes and before the tab is reconnected.
    run_cell(page, panel, 2, "print(x + 1)", started=False)
    expect()(status).to_have_attribute("data-state", "ready", timeout=SLOW)
    expect()(cell_output(panel, 2)).to_contain_text("42", timeout=60_000)
    sessions = [s for s in lab.api("GET", "api/sessions") if s["path"] == "hold.ipynb"]
    assert len(sessions) == 1, sessions
    assert [k["id"] for k in lab.api("GET", "api/kernels")] == [sessions[0]["kernel"]["id"]]


def test_a_paused_notebook_lets_its_stopped_kernel_go_although_session_reads_fail(
        lab: LabServer, page) -> None:
    """After a pause the notebook must let go of the stopped kernel's session ("No Kernel"):
    a cell run then is held, not executed on a dead kernel's connection.
    JupyterLab's SessionManager.refreshRunning() resolves even when its read fails, leaving
    running() on the old list, and its poll then backs off (lumino's Poll: the next read
    after 10–30 s, growing); so the first reads after the pause fail here, as a busy server
    or a dropped connection makes them fail."""
    lab.write_notebook("reads.ipynb", "")
    panel = open_notebook(page, lab, "reads.ipynb")
    status = status_item(page)
    run_cell(page, panel, 0, "x = 1")
    button = pause_button(panel)
    expect_enabled(button)

    failed: list[str] = []

    def paused() -> bool:
        try:
            return lab.pause_status()["state"] == "paused"
        except Exception:  # noqa: BLE001 - the request is answered either way
            return False

    def sessions(route) -> None:
        # the first three reads once the server has paused: the ones that follow the pause
        if route.request.method == "GET" and len(failed) < 3 and paused():
            failed.append(route.request.url)
            route.fulfill(status=503, body="busy")
        else:
            route.continue_()

    page.route(re.compile(r"/api/sessions(\?|$)"), sessions)
    button.click()
    expect()(status).to_have_attribute("data-state", "paused", timeout=SLOW)
    expect()(kernel_name(panel)).to_have_text("No Kernel", timeout=12_000)
    # the reads after the pause did fail (the last ones may come after the session went)
    deadline = time.monotonic() + 10
    while len(failed) < 3:
        assert time.monotonic() < deadline, failed
        page.wait_for_timeout(100)


def test_a_cell_run_right_after_resume_runs_although_the_page_still_holds_the_stopped_kernel(
        lab: LabServer, page) -> None:
    """JupyterLab drops a stopped kernel's session only at its next session poll (10 s), so a
    quick Pause then Resume leaves the notebook holding the stopped kernel's connection. The cell
    executor then executes on it, the next poll disposes it, and the execution is cancelled
    without a word: the cell does not run. Here the page's session reads are held from before
    the pause until the cell run, which makes that window certain instead of a matter of timing;
    the run must wait for the resume and then print from the restored kernel."""
    lab.write_notebook("quick.ipynb", "", "")
    panel = open_notebook(page, lab, "quick.ipynb")
    status = status_item(page)
    run_cell(page, panel, 0, "x = 41\nprint('set', x)")
    expect()(cell_output(panel, 0)).to_contain_text("set 41", timeout=60_000)

    held: list = []
    holding = {"on": True}

    def sessions(route) -> None:
        if holding["on"] and route.request.method == "GET":
            held.append(route)  # answered below, once the cell run is under way
        else:
            route.continue_()

    page.route(re.compile(r"/api/sessions(\?|$)"), sessions)
    button = pause_button(panel)
    expect_enabled(button)
    button.click()
    expect()(status).to_have_attribute("data-state", "paused", timeout=SLOW)
    expect()(button).to_have_text("Resume")
    expect_enabled(button)
    button.click()
    run_cell(page, panel, 1, "print(x + 1)", started=False)
    waiting = page.locator(".Toastify__toast", has_text="The cell will run when the workspace")
    expect()(waiting).to_be_visible(timeout=30_000)
    holding["on"] = False
    for route in held:
        route.continue_()
    expect()(status).to_have_attribute("data-state", "ready", timeout=SLOW)
    expect()(cell_output(panel, 1)).to_contain_text("42", timeout=60_000)
    sessions_now = [s for s in lab.api("GET", "api/sessions") if s["path"] == "quick.ipynb"]
    assert len(sessions_now) == 1, sessions_now
    assert [k["id"] for k in lab.api("GET", "api/kernels")] == [sessions_now[0]["kernel"]["id"]]
