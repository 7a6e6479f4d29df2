"""Real browser: Pause with a kernel that cannot be checkpointed (the echo wrapper kernel beside
a Python notebook) asks "Pause anyway?"; Cancel changes nothing, Pause anyway pauses and the
echo kernel's state is named as not saved; Resume brings the Python variables back."""

from __future__ import annotations

import re

import pytest

from tests.server.echo_kernel import ECHO, install_kernelspecs

from .labserver import LabServer, needs_chromium
from .test_ui import SLOW, cell_output, expect, open_notebook, pause_button, run_cell, status_item

pytestmark = [pytest.mark.e2e, needs_chromium]


def test_pause_anyway_dialog_cancel_then_pause_anyway(lab: LabServer, page) -> None:
    install_kernelspecs(lab.home / "data" / "kernels")
    lab.write_notebook("notes.ipynb")
    echo = lab.api("POST", "api/sessions", {"path": "notes.ipynb", "name": "notes.ipynb",
                                            "type": "notebook", "kernel": {"name": ECHO}})
    echo_id = echo["kernel"]["id"]
    lab.write_notebook("model.ipynb", "", "")
    panel = open_notebook(page, lab, "model.ipynb")
    status = status_item(page)
    expect()(status).to_have_attribute("data-state", "running", timeout=30_000)
    run_cell(page, panel, 0, "weights = [1.5, 2.5]\nprint('defined')")
    expect()(cell_output(panel, 0)).to_contain_text("defined", timeout=60_000)
    expect()(page.locator("#jp-main-statusbar")).to_contain_text("Idle")

    button = pause_button(panel)
    button.click()
    dialog = page.locator(".jp-Dialog")
    expect_dialog_or_say_why(page, lab, dialog)
    body = dialog.locator(".jp-PauseAnyway")
    expect()(body).to_contain_text("will be lost")
    expect()(body).to_contain_text(f"notes.ipynb ({ECHO})")
    expect()(body).to_contain_text("Python kernels")
    # Cancel is the default: Enter would not lose anything.
    cancel = dialog.locator(".jp-Dialog-button", has_text="Cancel")
    expect()(cancel).to_have_class(re.compile("jp-mod-reject"))
    cancel.click()
    expect()(dialog).to_have_count(0)
    # Nothing changed: still running, no pause journaled, the echo kernel still runs.
    expect()(status).to_have_attribute("data-state", "running")
    st = lab.pause_status()
    assert st["state"] == "running" and st["flight"] is None, st
    assert echo_id in {k["id"] for k in st["kernels"]}, st

    button.click()
    dialog = page.locator(".jp-Dialog")
    expect_dialog_or_say_why(page, lab, dialog)
    dialog.locator(".jp-Dialog-button", has_text="Pause anyway").click()
    expect()(status).to_have_attribute("data-state", "paused", timeout=SLOW)
    st = lab.pause_status()
    lost = {c["path"]: c for c in st["resume_from"]["checkpoints"]}
    assert lost["notes.ipynb"]["state_not_saved"], st
    assert lost["model.ipynb"]["checkpoint_id"] and not lost["model.ipynb"]["state_not_saved"]

    expect()(button).to_have_text("Resume")
    button.click()
    expect()(status).to_have_attribute("data-state", "ready", timeout=SLOW)
    report = {k["path"]: k for k in lab.pause_status()["last_report"]["kernels"]}
    assert report["model.ipynb"]["outcome"] == "restored", report
    assert report["notes.ipynb"]["outcome"] == "fresh", report
    assert report["notes.ipynb"]["reason"].startswith("state not saved: "), report
    run_cell(page, panel, 1, "print(weights)")
    expect()(cell_output(panel, 1)).to_contain_text("[1.5, 2.5]", timeout=60_000)


def expect_dialog_or_say_why(page, lab: LabServer, dialog) -> None:
    """Wait for "Pause anyway?"; when it does not come, fail with what the page and the server
    said instead (a notification, the button's tooltip, the state and the last report)."""
    try:
        expect()(dialog).to_contain_text("Pause anyway?", timeout=60_000)
    except AssertionError as e:
        toasts = page.locator(".Toastify__toast").all_inner_texts()
        tooltip = page.locator(".jp-PauseButton jp-button").first.get_attribute("title")
        st = lab.pause_status()
        said = {k: st.get(k) for k in ("state", "flight", "reason", "last_report")}
        raise AssertionError(f"no dialog; notifications {toasts}, button {tooltip!r}, "
                             f"status {said}") from e
