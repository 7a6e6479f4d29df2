"""Real-browser test of the auto-pause announcement: the idle policy announces a pause, the page
says when it will happen with Cancel, and Cancel (or coming back to work) keeps the workspace
running."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from tests.harness import wait_for

from .labserver import LabServer, needs_chromium, shot
from .test_ui import cell_output, expect, open_notebook, run_cell

pytestmark = [pytest.mark.e2e, needs_chromium]

# Seconds without kernel activity before the policy acts. It counts from the server's start
# until a kernel runs, and acts without a grace period while no page is connected: long
# enough for the page to load and connect.
IDLE_AFTER = 25
# Checked every second; a long grace period so that nothing is paused while the test runs.
POLICY_ARGS = (
    "--IdlePolicy.enabled=True",
    "--IdlePolicy.profile=gpu-experiment",
    "--IdlePolicy.interval=1",
    "--IdlePolicy.profiles="
    + json.dumps({"gpu-experiment": {"idle_after": IDLE_AFTER, "grace_period": 300}}),
)
ANNOUNCED = re.compile(
    r"This workspace will pause at (\d\d):(\d\d) because it has been idle for 25 s "
    r"\(profile gpu-experiment\)"
)


def journal(lab: LabServer) -> list[dict]:
    path = lab.home / "state" / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def announcement(page):
    return page.locator(".Toastify__toast", has_text="This workspace will pause at")


def test_auto_pause_announced_and_cancelled(lab_factory, page) -> None:
    lab = lab_factory(*POLICY_ARGS)
    lab.write_notebook("idle.ipynb", "", "", "")
    # The kernel starts now (its start-up is activity); the page joins this session.
    lab.api("POST", "api/sessions", {"path": "idle.ipynb", "name": "idle.ipynb",
                                     "type": "notebook", "kernel": {"name": "python3"}})
    panel = open_notebook(page, lab, "idle.ipynb")
    run_cell(page, panel, 0, "keep = 123\nprint('kept', keep)")
    expect()(cell_output(panel, 0)).to_contain_text("kept 123", timeout=60_000)

    # Idle for IDLE_AFTER s with the page connected: announced, naming the time of the pause
    # (the browser's clock; the same machine's here, so the server's deadline in local time).
    toast = announcement(page)
    expect()(toast).to_be_visible(timeout=60_000)
    expect()(toast).to_contain_text(ANNOUNCED)
    first = toast.inner_text()
    policy = lab.api("GET", "jupyter-pause/api/policy")
    assert policy["state"] == "announced" and policy["cancellable"], policy
    assert policy["profile"]["name"] == "gpu-experiment" and 0 < policy["seconds_left"] <= 300
    hh, mm = map(int, ANNOUNCED.search(first).groups())
    at = datetime.fromisoformat(policy["deadline"].replace("Z", "+00:00")).astimezone()
    apart = (hh * 60 + mm - (at.hour * 60 + at.minute)) % (24 * 60)  # minutes, across midnight
    assert min(apart, 24 * 60 - apart) <= 1, (first, at)
    # Its text never changes while shown: an update of a toast just before its dismissal
    # brings it back in JupyterLab's react-toastify (see autopausenotice.ts).
    page.wait_for_timeout(2_100)
    assert toast.inner_text() == first, first
    shot(page, "11-auto-pause-announced")

    # Cancel: the server cancels it (journaled as by the user) and the announcement goes away.
    toast.get_by_role("button", name="Cancel").click()
    expect()(announcement(page)).to_have_count(0, timeout=10_000)
    # The page hides the toast as it sends the cancel; the journal line follows the answer.
    policy = wait_for("the policy watching again", lambda: (
        p := lab.api("GET", "jupyter-pause/api/policy"))["state"] == "watching" and p, 10)
    assert not policy["cancellable"], policy
    cancelled = wait_for("the cancel journalled", lambda: [
        e for e in journal(lab) if e["event"] == "auto_pause_cancelled"], 10)
    assert [e["by"] for e in cancelled] == ["user"], cancelled

    # Announced again an idle period later; coming back to work (a cell) cancels it too, and
    # the page hides it when the server says so (auto_pause_cancelled).
    expect()(announcement(page)).to_be_visible(timeout=60_000)
    run_cell(page, panel, 1, "print('still here', keep + 1)")
    expect()(cell_output(panel, 1)).to_contain_text("still here 124", timeout=60_000)
    try:
        expect()(announcement(page)).to_have_count(0, timeout=15_000)
    except AssertionError as e:  # say whether the server or the page kept it
        shot(page, "11-auto-pause-not-cancelled")
        raise AssertionError(
            f"{e}\nGET policy: {lab.api('GET', 'jupyter-pause/api/policy')}\njournal: "
            f"{[x for x in journal(lab) if x['event'].startswith('auto_pause')]}") from e
    def two_cancelled():
        found = [e for e in journal(lab) if e["event"] == "auto_pause_cancelled"]
        return found if len(found) >= 2 else None

    cancelled = wait_for("two cancelled auto-pauses journalled", two_cancelled, 10)
    assert [e["by"] for e in cancelled[:2]] == ["user", "activity"], cancelled

    # Nothing was paused: the same kernel runs with its variables.
    assert not any(e["event"] == "pause_requested" for e in journal(lab))
    status = lab.pause_status()
    assert status["state"] == "running" and len(status["kernels"]) == 1, status
    run_cell(page, panel, 2, "print('keep is', keep)")
    expect()(cell_output(panel, 2)).to_contain_text("keep is 123", timeout=60_000)


def test_announcement_goes_away_when_the_auto_pause_starts(lab_factory, page) -> None:
    """Nobody cancels: at the deadline the policy pauses, and the announcement disappears."""
    args = [a for a in POLICY_ARGS if not a.startswith("--IdlePolicy.profiles=")]
    lab = lab_factory(*args, "--IdlePolicy.profiles=" + json.dumps(
        {"gpu-experiment": {"idle_after": IDLE_AFTER, "grace_period": 8}}))
    lab.write_notebook("away.ipynb", "", "")
    lab.api("POST", "api/sessions", {"path": "away.ipynb", "name": "away.ipynb",
                                     "type": "notebook", "kernel": {"name": "python3"}})
    panel = open_notebook(page, lab, "away.ipynb")
    run_cell(page, panel, 0, "w = 5\nprint('w set')")
    expect()(cell_output(panel, 0)).to_contain_text("w set", timeout=60_000)

    # Under two minutes away: the time has seconds.
    toast = page.locator(".Toastify__toast", has_text=re.compile(
        r"This workspace will pause at \d\d:\d\d:\d\d because"))
    expect()(toast).to_be_visible(timeout=60_000)
    expect()(page.locator(".jp-PauseStatus")).to_have_attribute("data-state", "paused",
                                                                timeout=120_000)
    expect()(announcement(page)).to_have_count(0, timeout=10_000)
    requested = [e for e in journal(lab) if e["event"] == "pause_requested"]
    assert [e["trigger"] for e in requested] == ["idle"], requested
    assert lab.api("GET", "jupyter-pause/api/policy")["state"] == "inactive"
