"""Real-browser test of the report's order and names: the notebook the person is looking at
first, the other notebooks and consoles folded, consoles as "Console 1", ids and the mechanism
on demand."""

from __future__ import annotations

import re
import uuid

import pytest

from .labserver import LabServer, needs_chromium, shot
from .test_ui import (
    SLOW,
    cell_output,
    expect,
    expect_enabled,
    open_notebook,
    pause_button,
    run_cell,
    status_item,
)

pytestmark = [pytest.mark.e2e, needs_chromium]


def test_report_current_notebook_first_the_rest_folded(lab: LabServer, page) -> None:
    # Two other kernels: a notebook that sorts before the current one, and a console (its
    # session is named as JupyterLab names them).
    lab.write_notebook("aaa.ipynb", "")
    lab.write_notebook("zzz.ipynb", "", "")
    lab.api("POST", "api/sessions", {"path": "aaa.ipynb", "name": "aaa.ipynb",
                                     "type": "notebook", "kernel": {"name": "python3"}})
    console = f"console-1-{uuid.uuid4()}"
    lab.api("POST", "api/sessions", {"path": console, "name": "Console 1", "type": "console",
                                     "kernel": {"name": "python3"}})
    panel = open_notebook(page, lab, "zzz.ipynb")
    run_cell(page, panel, 0, "x = 41\nprint('set', x)")
    expect()(cell_output(panel, 0)).to_contain_text("set 41", timeout=60_000)
    status = status_item(page)
    expect_enabled(pause_button(panel))  # the page has read the cell's idle too
    pause_button(panel).click()
    expect()(status).to_have_attribute("data-state", "paused", timeout=SLOW)
    pause_button(panel).click()
    expect()(status).to_have_attribute("data-state", "ready", timeout=SLOW)

    status.click()
    dialog = page.locator(".jp-Dialog .jp-PauseReport")
    first = dialog.locator(":scope > .jp-PauseReport-kernel")
    expect()(first).to_have_count(1)
    expect()(first).to_have_attribute("data-path", "zzz.ipynb")
    expect()(first.locator("h4")).to_have_text("zzz.ipynb: its variables were restored into a new kernel")
    # The mechanism and the ids are behind Details, folded.
    how = first.locator(".jp-PauseReport-details")
    expect()(how.get_by_text(re.compile("^Checkpoint id: "))).to_be_hidden()
    expect()(how.get_by_text(re.compile("^How: "))).to_be_hidden()
    others = dialog.locator(".jp-PauseReport-others")
    expect()(others.locator(":scope > summary")).to_have_text("2 other notebooks and consoles")
    expect()(others.locator(".jp-PauseReport-kernel h4").first).to_be_hidden()
    shot(page, "25-report-current-first")
    others.locator(":scope > summary").click()
    titles = others.locator(":scope > .jp-PauseReport-kernel h4")
    expect()(titles).to_have_count(2)
    expect()(titles.nth(0)).to_contain_text("aaa.ipynb: ")
    expect()(titles.nth(1)).to_contain_text("Console 1: ")
    expect()(dialog).not_to_contain_text(console + ":")  # the raw session name only in Details
    how.locator("summary").click()
    expect()(how.get_by_text(re.compile("^Checkpoint id: "))).to_be_visible()
    shot(page, "26-report-folded-open")
    # The process state (random generators, working directory, ...) is folded under its own
    # summary, with what happened to each entry.
    process = first.locator(".jp-PauseReport-process")
    expect()(process.locator(":scope > summary")).to_have_text(
        re.compile(r"^Process state: \d+ of \d+ put back$"))
    process.locator(":scope > summary").click()
    expect()(process.locator("li", has_text="RNG: random")).to_contain_text("restored")
    shot(page, "27-report-process-state")
