"""Autosave in real kernels: after cells, never while one runs, and a way back after SIGKILL."""

from __future__ import annotations

import json
import os
import queue
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_pause.checkpoint import open_keyed_store
from jupyter_pause.checkpoint.retention import is_autosave
from jupyter_pause.kernel.forkwrite import PAGE
from tests.harness import wait_for

STREAM = "analysis.ipynb"  # JPY_SESSION_NAME of kernel_env
STATUS = "__import__('jupyter_pause.kernel.autosave', fromlist=['_']).get(get_ipython()).status()"
# A variable whose pickling announces itself (marker file) and then takes `seconds`, holding
# the GIL ("spin") or not ("sleep"): a test acts while an autosave is known to be under way.
SLOW = """
import pathlib, time
class Slow:
    def __init__(self, marker, seconds, spin):
        self.marker, self.seconds, self.spin = marker, seconds, spin
    def __getstate__(self):
        pathlib.Path(self.marker).write_text("pickling")
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            if not self.spin:
                time.sleep(0.01)
        return {}
"""


@pytest.fixture
def where(tmp_path: Path) -> dict[str, str]:
    return {"JUPYTER_PAUSE_STORE_URL": str(tmp_path / "store"),
            "JUPYTER_PAUSE_KEY_PATH": str(tmp_path / "key"),
            "JUPYTER_PAUSE_AUTOSAVE": "{}"}  # the defaults: on


def autosaves(where: dict[str, str]) -> list[Any]:
    """The store's authentic autosaves of the notebook, newest first (read from outside)."""
    if not Path(where["JUPYTER_PAUSE_KEY_PATH"]).exists():
        return []
    store = open_keyed_store(where["JUPYTER_PAUSE_STORE_URL"], where["JUPYTER_PAUSE_KEY_PATH"])
    return [m for m in store.list(STREAM) if is_autosave(m)]


def autosave_of_cell(where: dict[str, str], cell: int, timeout: float = 60) -> Any:
    return wait_for(f"an autosave of cell [{cell}]",
                    lambda: next((m for m in autosaves(where) if m.meta.get("cell") == cell),
                                 None), timeout)


def status(k: Any) -> dict[str, Any]:
    """The autosave's status, asked silently: a silent request runs no pre_run_cell hook."""
    return k.silent(STATUS)


def sigkill(k: Any) -> None:
    k.kc.stop_channels()
    os.kill(k.km.provisioner.process.pid, signal.SIGKILL)
    wait_for("the kernel process to end", lambda: k.km.provisioner.process.poll() is not None,
             10)


def test_sigkill_then_restore_brings_back_the_last_finished_cell(kernel_factory: Any,
                                                                 where: dict[str, str]) -> None:
    k = kernel_factory(**where)
    k.ok("%load_ext jupyter_pause")
    k.ok("import numpy as np\nx = 1\nw = np.arange(1000.0)")
    first = k.ok("x = 2\nw[3] = -1.0\nnames = ['a', 'b']")
    cell = first.reply["content"]["execution_count"]
    m = autosave_of_cell(where, cell)
    assert m.meta["kind"] == "autosave" and {"x", "w", "names"} <= {v["name"] for v in m.variables}
    sigkill(k)

    fresh = kernel_factory(**where)
    fresh.ok("%load_ext jupyter_pause")
    out = fresh.ok("%restore")
    assert m.id in out.text
    assert fresh.eval("(x, float(w[3]), names)") == (2, -1.0, ["a", "b"])


def test_autosave_killed_mid_write_leaves_the_previous_one(kernel_factory: Any,
                                                           where: dict[str, str],
                                                           tmp_path: Path) -> None:
    k = kernel_factory(**where)
    k.ok("%load_ext jupyter_pause")
    done = k.ok("x = 'kept'")
    good = autosave_of_cell(where, done.reply["content"]["execution_count"])
    marker = tmp_path / "pickling"
    k.ok(SLOW + f"\nx = 'lost'\nslow = Slow({str(marker)!r}, 30, False)")
    wait_for("the autosave to be under way", marker.exists, 60)
    sigkill(k)  # in the middle of the write

    assert [m.id for m in autosaves(where)] == [good.id]
    fresh = kernel_factory(**where)
    fresh.ok("%load_ext jupyter_pause")
    fresh.ok("%restore")
    assert fresh.eval("x") == "kept"


@pytest.mark.parametrize("mode", ["fork", "thread"])
@pytest.mark.parametrize("spin", [False, True], ids=["io-bound", "cpu-bound"])
def test_a_cell_started_during_an_autosave_starts_at_once(kernel_factory: Any,
                                                         where: dict[str, str], tmp_path: Path,
                                                         spin: bool, mode: str) -> None:
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": mode})})
    k.ok("%load_ext jupyter_pause")
    marker = tmp_path / "pickling"
    seconds = 6.0
    before = k.ok(SLOW + f"\nslow = Slow({str(marker)!r}, {seconds}, {spin})\ny = 0")
    cell = before.reply["content"]["execution_count"]
    wait_for("the autosave to be under way", marker.exists, 60)
    t0 = time.monotonic()
    k.ok("y = 1")
    took = time.monotonic() - t0
    # The cell did not wait for the autosave (which has seconds of pickling left; the margin
    # is for a loaded machine, the autosave's own pickling holds the GIL in slices).
    assert took < seconds / 2, f"a cell took {took:.2f} s while an autosave ran"
    if mode == "thread":
        # That write was stopped: nothing of it was published (the cell changed the state).
        wait_for("the stopped autosave", lambda: status(k)["cancelled"], seconds + 30)
        assert all(m.meta.get("cell") != cell for m in autosaves(where))
    else:
        # The child's copy is the state before the cell, whole: it is published, with y = 0.
        m = autosave_of_cell(where, cell, seconds + 60)
        fresh = kernel_factory(**where)
        fresh.ok("%load_ext jupyter_pause")
        fresh.ok(SLOW + f"\n%restore --id {m.id}")
        assert fresh.eval("y") == 0


def test_a_forked_autosave_freezes_the_collector_only_while_its_child_lives(
        kernel_factory: Any, where: dict[str, str], tmp_path: Path) -> None:
    """While the child writes and the kernel is idle, the kernel's old objects sit in the
    collector's permanent generation (a collection would write to each one's header: copy on
    write of the whole namespace); a cell that starts puts them back, so the person's code
    sees the collector as usual (a cycle among them is collected, gc.get_referrers finds
    them)."""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "fork"})})
    k.ok("%load_ext jupyter_pause")
    marker = tmp_path / "pickling"
    k.ok("import gc, weakref\nclass Node: pass\n"
         "a, b = Node(), Node(); a.b, b.a = b, a; alive = weakref.ref(a)\n"
         + SLOW + f"\nslow = Slow({str(marker)!r}, 8.0, False)")
    wait_for("the autosave to be under way", marker.exists, 60)
    assert int(k.eval("gc.get_freeze_count()")) > 0  # asked without running a cell
    k.ok("in_cell = gc.get_freeze_count()\nreferrers = len(gc.get_referrers(b))")
    assert k.eval("(in_cell, referrers > 0)") == (0, True)
    assert status(k)["phase"] in ("writing", "publishing")  # the child goes on meanwhile
    k.ok("del a, b\ngc.collect()")
    assert k.eval("alive() is None") is True


def test_autosave_sends_nothing_on_iopub(kernel_factory: Any, where: dict[str, str]) -> None:
    """jupyter_server moves last_activity and execution_state on IOPub messages only: an
    autosave that sends none is not the person's activity and never shows the kernel busy."""
    k = kernel_factory(**where)
    k.ok("%load_ext jupyter_pause")
    k.ok("import numpy as np")
    out = k.ok("a = np.ones(2_000_000)")
    # The cell's own trailing messages (status idle) are in once the reply is; drain them.
    wait_for("the cell's idle status", lambda: _drain_until_idle(k), 10)
    autosave_of_cell(where, out.reply["content"]["execution_count"])
    msgs = []
    while True:
        try:
            msgs.append(k.kc.get_iopub_msg(timeout=0.5))
        except queue.Empty:  # nothing more
            break
    assert msgs == [], [m["header"]["msg_type"] for m in msgs]


def _drain_until_idle(k: Any) -> bool:
    try:
        msg = k.kc.get_iopub_msg(timeout=1)
    except queue.Empty:
        return True
    return msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"


def test_pause_autosave_off_on_every(kernel_factory: Any, where: dict[str, str]) -> None:
    k = kernel_factory(**where)
    k.ok("%load_ext jupyter_pause")
    assert "off" in k.ok("%pause --autosave off").stdout
    k.ok("z = 1")
    st = status(k)  # off: the cell scheduled nothing
    assert not st["scheduled"] and st["phase"] == "idle" and st["saved"] == 0
    assert "every 30 s" in k.ok("%pause --autosave every 30 s").stdout
    cell = k.ok("z = 3").reply["content"]["execution_count"]
    autosave_of_cell(where, cell)
    bad = k.run("%pause --autosave sometimes")
    assert bad.status == "error" and "off, on or 'every N s'" in bad.text


def test_autosaves_never_push_pause_checkpoints_out(kernel_factory: Any,
                                                    where: dict[str, str]) -> None:
    k = kernel_factory(**where)
    k.ok("%load_ext jupyter_pause")
    k.ok("%pause --autosave off")
    k.ok("v = 0\n%checkpoint --keep 2")
    k.ok("%pause --autosave on")
    for i in range(1, 6):
        autosave_of_cell(where, k.ok(f"v = {i}").reply["content"]["execution_count"])
    store = open_keyed_store(where["JUPYTER_PAUSE_STORE_URL"], where["JUPYTER_PAUSE_KEY_PATH"])

    def kinds() -> list[Any]:
        return [m.meta.get("kind") for m in store.list(STREAM)]

    # Retention runs once an autosave is published: the newest few (Settings.keep) in time.
    wait_for("retention of the autosaves", lambda: 1 <= kinds().count("autosave") <= 3, 30)
    assert kinds().count("checkpoint") == 1  # the %checkpoint survived five autosaves


@pytest.mark.parametrize("mode", ["fork", "thread"])
def test_retention_runs_in_the_forked_writer_not_in_the_kernel(kernel_factory: Any,
                                                               where: dict[str, str],
                                                               tmp_path: Path, mode: str) -> None:
    """Retention reads every manifest of the store, holding the interpreter lock: in fork mode
    it runs in the writer's child, so the person's next cell never waits on it, and it still
    keeps only the newest few."""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": mode})})
    k.ok("%load_ext jupyter_pause")
    pids = tmp_path / "retained-by"
    k.ok("import os, jupyter_pause.kernel.autosave as _a\n"
         "_retain = _a.retain_autosaves\n"
         "def _spy(*args, **kw):\n"
         "    try:\n"
         "        return _retain(*args, **kw)\n"
         "    finally:  # written once it is done, so a test that reads it sees its effect\n"
         f"        with open({str(pids)!r}, 'a') as f: f.write(f'{{os.getpid()}}\\n')\n"
         "_a.retain_autosaves = _spy")
    kernel_pid = k.eval("os.getpid()")
    for i in range(5):
        autosave_of_cell(where, k.ok(f"v = {i}").reply["content"]["execution_count"])
    wait_for("retention after the autosaves", lambda: pids.exists()
             and len(pids.read_text().split()) >= 5, 30)
    ran_in = {int(p) for p in pids.read_text().split()}
    if mode == "fork":
        assert kernel_pid not in ran_in and len(ran_in) >= 5, (kernel_pid, ran_in)
    else:
        assert ran_in == {kernel_pid}
    # Settings.keep, as before. The last retention (its pid written when it returned) has
    # finished; a later autosave's own may still run, so the count is waited on.
    wait_for("the newest few autosaves kept", lambda: 1 <= len(autosaves(where)) <= 3, 30)


# Two steps of state, held apart until a file appears: a test releases it.
STEPS = """
import pathlib, time
def _step(*_):
    global a, b
    a = 1
    pathlib.Path({half!r}).write_text("half")
    end = time.monotonic() + 60
    while not pathlib.Path({go!r}).exists() and time.monotonic() < end:
        time.sleep(0.01)
    b = 1
"""
COMM_TARGET = """
def _target(comm, _open):
    comm.on_msg(_step)
get_ipython().kernel.comm_manager.register_target("jupyter-pause-test", _target)
"""


@pytest.mark.parametrize("via", ["silent-execute", "comm-message"])
def test_a_silent_execution_or_a_widget_callback_is_never_copied_half_run(
        kernel_factory: Any, where: dict[str, str], tmp_path: Path, via: str) -> None:
    """A front end's silent execution and a comm message (a widget's callback) run the
    notebook's code without cell hooks: the autosave due since the last cell waits until they
    end, and saves the state after them, never one in the middle."""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "fork"})})
    k.ok("%load_ext jupyter_pause")
    half, go = tmp_path / "half", tmp_path / "go"
    k.ok(STEPS.format(half=str(half), go=str(go)) + (COMM_TARGET if via == "comm-message"
                                                      else ""))
    cell = k.ok("a = b = 0").reply["content"]["execution_count"]  # an autosave is now due
    if via == "silent-execute":
        k.kc.execute("_step()", silent=True, store_history=False)
    else:
        session, shell = k.kc.session, k.kc.shell_channel
        shell.send(session.msg("comm_open", {"comm_id": "c1", "target_name":
                                             "jupyter-pause-test", "data": {}}))
        shell.send(session.msg("comm_msg", {"comm_id": "c1", "data": {"value": 1}}))
    wait_for("the callback's first step", half.exists, 60)
    # Hold it long enough for the due autosave to run (it is due 0.25 s after the cell); it
    # must not: one that did would hold a = 1, b = 0, a state no cell ever left.
    kernel = psutil.Process(k.km.provisioner.process.pid)
    cpu0, t0 = sum(kernel.cpu_times()[:2]), time.monotonic()
    while time.monotonic() < t0 + 3.0 and not any(m.meta.get("cell") == cell
                                                  for m in autosaves(where)):
        time.sleep(0.05)
    cpu = sum(kernel.cpu_times()[:2]) - cpu0
    go.write_text("go")
    # The writer waits for the callback to end without spinning (the callback polls a file
    # every 10 ms: a few tens of ms in 3 s; a spinning thread takes a core).
    assert cpu < 0.6, f"the kernel used {cpu:.2f} s of CPU in 3 s while a callback ran"
    m = autosave_of_cell(where, cell)
    fresh = kernel_factory(**where)
    fresh.ok("%load_ext jupyter_pause")
    fresh.ok(f"%restore --id {m.id}")
    assert fresh.eval("(a, b)") == (1, 1)


# A variable whose pickling waits, while ``_block`` is set, until a file appears: it holds a
# thread's write in the middle of the namespace.
SLOW_PICKLE = """
import pathlib, time
_block = False
class Slow:
    def __reduce__(self):
        if _block:
            pathlib.Path({writing!r}).write_text("writing")
            end = time.monotonic() + 60
            while not pathlib.Path({cont!r}).exists() and time.monotonic() < end:
                time.sleep(0.01)
        return (Slow, ())
"""


def test_a_callback_that_starts_during_a_thread_write_stops_it(
        kernel_factory: Any, where: dict[str, str], tmp_path: Path) -> None:
    """A thread's write (CUDA kernels) pickles the live namespace. A silent execution that
    starts while it runs changes what is still to be pickled: the write stops, as for a cell,
    and comes again once the callback has ended, so no autosave holds half of it."""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "thread"})})
    k.ok("%load_ext jupyter_pause")
    writing, cont = tmp_path / "writing", tmp_path / "cont"
    half, go = tmp_path / "half", tmp_path / "go"
    k.ok(SLOW_PICKLE.format(writing=str(writing), cont=str(cont))
         + STEPS.format(half=str(half), go=str(go)))
    k.ok("s = Slow()")  # pickled before a and b: it holds the write before them
    cell = k.ok("a = b = 0\n_block = True").reply["content"]["execution_count"]
    wait_for("the thread's write to reach s", writing.exists, 60)
    k.kc.execute("_step()", silent=True, store_history=False)
    wait_for("the callback's first step", half.exists, 60)
    cont.write_text("go on")  # a write that still ran would now pickle a = 1, b = 0
    # and publish it within a few seconds: none may come while the callback runs
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        torn = [m for m in autosaves(where) if m.meta.get("cell") == cell]
        assert not torn, "an autosave was published in the middle of a callback"
        time.sleep(0.05)
    go.write_text("go")
    m = autosave_of_cell(where, cell)
    for other in autosaves(where):  # one for the cell, and never a torn one
        assert other.meta.get("cell") != cell or other.id == m.id, [
            a.meta for a in autosaves(where)]
    assert status(k)["callback_stops"] == 1  # the one write the callback stopped
    fresh = kernel_factory(**where)
    fresh.ok("%load_ext jupyter_pause")
    fresh.ok(f"%restore --id {m.id}")
    assert fresh.eval("(a, b)") == (1, 1)


def test_restore_goes_back_to_the_checkpoint_not_to_the_autosave_since(
        kernel_factory: Any, where: dict[str, str]) -> None:
    """`%checkpoint`, a cell the person wants to undo, `%restore`: the checkpoint comes back,
    although the autosave of the undone cell is newer; `--id` still takes an autosave."""
    k = kernel_factory(**where)
    k.ok("%load_ext jupyter_pause")
    k.ok("z = 1\n%checkpoint")
    m = autosave_of_cell(where, k.ok("z = 2").reply["content"]["execution_count"])
    out = k.ok("%restore")
    assert m.id not in out.text and k.eval("z") == 1
    k.ok(f"%restore --id {m.id}")
    assert k.eval("z") == 2


def test_after_a_death_restore_takes_the_offered_autosave(kernel_factory: Any,
                                                         where: dict[str, str]) -> None:
    """The new kernel's own autosaves are newer and smaller: ``%restore`` still takes the one the
    server offered, and retention keeps that one until it is taken."""
    k = kernel_factory(**where)
    k.ok("%load_ext jupyter_pause")
    m = autosave_of_cell(where, k.ok("x = 'before the death'").reply["content"]["execution_count"])
    sigkill(k)

    fresh = kernel_factory(**where)
    fresh.ok("%load_ext jupyter_pause")
    call = ("__import__('jupyter_pause.kernel.bridge', fromlist=['_']).call('autosave', "
            f"{json.dumps(json.dumps({'offered': m.id}))})")
    fresh.run(call, silent=True)  # what the server does in a kernel it restarted after a death
    assert status(fresh)["offered"] == m.id
    for i in range(4):  # more autosaves than retention keeps
        autosave_of_cell(where, fresh.ok(f"x = 'new {i}'").reply["content"]["execution_count"])
    assert m.id in {a.id for a in autosaves(where)}
    out = fresh.ok("%restore")
    assert m.id in out.text and fresh.eval("x") == "before the death"
    assert status(fresh)["offered"] is None


def test_autosave_after_a_checkpoint_in_the_kernel_completes(kernel_factory: Any,
                                                            where: dict[str, str]) -> None:
    """A write in the kernel itself (%checkpoint, a pause) starts native hashing threads there;
    a forked autosave must not wait on them (they do not exist in the child)."""
    k = kernel_factory(**where)
    k.ok("%load_ext jupyter_pause\nimport numpy as np\n%pause --autosave off")
    k.ok("a = np.random.default_rng(0).random(8_000_000)\n%checkpoint")
    k.ok("%pause --autosave on")
    m = autosave_of_cell(where, k.ok("a[0] = 2.0").reply["content"]["execution_count"], 60)
    assert m.meta["kind"] == "autosave"


# Eight 4 MiB tensors in one pack; a cell then changes one of them behind torch's back.
TENSORS = "import torch\nps = [torch.full((1 << 20,), float(i)) for i in range(8)]"
CHANGED = "ps[2].data[5] = -1.0"


def given_back_after(k: Any, where: dict[str, str], code: str) -> tuple[Any, dict[str, Any]]:
    m = autosave_of_cell(where, k.ok(code).reply["content"]["execution_count"], 120)
    last = wait_for("the kernel to hear of it",
                    lambda: (status(k).get("last") or {}).get("checkpoint_id") == m.id
                    and status(k)["last"], 30)
    return m, last


def test_a_forked_autosave_gives_back_unchanged_memory_and_saves_it_whole(
        kernel_factory: Any, where: dict[str, str]) -> None:
    """The child maps away the memory of storages it reuses unchanged (so the kernel's next
    writes to them copy nothing); the autosave still holds every value, the kernel's own
    tensors are untouched, and a cell may write them at once."""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "fork"})})
    k.ok("%load_ext jupyter_pause")
    _, first = given_back_after(k, where, TENSORS)
    assert first["bytes_given_back"] == 0  # nothing to reuse yet
    m, last = given_back_after(k, where, CHANGED)
    # the seven unchanged storages, each but the pages holding its first and last byte
    assert 7 * ((4 << 20) - 2 * PAGE) <= last["bytes_given_back"] <= 7 * (4 << 20), last
    k.ok("for p in ps: p.add_(1.0)")
    assert k.eval("[float(p[5]) for p in ps]") == [1.0, 2.0, 0.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    fresh = kernel_factory(**where)
    fresh.ok("%load_ext jupyter_pause")
    fresh.ok(f"%restore --id {m.id}")
    assert fresh.eval("[float(p[5]) for p in ps]") == [0.0, 1.0, -1.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert fresh.eval("[float(p.sum()) for p in ps][3]") == 3.0 * (1 << 20)


def test_a_child_that_reads_memory_it_gave_back_fails_safely(kernel_factory: Any,
                                                             where: dict[str, str]) -> None:
    """A read of given-back memory that the engine did not foresee (an alias nothing showed)
    ends the child with SIGSEGV: that autosave fails with a clear error, the previous one stays
    the newest, and this kernel's next autosave gives memory back only once it is pickled; a
    second crash, and its autosaves complete without giving memory back. (The second crash
    also shows that the next write reused what the crashed child had claimed: that child told
    the kernel the blob stamps its claims changed before it died.)"""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "fork"})})
    k.ok("%load_ext jupyter_pause")
    good, _ = given_back_after(k, where, TENSORS)
    k.ok("import ctypes\nfrom jupyter_pause.kernel import forkwrite as _fw\n"
         "_give_back = _fw._give_back\n"
         "def _reads_after(storages):\n"
         "    n = _give_back(storages)\n"
         "    ctypes.string_at(storages[0].data_ptr() + 2 * _fw.PAGE, 1)  # the unforeseen read\n"
         "    return n\n"
         "_fw._give_back = _reads_after\n" + CHANGED)
    st = wait_for("the crashed autosave", lambda: status(k)["failed"] and status(k), 120)
    assert "crashed (SIGSEGV)" in st["error"] and "only once it is pickled" in st["error"]
    assert next(m.id for m in autosaves(where)) == good.id
    assert k.eval("(_fw._early_ok, _fw._give_back_ok)") == (False, True)
    failed = st["failed"]
    k.ok("ps[4].data[5] = -3.0")  # given back after the pickling: the same read crashes it
    st = wait_for("the second crash", lambda: status(k)["failed"] > failed and status(k), 120)
    assert "crashed (SIGSEGV)" in st["error"] and "no longer give memory back" in st["error"]
    assert next(m.id for m in autosaves(where)) == good.id
    m, last = given_back_after(k, where, "ps[3].data[5] = -2.0")
    assert last["bytes_given_back"] == 0 and k.eval("_fw._give_back_ok") is False
    fresh = kernel_factory(**where)
    fresh.ok("%load_ext jupyter_pause")
    fresh.ok(f"%restore --id {m.id}")
    assert fresh.eval("[float(p[5]) for p in ps][:5]") == [0.0, 1.0, -1.0, -2.0, -3.0]


def test_a_getstate_that_reads_a_tensor_costs_one_autosave_not_the_give_back(
        kernel_factory: Any, where: dict[str, str]) -> None:
    """An object whose ``__getstate__`` reads a tensor's memory while it is pickled (skorch's
    nets save their modules with torch.save there) meets memory given back before the
    pickling: that child crashes, and the next autosave, giving memory back only once it is
    pickled, saves it whole and still gives the other storages back. The restore binds the
    notebook's modules before it rebuilds values: ``__setstate__`` uses ``torch`` as it runs."""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "fork"})})
    k.ok("%load_ext jupyter_pause")
    k.ok("import torch\n"
         "class Holder:\n"
         "    def __init__(self, t): self.t = t\n"
         "    def __getstate__(self): return {'copy': self.t.numpy().copy()}\n"
         "    def __setstate__(self, st): self.t = torch.from_numpy(st['copy'])\n"
         "ps = [torch.full((1 << 20,), float(i)) for i in range(8)]\n"
         "h = Holder(torch.full((1 << 20,), 9.0))\n"
         "keep = [h.t]")  # the storage itself is saved here, so it is reused unchanged
    given_back_after(k, where, "x = 1")  # the first: nothing to give back yet
    k.ok("ps[1].data[5] = -1.0")
    st = wait_for("the crashed autosave", lambda: status(k)["failed"] and status(k), 120)
    assert "crashed (SIGSEGV)" in st["error"] and "only once it is pickled" in st["error"]
    # h.t unchanged: reused and given back again, now once Holder has been pickled
    m, last = given_back_after(k, where, "ps[2].data[5] = -2.0")
    assert last["bytes_given_back"] >= 7 * ((4 << 20) - 2 * PAGE), last
    fresh = kernel_factory(**where)
    fresh.ok("%load_ext jupyter_pause")
    fresh.ok(f"%restore --id {m.id}")
    assert fresh.eval("[float(h.t.sum()), float(ps[1][5]), float(ps[2][5]), h.t is keep[0]]") \
        == [9.0 * (1 << 20), -1.0, -2.0, False]


# The autosave thread's fork preparation, held until a file appears: a test acts in between.
HOLD_FORK = """
import pathlib, time
from jupyter_pause.kernel import forkwrite as _fw
_freeze = _fw._freeze_gc
def _held_freeze():
    pathlib.Path({held!r}).write_text("1")
    end = time.monotonic() + 60
    while not pathlib.Path({go!r}).exists() and time.monotonic() < end:
        time.sleep(0.01)
    pathlib.Path({returned!r}).write_text("1")
    _fw._freeze_gc = _freeze  # this round only
    return _freeze()
_fw._freeze_gc = _held_freeze
"""


def _hold_fork(k: Any, tmp_path: Path) -> tuple[int, Path, Path, Path]:
    """A cell that holds its own autosave's fork preparation; returns its number and the
    files: held (the preparation waits), go (let it go on), returned (it went on normally)."""
    held, go, returned = (tmp_path / n for n in ("held", "go", "returned"))
    out = k.ok(HOLD_FORK.format(held=str(held), go=str(go), returned=str(returned)))
    wait_for("the autosave to prepare its fork", held.exists, 60)
    return out.reply["content"]["execution_count"], held, go, returned


def test_a_cell_that_starts_while_a_fork_is_prepared_is_never_copied_half_run(
        kernel_factory: Any, where: dict[str, str], tmp_path: Path) -> None:
    """The round saw no cell running, then a cell began before the fork: a copy taken now
    would hold half of that cell under the previous cell's number. The fork is checked under
    the lock the cells' hook takes, so that round forks nothing; the next one saves it whole."""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "fork"})})
    k.ok("%load_ext jupyter_pause")
    cell, _held, go, returned = _hold_fork(k, tmp_path)
    k.start(f"import pathlib, time\nhalf = 1\npathlib.Path({str(go)!r}).write_text('1')\n"
            "time.sleep(1.5)\nhalf = 2")
    after = k.ok("after = 3").reply["content"]["execution_count"]  # runs once that cell ended
    m = autosave_of_cell(where, after)
    assert returned.exists()
    assert status(k)["cancelled"] >= 1
    assert [x for x in autosaves(where) if x.meta.get("cell") == cell] == []
    fresh = kernel_factory(**where)
    fresh.ok("%load_ext jupyter_pause")
    fresh.ok(f"%restore --id {m.id}")
    assert fresh.eval("(half, after)") == (2, 3)


def test_a_stop_while_a_fork_is_prepared_raises_nothing_into_the_forking_thread(
        kernel_factory: Any, where: dict[str, str], tmp_path: Path) -> None:
    """An exception sent into the thread that forks could land in os.fork itself (a child
    that nobody waits for) or in an at-fork handler (a lock left held): a stop before the fork
    only sets the flag the fork is checked against."""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "fork"})})
    k.ok("%load_ext jupyter_pause")
    _cell, _held, go, returned = _hold_fork(k, tmp_path)
    cancelled = status(k)["cancelled"]
    k.silent(STATUS.replace(".status()", ".cancel()") + " or 0")
    go.write_text("1")
    st = wait_for("the stopped round",
                  lambda: status(k)["cancelled"] > cancelled and status(k), 60)
    assert returned.exists()  # the preparation went on: no exception was raised into it
    assert st["error"] is None
    assert [x for x in autosaves(where) if x.meta.get("cell") == _cell] == []
    wait_for("no child left", lambda: not _children(k), 30)
    done = k.ok("y = 1").reply["content"]["execution_count"]
    autosave_of_cell(where, done)


def _children(k: Any) -> list[int]:
    return [c.pid for c in psutil.Process(k.km.provisioner.process.pid).children()]


def test_a_writer_killed_from_outside_is_a_failure_not_a_cancel(kernel_factory: Any,
                                                                where: dict[str, str],
                                                                tmp_path: Path) -> None:
    """The OOM killer's choice while the child lives (it is the pod's biggest process): the
    person is told, and the previous autosave stays the newest."""
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "fork"})})
    k.ok("%load_ext jupyter_pause")
    good = autosave_of_cell(where, k.ok("x = 'kept'").reply["content"]["execution_count"])
    marker = tmp_path / "pickling"
    k.ok(SLOW + f"\nslow = Slow({str(marker)!r}, 30, False)")
    wait_for("the child to be writing", marker.exists, 60)
    (child,) = _children(k)
    cancelled = status(k)["cancelled"]
    os.kill(child, signal.SIGKILL)
    st = wait_for("the failed autosave", lambda: status(k)["failed"] and status(k), 60)
    assert "killed (SIGKILL; out of memory?)" in st["error"], st
    assert st["cancelled"] == cancelled
    assert next(m.id for m in autosaves(where)) == good.id


def _fds_when_idle(k: Any) -> int:
    """The kernel's open files once no autosave is under way (asked silently: no round)."""
    wait_for("the autosave to be idle", lambda: status(k)["phase"] == "idle", 60)
    return k.silent("len(__import__('os').listdir('/proc/self/fd'))")


def test_a_fork_the_system_refuses_is_told_and_leaks_nothing(kernel_factory: Any,
                                                             where: dict[str, str]) -> None:
    k = kernel_factory(**{**where, "JUPYTER_PAUSE_AUTOSAVE": json.dumps({"mode": "fork"})})
    k.ok("%load_ext jupyter_pause")
    autosave_of_cell(where, k.ok("x = 1").reply["content"]["execution_count"])
    k.ok("import os\n_fork = os.fork\n"
         "def _refused():\n"
         "    raise OSError(12, 'Cannot allocate memory')\n"
         "os.fork = _refused\nx = 2")
    st = wait_for("the refused fork", lambda: status(k)["failed"] and status(k), 60)
    assert "Cannot allocate memory" in st["error"], st
    fds = _fds_when_idle(k)
    k.ok("x = 3")  # refused again: nothing more is open after it
    wait_for("the second refused fork", lambda: status(k)["failed"] == 2, 60)
    assert _fds_when_idle(k) == fds
    done = k.ok("os.fork = _fork\nx = 4").reply["content"]["execution_count"]
    autosave_of_cell(where, done)
