"""No silent loss: a resume that fails for one notebook, a checkpoint that is gone,
a kernel that stops answering. Each ends in a state that says what is true and loses nothing
that still exists. Real servers and kernels; every wait is a condition with a deadline."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from server_process import Server

from tests.harness import SLOW_PICKLE, until

pytestmark = pytest.mark.timeout(300)


async def _unowned(ws):
    owned = {s["kernel"]["id"] for s in await ws.serverapp.session_manager.list_sessions()
             if s.get("kernel")}
    return [k for k in ws.serverapp.kernel_manager.list_kernel_ids() if k not in owned]


# Its unpickling kills the kernel while the marker file exists (a kernel dying mid-restore);
# only builtins in the pickle, so it loads in any fresh kernel.
DIES = """
class Dies:
    def __init__(self, marker):
        self.marker = marker
    def __reduce__(self):
        return (exec, ("import os, signal\\nif os.path.exists(%r): "
                       "os.kill(os.getpid(), signal.SIGKILL)" % self.marker,))
"""


# ------------------------------------------------------- a paused checkpoint that is gone


async def test_a_missing_checkpoint_says_so_and_a_second_resume_goes_on_without_it(
        ws, pause_dirs):
    """Before: the hint said "The checkpoint is still there: resume again to retry" (false),
    every retry failed the same way and POST pause answered 409, for ever."""
    a = (await ws.open_notebook("a.ipynb"))["kernel"]["id"]
    b = (await ws.open_notebook("b.ipynb"))["kernel"]["id"]
    await ws.run(a, "x = 41")
    await ws.run(b, "y = 'gone'")
    _, st = await ws.flight("pause", {"trigger": "manual"})
    assert st["state"] == "paused", st
    rec = {k["path"]: k for k in ws.lifecycle.state["pause"]["kernels"]}
    gone = rec["b.ipynb"]["checkpoint_id"]
    [manifest] = list((pause_dirs["store"] / "manifests").rglob(f"{gone}*"))
    manifest.unlink()

    _, st = await ws.flight("resume")
    assert st["state"] == "failed", st
    assert "b.ipynb" in st["reason"] and "missing" in st["reason"], st["reason"]
    assert "still there" not in st["hint"], st["hint"]
    assert "b.ipynb" in st["hint"] and "Resume again" in st["hint"], st["hint"]
    assert "a.ipynb" not in st["hint"], st["hint"]
    assert await _unowned(ws) == []

    ka = next(k["kernel_id"] for k in st["last_report"]["kernels"] if k["path"] == "a.ipynb")
    assert (await ws.run(ka, "print(x + 1)")).strip() == "42"
    count = len(ws.serverapp.kernel_manager.list_kernel_ids())

    # The way out: resume again completes, b.ipynb fresh and named, no kernel left behind.
    _, st = await ws.flight("resume")
    assert st["state"] == "ready", st
    by_path = {k["path"]: k for k in st["last_report"]["kernels"]}
    assert by_path["a.ipynb"]["outcome"] == "restored", by_path
    lost = by_path["b.ipynb"]
    assert lost["outcome"] == "fresh" and lost["lost"], lost
    assert gone in lost["reason"] and "variables are lost" in lost["reason"], lost
    assert len(ws.serverapp.kernel_manager.list_kernel_ids()) == count
    assert await _unowned(ws) == []
    assert (await ws.run(lost["kernel_id"], "print('y' in dir())")).strip() == "False"

    _, st = await ws.flight("pause", {"trigger": "manual"})
    assert st["state"] == "paused", st


@pytest.mark.parametrize("b_used", [False, True], ids=["b-untouched", "b-used-since"])
async def test_pause_from_a_failed_resume_keeps_the_unrestored_notebook_checkpoint(
        ws, tmp_path, b_used):
    """Before: POST pause answered 409 "already paused; resume it first" from failed. Now it
    pauses the kernels in use, and the notebook whose restore failed (its kernel died in it)
    keeps its checkpoint: the next resume restores it, never an empty kernel's checkpoint.
    Unless the person ran cells in that kernel since: then it holds their work, which the
    pause saves like any other."""
    marker = tmp_path / "die"
    a = (await ws.open_notebook("a.ipynb"))["kernel"]["id"]
    b = (await ws.open_notebook("b.ipynb"))["kernel"]["id"]
    await ws.run(a, "x = 1")
    await ws.run(b, DIES + f"d = Dies({str(marker)!r})\ny = 'kept'")
    _, st = await ws.flight("pause", {"trigger": "manual"})
    good = {k["path"]: k for k in ws.lifecycle.state["pause"]["kernels"]}["b.ipynb"]
    marker.write_text("die")
    _, st = await ws.flight("resume")
    assert st["state"] == "failed", st
    assert "b.ipynb" in st["reason"] and "died during the restore" in st["reason"], st
    assert "still there" in st["hint"] and "b.ipynb" in st["hint"], st["hint"]
    marker.unlink()
    kids = {k["path"]: k["kernel_id"] for k in st["last_report"]["kernels"]}
    await ws.run(kids["a.ipynb"], "x = 'new work'")
    # b.ipynb's process is gone until jupyter_client's restarter finds it dead (it polls every
    # time_to_dead, 3 s). Wait for the restarted process: "not busy" alone is already true of
    # a kernel killed before the server heard any status from it (it stays "starting"), and
    # a cell sent then fails with "Kernel died before replying to kernel_info" (seen in CI).
    kb = ws.serverapp.kernel_manager.get_kernel(kids["b.ipynb"])
    await until(kb.is_alive, what="b.ipynb's restarted kernel")
    await until(lambda: kb.execution_state != "busy", what="b.ipynb's restarted kernel idle")
    if b_used:
        await ws.run(kids["b.ipynb"], "z = 'work in b'")

    _, st = await ws.flight("pause", {"trigger": "manual"})
    assert st["state"] == "paused", st
    rec = {k["path"]: k for k in ws.lifecycle.state["pause"]["kernels"]}
    assert (rec["b.ipynb"]["checkpoint_id"] == good["checkpoint_id"]) is not b_used, rec
    _, st = await ws.flight("resume")
    assert st["state"] == "ready", st
    kids = {k["path"]: k["kernel_id"] for k in st["last_report"]["kernels"]}
    assert (await ws.run(kids["a.ipynb"], "print(x)")).strip() == "new work"
    if b_used:
        assert (await ws.run(kids["b.ipynb"], "print(z)")).strip() == "work in b"
    else:
        assert (await ws.run(kids["b.ipynb"], "print(y)")).strip() == "kept"
    assert await _unowned(ws) == []


# ------------------------------------------------------- a kernel stopped mid-checkpoint


@pytest.fixture
def pause_config():
    return {"PauseApp": {"kernel_silence_timeout": 2.0}, "LocalBackend": {}}


async def test_a_stopped_kernel_fails_its_checkpoint_within_the_silence_timeout(ws, tmp_path):
    """Before: the state stayed "checkpointing", with no reason, for bridge_timeout (an hour).
    A slow but live kernel (6 s in one variable, silence 2 s) is waited for: the heartbeat
    tells it apart from a stopped one."""
    kid = (await ws.open_notebook("frozen.ipynb"))["kernel"]["id"]
    await ws.run(kid, "x = 41")
    marker = tmp_path / "pickling"
    await ws.run(kid, SLOW_PICKLE + f"slow = Slow({str(marker)!r}, 6)")
    _, st = await ws.flight("pause", {"trigger": "manual"})
    assert st["state"] == "paused", st  # slow and alive: not stalled
    _, st = await ws.flight("resume")
    assert st["state"] == "ready", st
    kid = st["last_report"]["kernels"][0]["kernel_id"]
    before = ws.lifecycle.state["last_checkpoint"]["id"]
    marker.unlink()
    await ws.run(kid, SLOW_PICKLE + f"slow = Slow({str(marker)!r}, 6)")

    pid = ws.serverapp.kernel_manager.get_kernel(kid).provisioner.pid
    await ws.api("POST", "pause", {"trigger": "manual"})
    await until(marker.exists, what="the slow variable being pickled")
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.wait_for(ws.lifecycle.wait(), 40)
        st = await ws.status()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert st["state"] == "running", st
    assert "frozen.ipynb" in st["reason"] and "no progress for 2 s" in st["reason"], st
    assert "heartbeat" in st["reason"], st["reason"]
    assert st["hint"].startswith("Your kernels are untouched"), st["hint"]
    assert ws.journal()[-1]["reason"] == "kernel_stalled"
    assert ws.lifecycle.state["last_checkpoint"]["id"] == before
    assert kid in ws.serverapp.kernel_manager
    # Continued, the kernel is the same process with its memory (our checkpoint interrupted).
    await until(lambda: ws.serverapp.kernel_manager.get_kernel(kid).execution_state == "idle",
                timeout=30, what="the kernel idle again")
    assert (await ws.run(kid, "print(x + 1)")).strip() == "42"
    assert ws.serverapp.kernel_manager.get_kernel(kid).provisioner.pid == pid


# ------------------------------------------------------- SIGTERM after a partly failed resume

def _pause_then_resume_killing_b(s: Server, marker) -> dict:
    """Pause with b.ipynb's kernel holding a value whose unpickling kills the kernel while
    ``marker`` exists, then resume (failed for b): b's checkpoint entry of the pause."""
    kb = s.open_notebook("b.ipynb")["kernel"]["id"]
    s.output(kb, DIES + f"d = Dies({str(marker)!r})\ny = 'b state'")
    s.request("POST", "jupyter-pause/api/pause", {"trigger": "manual"})
    st = s.state("paused")
    good = {k["path"]: k for k in st["resume_from"]["checkpoints"]}["b.ipynb"]
    marker.write_text("die")
    s.request("POST", "jupyter-pause/api/resume", {})
    s.state("failed")
    return good


def test_sigterm_after_a_partly_failed_resume_saves_the_kernels_in_use(tmp_path):
    """Before: the stop found the paused record and saved nothing (no "stopped" entry): the
    work done in a.ipynb since the resume was gone after the restart."""
    marker = tmp_path / "die"
    s = Server(tmp_path)
    s.start()
    try:
        ka = s.open_notebook("a.ipynb")["kernel"]["id"]
        s.output(ka, "x = 'before'")
        good = _pause_then_resume_killing_b(s, marker)
        st = s.get("jupyter-pause/api/status")
        by_path = {k["path"]: k for k in st["last_report"]["kernels"]}
        assert by_path["a.ipynb"]["outcome"] == "restored", by_path
        assert by_path["b.ipynb"]["outcome"] == "failed", by_path
        s.output(by_path["a.ipynb"]["kernel_id"], "x = 'after the resume'")

        s.signal(signal.SIGTERM)
        assert s.wait_exit(80) is not None, s.log_tail()
        [stop] = [e for e in s.journal() if e["event"] == "stopped"]
        rows = {r["path"]: r for r in stop["rows"]}
        assert rows["a.ipynb"]["status"] == "saved", rows
        assert rows["b.ipynb"]["status"] == "not_saved", rows
        assert "restore in the last resume failed" in rows["b.ipynb"]["reason"], rows
        assert rows["b.ipynb"]["previous_checkpoint"] == good["checkpoint_id"], rows

        marker.unlink()
        s.start()
        st = s.get("jupyter-pause/api/status")
        assert st["resume_available"] and "b.ipynb" in st["hint"], st
        ka = s.open_notebook("a.ipynb")["kernel"]["id"]
        assert s.output(ka, "print(x)") == "after the resume\n"
        s.request("POST", "jupyter-pause/api/resume", {})
        st = s.state("ready")
        [k] = st["last_report"]["kernels"]
        assert k["path"] == "b.ipynb" and k["outcome"] == "restored", k
        assert k["checkpoint_id"] == good["checkpoint_id"]
        assert s.output(k["kernel_id"], "print(y)") == "b state\n"
    finally:
        s.stop()


def test_sigterm_saves_work_done_in_a_kernel_whose_restore_failed(tmp_path):
    """The person went on in the notebook whose restore failed (its kernel restarted after the
    death): that work is saved at the stop, not dropped for the checkpoint that could not be
    restored, which stays in the store."""
    marker = tmp_path / "die"
    s = Server(tmp_path)
    s.start()
    try:
        good = _pause_then_resume_killing_b(s, marker)
        marker.unlink()

        def b_kernel():
            ks = [x["kernel"]["id"] for x in s.get("api/sessions")
                  if x["path"] == "b.ipynb" and x.get("kernel")]
            return ks[0] if ks else None

        kb = s.wait_for("b.ipynb's kernel back after the death", b_kernel)
        s.output(kb, "z = 'new work in b'")

        s.signal(signal.SIGTERM)
        assert s.wait_exit(80) is not None, s.log_tail()
        [stop] = [e for e in s.journal() if e["event"] == "stopped"]
        row = {r["path"]: r for r in stop["rows"]}["b.ipynb"]
        assert row["status"] == "saved", row
        assert good["checkpoint_id"] in row["reason"], row

        s.start()
        kb = s.open_notebook("b.ipynb")["kernel"]["id"]
        assert s.output(kb, "print(z)") == "new work in b\n"
        ids = [c["id"] for c in s.get("jupyter-pause/api/checkpoints")["checkpoints"]]
        assert good["checkpoint_id"] in ids  # the older checkpoint is still there
    finally:
        s.stop()
