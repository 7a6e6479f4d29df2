"""Real-browser tests of what a person sees around kernels: every path that starts a kernel is
held while paused (and says why), the status follows the kernel after a restart or a death,
Restore from Checkpoint needs a checkpoint, and the words fit a machine without an accelerator.
Chromium + a real `jupyter lab` + real kernels."""

from __future__ import annotations

import re
import time

import pytest

from .labserver import LabServer, needs_chromium, shot
from .test_ui import (
    SLOW,
    cell_output,
    expect,
    expect_enabled,
    kernel_name,
    open_notebook,
    pause_button,
    run_cell,
    status_item,
)

pytestmark = [pytest.mark.e2e, needs_chromium]

HELD = re.compile(r"The workspace is paused .*: resume it to start a kernel")


def menu_item(page, menu: str, label: str, submenu: str | None = None):
    """Open the menu bar's `menu` (and `submenu`) and return the item labelled `label`."""
    for _ in range(3):  # a submenu, its menu
        if page.locator(".lm-Menu").count() == 0:
            break
        page.keyboard.press("Escape")
    expect()(page.locator(".lm-Menu")).to_have_count(0)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
    if submenu:
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{submenu}$")).hover()
    return page.locator(".lm-Menu").last.locator(
        ".lm-Menu-item", has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{label}"))
    )


def menu_item_settles(page, menu: str, label: str, check, submenu: str | None = None,
                      timeout: float = 20.0):
    """Reopen the menu until `check(item)` holds: an open menu does not re-render when its
    commands change, so each look is a fresh opening. Returns the item (menu left open); fails
    after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        item = menu_item(page, menu, label, submenu).first
        item.wait_for()
        if check(item):
            return item
        if time.monotonic() > deadline:
            raise AssertionError(f"{menu} > {label}: {check.__name__} not within {timeout} s")
        page.keyboard.press("Escape")
        page.wait_for_timeout(250)


def enabled(item) -> bool:
    return "lm-mod-disabled" not in (item.get_attribute("class") or "")


def no_kernels(lab: LabServer) -> None:
    assert lab.api("GET", "api/kernels") == [], lab.api("GET", "api/kernels")


def pause_and_wait(page, panel) -> None:
    button = pause_button(panel)
    expect_enabled(button)
    button.click()
    expect()(status_item(page)).to_have_attribute("data-state", "paused", timeout=SLOW)
    expect()(kernel_name(panel)).to_have_text("No Kernel", timeout=30_000)


def held_notice(page):
    return page.locator(".Toastify__toast", has_text="resume it to start a kernel")


def test_every_kernel_start_path_is_held_while_paused(lab: LabServer, page) -> None:
    """Kernel > Restart / Change Kernel / Reconnect, File > New > Console, the launcher's Console
    card, the toolbar's kernel selector and the restart shortcut: disabled with the reason, or
    refused with one line, and no kernel starts. Once resumed they all work again."""
    lab.write_notebook("held.ipynb", "", "", "")
    panel = open_notebook(page, lab, "held.ipynb")
    run_cell(page, panel, 0, "x = 41\nprint('set', x)")
    expect()(cell_output(panel, 0)).to_contain_text("set 41", timeout=60_000)
    pause_and_wait(page, panel)
    no_kernels(lab)
    # On this CPU-only machine the words say what was freed, never an accelerator.
    title = status_item(page).get_attribute("title") or ""
    assert "memory is released" in title and "accelerator" not in title, title

    # The Kernel menu: each kernel-starting item is disabled, its caption says why.
    for label in ("Restart Kernel…", "Change Kernel…", "Reconnect to Kernel",
                  "Restart Kernel and Clear Outputs", "Restart Kernel and Run All"):
        item = menu_item(page, "Kernel", label)
        expect()(item.first).to_have_class(re.compile("lm-mod-disabled"))
    # Menus show no captions: the label says it.
    item = menu_item(page, "Kernel", "Restart Kernel")
    expect()(item.first).to_have_text(re.compile(r"^Restart Kernel… \(paused: resume first\)"))
    shot(page, "12-paused-kernel-menu-held")
    console = menu_item(page, "File", "Console", submenu="New")
    expect()(console.first).to_have_class(re.compile("lm-mod-disabled"))
    page.keyboard.press("Escape")
    page.keyboard.press("Escape")

    # The restart shortcut (0, 0 in command mode): a disabled command's key binding does
    # nothing (Lumino checks isEnabled first), so no "Restart Kernel?" and no kernel.
    panel.locator(".jp-Cell").nth(1).click()
    page.keyboard.press("Escape")
    page.keyboard.press("0")
    page.keyboard.press("0")
    page.wait_for_timeout(1_000)  # what a restart would take to show its dialog or POST
    expect()(page.locator(".jp-Dialog")).to_have_count(0)
    no_kernels(lab)

    # The toolbar's kernel selector: no "Select Kernel" dialog, the same line.
    panel.locator(".jp-Toolbar .jp-KernelName").first.click()
    expect()(page.locator(".jp-Dialog")).to_have_count(0)
    expect()(held_notice(page).last).to_be_visible(timeout=10_000)

    # The launcher's Console card: no console opens.
    page.keyboard.press("ControlOrMeta+Shift+c")
    page.keyboard.insert_text("New Launcher")
    page.keyboard.press("Enter")
    card = page.locator(".jp-LauncherCard[data-category='Console']").first
    expect()(card).to_be_visible(timeout=30_000)
    shot(page, "13-paused-launcher")
    card.click()
    expect()(held_notice(page).last).to_be_visible(timeout=10_000)
    expect()(page.locator(".jp-ConsolePanel")).to_have_count(0)
    shot(page, "14-paused-start-refused")
    no_kernels(lab)
    assert list(lab.api("GET", "api/sessions")) == []

    # Resumed: the notice is gone and the paths work again (the restart shortcut asks again).
    page.get_by_role("tab", name=re.compile("held.ipynb")).click()
    expect()(pause_button(panel)).to_have_text("Resume")
    pause_button(panel).click()
    expect()(status_item(page)).to_have_attribute("data-state", "ready", timeout=SLOW)
    expect()(held_notice(page)).to_have_count(0, timeout=10_000)
    item = menu_item_settles(page, "Kernel", "Restart Kernel…", enabled)
    expect()(item).not_to_have_class(re.compile("lm-mod-disabled"))
    page.keyboard.press("Escape")
    run_cell(page, panel, 2, "print(x + 1)")
    expect()(cell_output(panel, 2)).to_contain_text("42", timeout=60_000)


def test_a_cell_run_while_paused_its_notice_goes_when_resumed(lab: LabServer, page) -> None:
    """"The workspace is paused, so the cell did not run [Resume]": Resume in it resumes, and
    the notice is gone once the resume is done."""
    lab.write_notebook("toast.ipynb", "", "")
    panel = open_notebook(page, lab, "toast.ipynb")
    pause_and_wait(page, panel)
    run_cell(page, panel, 0, "print('while paused')", started=False)
    notice = page.locator(".Toastify__toast", has_text="the cell did not run")
    expect()(notice).to_be_visible(timeout=30_000)
    # Resume from the page's own button (the notice's Resume would close it by itself).
    pause_button(panel).click()
    expect()(status_item(page)).to_have_attribute("data-state", "ready", timeout=SLOW)
    # it goes when the held cell's notebook is reconnected to its restored kernel, which
    # follows "ready" by as long as the reconnect takes on a busy machine
    expect()(notice).to_have_count(0, timeout=60_000)


def test_status_follows_the_kernel_after_a_restart_and_a_kill(lab: LabServer, page) -> None:
    """After a resume restored the notebook, a Kernel > Restart and then a SIGKILL of the kernel
    each empty the kernel: the status stops saying "Restored from checkpoint" and says the
    state is gone, with what can bring it back; a cell run since makes it "running" again."""
    lab.write_notebook("dies.ipynb", "", "", "", "")
    panel = open_notebook(page, lab, "dies.ipynb")
    run_cell(page, panel, 0, "x = 41\nprint('set', x)")
    expect()(cell_output(panel, 0)).to_contain_text("set 41", timeout=60_000)
    pause_and_wait(page, panel)
    pause_button(panel).click()
    status = status_item(page)
    expect()(status).to_have_text("Restored from checkpoint", timeout=SLOW)
    expect()(pause_button(panel)).to_have_text("Pause")
    expect()(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=60_000)

    # Kernel > Restart Kernel (with JupyterLab's confirmation), once the hold is let go (when
    # the notebook follows its restored kernel).
    menu_item_settles(page, "Kernel", "Restart Kernel…", enabled).click()
    page.locator(".jp-Dialog").get_by_role("button", name="Confirm Kernel Restart").click()
    expect()(status).to_have_text("Kernel restarted: state gone", timeout=30_000)
    title = status.get_attribute("title") or ""
    assert "dies.ipynb: kernel restarted: its state is gone" in title, title
    assert re.search(r"restore the (checkpoint|state) of \d\d:\d\d", title), title
    expect()(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=60_000)
    # The resume's "restored from checkpoint" notification went with it.
    expect()(page.locator(".Toastify__toast", has_text="restored from checkpoint")).to_have_count(0)
    shot(page, "15-kernel-restarted")
    # The report's current state says the same, not "Restored from checkpoint".
    status.click()
    dialog = page.locator(".jp-Dialog .jp-PauseReport")
    expect()(dialog.locator(".jp-PauseReport-stateLabel")).to_have_text(
        "Kernel restarted: state gone")
    page.keyboard.press("Escape")

    run_cell(page, panel, 1, "print('fresh', 'x' in globals())")
    expect()(cell_output(panel, 1)).to_contain_text("fresh False", timeout=60_000)
    expect()(status).to_have_text("Workspace running", timeout=10_000)

    # SIGKILL (as the OOM killer sends it): JupyterLab restarts the kernel; the status says so.
    run_cell(page, panel, 2, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
             started=False)
    expect()(status).to_have_text(re.compile(r"Kernel (died|restarted): state gone"),
                                  timeout=60_000)
    assert "its state is gone" in (status.get_attribute("title") or "")
    page.wait_for_timeout(500)
    shot(page, "16-kernel-killed")


def test_restore_from_checkpoint_needs_a_checkpoint(lab: LabServer, page) -> None:
    """Without a checkpoint of the notebook, Restore from Checkpoint is disabled and says why;
    once Checkpoint Now wrote one it is enabled."""
    lab.write_notebook("nocp.ipynb", "", "")
    panel = open_notebook(page, lab, "nocp.ipynb")
    run_cell(page, panel, 0, "z = 1")
    expect()(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=60_000)
    item = menu_item(page, "Kernel", "Restore from Checkpoint", submenu="Pause and Resume")
    expect()(item.first).to_have_class(re.compile("lm-mod-disabled"), timeout=15_000)
    expect()(item.first).to_have_text("Restore from Checkpoint (no checkpoint yet)")
    shot(page, "17-restore-needs-checkpoint")
    checkpoint = menu_item(page, "Kernel", "Checkpoint Now", submenu="Pause and Resume")
    checkpoint.first.click()
    expect()(page.locator(".Toastify__toast", has_text="Checkpoint of nocp.ipynb written")
             ).to_be_visible(timeout=60_000)
    # The store's listing is re-read after the checkpoint.
    item = menu_item_settles(page, "Kernel", "Restore from Checkpoint", enabled,
                             submenu="Pause and Resume")
    expect()(item).not_to_have_class(re.compile("lm-mod-disabled"))
    expect()(item).to_have_text("Restore from Checkpoint")
    page.keyboard.press("Escape")


def test_a_killed_kernel_offers_its_saved_state_and_restore_brings_it_back(
        lab_factory, page) -> None:
    """SIGKILL of a kernel whose state was autosaved: the status says the state is gone and a
    notification offers it back (the server's `status.offers`); Restore brings the variables
    into the new kernel."""
    lab = lab_factory("--PauseApp.autosave=True")  # the test servers' default is off
    lab.write_notebook("offer.ipynb", "", "", "")
    panel = open_notebook(page, lab, "offer.ipynb")
    assert lab.pause_status()["offers"] == []
    run_cell(page, panel, 0, "y = 7\nprint('y set')")
    expect()(cell_output(panel, 0)).to_contain_text("y set", timeout=60_000)
    deadline = time.monotonic() + 60
    while not [c for c in lab.api("GET", "jupyter-pause/api/checkpoints")["checkpoints"]
               if str(c.get("stream", "")).endswith("offer.ipynb")]:
        assert time.monotonic() < deadline, "no autosave of offer.ipynb was written"
        time.sleep(0.5)

    run_cell(page, panel, 1, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
             started=False)
    offer = page.locator(".Toastify__toast", has_text="offer.ipynb: Kernel died")
    expect()(offer).to_be_visible(timeout=60_000)
    expect()(offer).to_contain_text(re.compile(r"restore the state of \d\d:\d\d \(\d+ variables?\)"))
    expect()(status_item(page)).to_have_text("Kernel died: state gone")
    page.wait_for_timeout(800)  # let the toast finish sliding in
    shot(page, "18-kernel-died-offer")
    dialog = page.locator(".jp-Dialog", has_text="appears to have died")
    if dialog.count():
        dialog.get_by_role("button").first.click()
    expect()(page.locator("#jp-main-statusbar")).to_contain_text("Idle", timeout=60_000)
    offer.get_by_role("button", name="Restore").click()
    expect()(page.locator(".Toastify__toast", has_text=re.compile(r"offer\.ipynb: restored \d+"))
             ).to_be_visible(timeout=60_000)
    run_cell(page, panel, 2, "print(y * 6)")
    expect()(cell_output(panel, 2)).to_contain_text("42", timeout=60_000)
    expect()(status_item(page)).to_have_text("Workspace running", timeout=30_000)


def test_words_name_an_accelerator_only_when_the_server_reports_one(lab_factory, page) -> None:
    """GET status says which accelerator the workspace holds; the UI names one only then."""
    plain = lab_factory()
    assert plain.pause_status()["accelerator"]["count"] == 0  # this test machine has no GPU
    gpu = lab_factory('--PauseApp.accelerator={"type": "nvidia-l4", "count": 1}')
    assert gpu.pause_status()["accelerator"] == {"type": "nvidia-l4", "count": 1}
    for lab, named in ((plain, False), (gpu, True)):
        lab.write_notebook("words.ipynb", "")
        panel = open_notebook(page, lab, "words.ipynb")
        item, button = status_item(page), pause_button(panel)
        expect()(item).to_have_attribute("data-state", "running")
        # Read the words once they say what Pause does: while the new kernel starts (busy) the
        # button's tooltip says a cell is running instead, in either case.
        expect_enabled(button)
        frees = "the accelerator" if named else "their memory"
        expect()(item).to_have_attribute("title", re.compile(f"free {frees}"))
        expect()(button).to_have_attribute("title", re.compile(f"^Pause: .*free {frees}"))
        title, tooltip = item.get_attribute("title") or "", button.get_attribute("title") or ""
        assert ("accelerator" in title) is named and ("accelerator" in tooltip) is named, (
            title, tooltip)


def test_a_start_the_server_refuses_is_told_in_one_line(lab: LabServer, page) -> None:
    """A path that slips through (this page has not seen the pause: its event stream and
    status reads are held back here) reaches the server, which answers 409: the page says to
    resume in one line instead of JupyterLab's "Error Starting Kernel" dialog."""
    lab.write_notebook("slip.ipynb", "")
    page.route_web_socket(re.compile(r"/api/events/subscribe"), lambda ws: None)
    open_notebook(page, lab, "slip.ipynb")
    running = lab.pause_status()
    assert running["state"] == "running", running
    page.route(re.compile(r"/jupyter-pause/api/status"),
               lambda route: route.fulfill(json=running))
    lab.api("POST", "jupyter-pause/api/pause", {"trigger": "api", "interrupt": False})
    deadline = time.monotonic() + 120
    while lab.pause_status()["state"] != "paused":
        assert time.monotonic() < deadline, lab.pause_status()
        time.sleep(0.5)
    # The page still thinks it runs; its kernel connection is gone.
    expect()(page.locator("#jp-main-statusbar")).to_contain_text(
        re.compile("No Kernel|Disconnected"), timeout=30_000)
    expect()(status_item(page)).to_have_text("Workspace running")
    # Kernel > Change Kernel… > Python 3: the server refuses the new kernel (409).
    menu_item(page, "Kernel", "Change Kernel…").first.click()
    page.locator(".jp-Dialog").get_by_role("button", name="Select Kernel").click()
    expect()(held_notice(page).last).to_be_visible(timeout=30_000)
    expect()(page.locator(".jp-Dialog", has_text="Error Starting Kernel")).to_have_count(0)
    page.wait_for_timeout(800)  # let the toast finish sliding in before the screenshot
    shot(page, "19-refused-by-server")
    no_kernels(lab)
