"""Real-browser tests of Jupyter Notebook 7 (its /notebooks page, served by the same server):
it has no status bar, so the state and the progress are in its header, next to the kernel
status, in words that do not collide with its "Last Checkpoint: … ago" (the file save); and
kernel-starting paths are held while paused there too."""

from __future__ import annotations

import re

import pytest

from .labserver import LabServer, needs_chromium, shot
from .test_ui import RECORD_STATES, SLOW, cell_output, expect, run_cell

pytestmark = [pytest.mark.e2e, needs_chromium]

pytest.importorskip("notebook", minversion="7")

# The header item, and the order of states it shows (RECORD_STATES watches .jp-PauseStatus).
HEADER = "#jp-PauseHeaderStatus"
# Notebook 7.6's own shortcuts plugin throws this on every page load, with or without this
# extension (its pluginChanged handler reads the schema of a plugin it has not loaded).
IGNORED_PAGE_ERRORS = ("Cannot read properties of undefined (reading 'schema')",)


def open_nb7(page, lab: LabServer, name: str):
    page.goto(f"{lab.url}notebooks/{name}?token={lab.token}")
    panel = page.locator(".jp-NotebookPanel")
    expect()(panel).to_have_count(1, timeout=60_000)
    expect()(page.locator(HEADER)).to_be_visible(timeout=30_000)
    # Notebook 7 shows the kernel's name in the toolbar once it is connected.
    expect()(panel.locator(".jp-KernelName").first).to_contain_text("Python", timeout=60_000)
    return panel


def button(panel):
    return panel.locator(".jp-PauseButton jp-button")


def test_notebook7_header_shows_paused_progress_and_ready(lab: LabServer, page) -> None:
    lab.write_notebook("seven.ipynb", "", "", "")
    panel = open_nb7(page, lab, "seven.ipynb")
    header = page.locator(HEADER)
    expect()(header).to_have_text("Workspace running", timeout=30_000)
    run_cell(page, panel, 0, "import numpy as np\nbig = np.ones(4_000_000)\nx = 41\nprint('set', x)")
    expect()(cell_output(panel, 0)).to_contain_text("set 41", timeout=60_000)
    # Save, so that Notebook 7 shows its own "Last Checkpoint: … ago" (the file save) next to
    # ours, which never says "checkpoint".
    page.keyboard.press("Escape")
    page.keyboard.press("ControlOrMeta+s")
    expect()(page.locator(".jp-NotebookCheckpoint")).to_contain_text("Last Checkpoint",
                                                                     timeout=30_000)
    shot(page, "20-nb7-running")

    page.evaluate(RECORD_STATES.replace(".jp-PauseStatus", HEADER))
    labels: list[str] = []
    page.expose_function("__pauseLabel", lambda text: labels.append(text))
    page.evaluate("""() => {
      const el = document.querySelector('#jp-PauseHeaderStatus .jp-PauseStatus-text');
      new MutationObserver(() => window.__pauseLabel(el.textContent))
        .observe(el, {childList: true, characterData: true, subtree: true});
    }""")
    expect()(button(panel)).to_have_attribute("aria-disabled", "false", timeout=30_000)
    button(panel).click()
    expect()(header).to_have_attribute("data-state", "paused", timeout=SLOW)
    expect()(header).to_have_text("Paused")
    title = header.get_attribute("title") or ""
    assert "memory is released" in title and "accelerator" not in title, title
    states = page.evaluate("window.__pauseStates")
    assert "checkpointing" in states, states
    assert any(re.fullmatch(r"Saving state( \d+%)?", t) for t in labels), labels
    assert not [t for t in labels if "heckpoint" in t], labels
    page.wait_for_timeout(800)  # the "Paused" toast slides in
    shot(page, "21-nb7-paused")

    # Held here too: Kernel > Restart Kernel is disabled with the reason in its label.
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Kernel$")).click()
    restart = page.locator(".lm-Menu .lm-Menu-item", has_text=re.compile(r"^Restart Kernel…"))
    expect()(restart.first).to_have_class(re.compile("lm-mod-disabled"))
    expect()(restart.first).to_contain_text("(paused: resume first)")
    shot(page, "22-nb7-kernel-menu-held")
    page.keyboard.press("Escape")
    assert lab.api("GET", "api/kernels") == []

    expect()(button(panel)).to_have_text("Resume")
    button(panel).click()
    expect()(header).to_have_attribute("data-state", "ready", timeout=SLOW)
    expect()(header).to_have_text("State restored")
    run_cell(page, panel, 1, "print(x + 1, big.shape)")
    expect()(cell_output(panel, 1)).to_contain_text("42 (4000000,)", timeout=60_000)
    page.wait_for_timeout(800)
    shot(page, "23-nb7-restored")
    # The header opens the same details as Lab's status bar item.
    header.click()
    dialog = page.locator(".jp-Dialog .jp-PauseReport")
    expect()(dialog).to_contain_text("seven.ipynb: its variables were restored into a new kernel")
    shot(page, "24-nb7-report")
