"""Process-state entries, one by one, in this process: capture, disturb, restore, and the next
draw / open / print is the one it would have been; then what a hostile store can feed them.

Every test puts the process back as it found it (the suite shares this process)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import random
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from jupyter_pause import checkpoint as cp
from jupyter_pause.checkpoint import procstate
from jupyter_pause.checkpoint.manifest import canonical
from jupyter_pause.checkpoint.procstate import environment, settings

ALLOWED = {"restored", "skipped", "failed"}


def roundtrip(name: str, disturb) -> list:
    """Capture entry ``name``, run ``disturb()``, restore it: the rows it reported."""
    entry = procstate.get(name)
    state = json.loads(json.dumps(entry.capture()))
    assert state is not None, f"{name} captured nothing"
    disturb()
    rows = procstate.restore({"format": 1, "entries": {name: state}})
    assert rows and all(r.kind == procstate.KIND for r in rows)
    return rows


def test_python_numpy_torch_streams_continue():
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    random.random(), np.random.rand(), torch.rand(2)  # mid-stream, not at a seed
    state = procstate.capture()
    expected = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(),
                np.random.randn(), torch.rand(3).tolist(), torch.nn.functional.dropout(
                    torch.ones(8), 0.5).tolist())
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    rows = {r.name: r.status for r in procstate.restore(json.loads(json.dumps(state)))}
    assert rows["RNG: random"] == rows["RNG: numpy"] == rows["RNG: torch"] == "restored"
    again = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(),
             np.random.randn(), torch.rand(3).tolist(), torch.nn.functional.dropout(
                 torch.ones(8), 0.5).tolist())
    assert again == expected


def test_cuda_streams_of_missing_devices_are_named():
    """A state captured on two GPUs: a device this machine does not have is named, never put on
    another device (its stream would then be a different device's)."""
    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    state = {"devices": [{"index": i, "name": "NVIDIA H100 80GB HBM3",
                          "state": "AAAAAAAAAAAqAAAAAAAAAA=="} for i in (0, 1)]}
    rows = procstate.restore({"format": 1, "entries": {"rng.cuda": state}})
    by = {r.name: r for r in rows}
    assert set(by) == {"RNG: cuda:0", "RNG: cuda:1"}
    assert by["RNG: cuda:1"].status == "skipped" or here >= 2
    for i in range(here, 2):
        assert by[f"RNG: cuda:{i}"].reason.startswith(f"CUDA RNG of cuda:{i}: no such device")
    # not captured where CUDA never ran: reading a generator would initialize it
    assert procstate.get("rng.cuda").capture() is None or torch.cuda.is_initialized()


def test_cwd_comes_back_when_it_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("a,b\n")
    os.chdir("data")
    rows = roundtrip("env.cwd", lambda: os.chdir(tmp_path))
    assert rows[0].status == "restored" and Path("x.csv").read_text() == "a,b\n"
    gone = {"format": 1, "entries": {"env.cwd": {"cwd": str(tmp_path / "gone")}}}
    (row,) = procstate.restore(gone)
    assert row.status == "skipped" and "no directory" in row.reason
    assert os.getcwd() == str(tmp_path / "data")


def test_environ_is_a_diff_and_the_new_environment_wins(monkeypatch):
    start = environment.start_environ()
    assert "PATH" in start  # read from /proc/self/environ (what this process was exec'd with)
    monkeypatch.setenv("JP_TEST_USER_FLAG", "secret-value")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # a user's choice of device
    state = procstate.get("env.environ").capture()
    assert state["set"]["JP_TEST_USER_FLAG"] == "secret-value"
    assert state["start"]["JP_TEST_USER_FLAG"] is None
    assert "PATH" not in state["set"]  # unchanged since the start: not the user's
    monkeypatch.delenv("JP_TEST_USER_FLAG")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # a variable the checkpointed process started with another value: this one's start wins
    state["set"]["HOME"] = "/checkpointed/home"
    state["start"]["HOME"] = "/old/pod/home"
    (row,) = procstate.restore({"format": 1, "entries": {"env.environ": state}})
    assert os.environ["JP_TEST_USER_FLAG"] == "secret-value"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # devices are the new machine's
    assert os.environ.get("HOME") == start.get("HOME")
    assert row.status == "restored" and "JP_TEST_USER_FLAG" in row.reason
    assert "differs from the new environment" in row.reason
    assert "HOME" in row.reason and "CUDA_VISIBLE_DEVICES" in row.reason
    assert "secret-value" not in row.reason and "/checkpointed" not in row.reason


def test_sys_path_additions_keep_their_place(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "front").mkdir()
    (tmp_path / "front" / "jp_front_mod.py").write_text("VALUE = 7\n")
    sys.path.insert(0, str(tmp_path / "front"))
    sys.path.append("relative/lib")
    state = procstate.get("env.path").capture()
    # pytest's own insertions are additions too; what the interpreter started with is not
    assert state["front"][0] == str(tmp_path / "front") and state["end"][-1] == "relative/lib"
    diff = state["front"] + state["end"]
    assert not [p for p in diff if "site-packages" in p or p in ("", sys.prefix)]
    assert os.path.dirname(os.__file__) not in diff
    sys.path.remove(str(tmp_path / "front"))
    sys.path.remove("relative/lib")
    (row,) = procstate.restore({"format": 1, "entries": {"env.path": state}})
    assert sys.path[0] == str(tmp_path / "front") and sys.path[-1] == "relative/lib"
    assert row.status == "restored" and "relative/lib" in row.reason
    sys.modules.pop("jp_front_mod", None)
    import jp_front_mod

    assert jp_front_mod.VALUE == 7
    sys.modules.pop("jp_front_mod", None)


def test_a_child_forked_after_warm_captures_without_asking_again(monkeypatch):
    """An autosave's child is forked from the kernel each time: what capture caches (the start
    sys.path, a subprocess) is filled in the kernel by warm(), so no child starts a process."""
    import subprocess

    environment.start_path.cache_clear()
    procstate.warm()
    assert environment.start_path.cache_info().currsize == 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: capture with subprocesses refused
        code = 1
        try:
            def refused(*a, **kw):
                raise OSError("no subprocess here")
            subprocess.run = refused  # this process only
            state = procstate.capture()
            code = 0 if "env.path" in state["entries"] and not state["skipped"] else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == bytes([0])
    # without warm() the same child could not tell sys.path's start: capture says so
    environment.start_path.cache_clear()
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: (_ for _ in ()).throw(OSError()))
    assert "env.path" in procstate.capture()["skipped"]
    monkeypatch.undo()
    procstate.warm()


def test_numpy_print_options():
    before = np.get_printoptions()
    try:
        np.set_printoptions(precision=3, linewidth=40)
        rows = roundtrip("settings.numpy", lambda: np.set_printoptions(**before))
        assert rows[0].status == "restored"
        assert repr(np.array([1 / 3])) == "array([0.333])"
        np.set_printoptions(formatter={"float": lambda v: "x"})
        with pytest.raises(ValueError, match="formatter"):
            procstate.get("settings.numpy").capture()  # reported as skipped by capture()
        assert procstate.capture()["skipped"]["settings.numpy"].startswith("not saved")
    finally:
        np.set_printoptions(**before)


def test_torch_settings(monkeypatch):
    threads = torch.get_num_threads()
    try:
        torch.set_default_dtype(torch.float64)
        torch.set_printoptions(precision=2)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_float32_matmul_precision("medium")
        torch.set_grad_enabled(False)
        torch.set_num_threads(1 if settings.default_threads() != 1 else 2)
        state = procstate.get("settings.torch").capture()
        assert {"default_dtype", "print", "deterministic", "float32_matmul_precision",
                "grad_enabled", "num_threads"} <= set(state)
        _reset_torch(threads)
        (row,) = procstate.restore({"format": 1, "entries": {"settings.torch": state}})
        assert row.status == "restored", row
        assert torch.tensor(1.0).dtype == torch.float64
        assert "0.33" in repr(torch.tensor([1 / 3])) and "0.333" not in repr(torch.tensor([1 / 3]))
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.get_float32_matmul_precision() == "medium"
        assert not torch.is_grad_enabled()
        assert torch.get_num_threads() == state["num_threads"]
        # a thread count the platform set (OMP_NUM_THREADS at start) is never overridden
        _reset_torch(threads)
        monkeypatch.setattr(settings, "start_environ", lambda: {"OMP_NUM_THREADS": str(threads)})
        (row,) = procstate.restore({"format": 1, "entries": {"settings.torch": state}})
        assert torch.get_num_threads() == threads
        assert "differs from the new environment" in row.reason and "OMP_NUM_THREADS" in row.reason
    finally:
        _reset_torch(threads)


def _reset_torch(threads: int) -> None:
    torch.set_default_dtype(torch.float32)
    torch.set_printoptions(profile="default")
    torch.use_deterministic_algorithms(False)
    torch.set_float32_matmul_precision("highest")
    torch.set_grad_enabled(True)
    torch.set_num_threads(threads)


def test_pandas_options():
    pd = pytest.importorskip("pandas")
    try:
        pd.set_option("display.max_rows", 7)
        pd.set_option("display.precision", 2)
        rows = roundtrip("settings.pandas", lambda: pd.reset_option("display.*"))
        assert rows[0].status == "restored"
        assert pd.get_option("display.max_rows") == 7 and pd.get_option("display.precision") == 2
    finally:
        pd.reset_option("display.max_rows")
        pd.reset_option("display.precision")


def test_matplotlib_rcparams():
    mpl = pytest.importorskip("matplotlib")
    from cycler import cycler

    with mpl.rc_context():
        mpl.rcParams["lines.linewidth"] = 3.5
        mpl.rcParams["axes.prop_cycle"] = cycler(color=["r", "k"])
        mpl.rcParams["figure.figsize"] = (3, 2)
        rows = roundtrip("settings.matplotlib", mpl.rcdefaults)
        assert rows[0].status == "restored", rows
        assert mpl.rcParams["lines.linewidth"] == 3.5
        assert mpl.rcParams["axes.prop_cycle"].by_key()["color"] == ["r", "k"]
        assert list(mpl.rcParams["figure.figsize"]) == [3, 2]


def test_logging_levels():
    lg = logging.getLogger("jp_test_procstate.child")
    try:
        lg.setLevel(logging.ERROR)
        rows = roundtrip("logging.levels", lambda: lg.setLevel(logging.NOTSET))
        assert lg.level == logging.ERROR and "jp_test_procstate.child=ERROR" in rows[0].reason
    finally:
        lg.setLevel(logging.NOTSET)


def test_warnings_filters():
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.filterwarnings("error", message="boom", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"jp\.x")
        rows = roundtrip("warnings.filters", warnings.resetwarnings)
        assert rows[0].status == "restored"
        with pytest.raises(UserWarning):
            warnings.warn("boom!", UserWarning, stacklevel=1)
        # in their order: the later filterwarnings() went first
        assert [f[2] for f in warnings.filters[:2]] == [DeprecationWarning, UserWarning]
        assert warnings.filters[0][3] == re.compile(r"jp\.x")


def test_capture_skips_a_failing_entry_and_names_it():
    def broken():
        raise RuntimeError("cannot read it")

    procstate.register(procstate.Entry("test.broken", "broken thing", broken, lambda s: None))
    try:
        state = procstate.capture()
        assert "test.broken" not in state["entries"]
        rows = {r.name: r for r in procstate.captured(state)}
        assert rows["broken thing"].status == "skipped"
        assert "cannot read it" in rows["broken thing"].reason
    finally:
        procstate.unregister("test.broken")


HOSTILE = [None, 1, True, "x", [], [1, 2], {"a": 1}, {"state": "!!!not base64"},
           {"mt": "AAAA", "version": 3}, {"version": 3, "mt": "A" * 10**6},
           {"cwd": 5}, {"cwd": "/etc\0/x"}, {"set": {"A=B": "1"}, "unset": [], "start": {}},
           {"set": {"K": 1}, "unset": [], "start": {}}, {"front": "not a list", "end": []},
           {"front": [1], "end": []}, {"filters": [{"action": "explode"}]},
           {"filters": [{"action": "error", "message": {"re": "("}, "module": None,
                         "category": "builtins:UserWarning", "lineno": 0}]},
           {"devices": [{"index": -1, "state": "AA=="}]}, {"devices": [{"index": 10**9}]},
           {"default_dtype": "complex128"}, {"num_threads": -4}, {"print": {"profile": 1}},
           {"levels": {"x": "DEBUG"}}, {"levels": {"x": 10}, "modules": ["os; rm -rf"]},
           {"display.max_rows": [1, 2]}, {"lines.linewidth": {"cycler": 1}},
           {"precision": {"a": 1}}, {"bit_generator": "PCG64"},
           {"bit_generator": "MT19937", "key": "AAAA", "pos": 0, "has_gauss": 0, "gauss": 0.0}]


def _nested(depth: int) -> object:
    v: object = []
    for _ in range(depth):
        v = [v]
    return v


@pytest.mark.parametrize("entry", [e.name for e in procstate.registered()])
def test_hostile_state_is_skipped_with_a_reason_never_raised(entry, tmp_path, monkeypatch):
    """What the store hands back is untrusted: each entry, fed values it never writes, reports
    (skipped/failed with a reason) and leaves the process as it was."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    path, env, cwd = list(sys.path), dict(os.environ), os.getcwd()
    dtype, r_state = torch.get_default_dtype(), random.getstate()
    for bad in [*HOSTILE, _nested(5000)]:
        rows = procstate.restore({"format": 1, "entries": {entry: bad}})
        assert rows, (entry, bad)
        for r in rows:
            assert r.status in ALLOWED, (entry, bad, r)
            if r.status != "restored":
                assert r.reason, (entry, bad, r)
    assert sys.path == path and dict(os.environ) == env and os.getcwd() == cwd
    assert torch.get_default_dtype() == dtype and random.getstate() == r_state


@pytest.mark.parametrize("bad", ["x", 3, [], {"format": 2}, {"format": 1, "entries": []},
                                 {"format": 1, "entries": {"from.a.newer.version": {}}}])
def test_hostile_whole_state(bad):
    rows = procstate.restore(bad)
    assert rows and all(r.status == "skipped" and r.reason for r in rows)


def test_engine_restores_process_state_before_any_variable(tmp_path, key, store, monkeypatch):
    """A class from a directory the notebook put on sys.path: its instance comes back only
    because sys.path is put back first."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "jp_user_model.py").write_text("class Model:\n    def __init__(self):\n"
                                          "        self.w = 3\n")
    sys.path.insert(0, str(lib))
    import jp_user_model

    random.seed(5)
    res = cp.write({"m": jp_user_model.Model()}, store, key=key, process_state=True)
    assert {r.name: r.status for r in res.process_state}["sys.path"] == "saved"
    expected = random.random()
    sys.path.remove(str(lib))
    del sys.modules["jp_user_model"]
    random.seed(6)
    plain = cp.read(store, key=key)  # without process state: nothing of the process changes
    assert plain.process_state == [] and str(lib) not in sys.path
    assert {v.name: v.status for v in plain.variables} == {"m": "failed"}
    rr = cp.read(store, key=key, process_state=True)
    assert rr.values["m"].w == 3
    assert random.random() == expected
    del sys.modules["jp_user_model"]


def test_checkpoint_without_process_state_restores_nothing(tmp_path, key, store):
    """A manifest as earlier versions wrote it (no ``process`` field at all) reads as before."""
    res = cp.write({"x": 41}, store, key=key)
    path = store.manifest_path(res.manifest.stream, res.checkpoint_id)
    with open(path, "rb") as f:
        d = json.loads(f.read())
    assert d.pop("process") == {}
    d["hmac"] = hmac.new(key, canonical(d), hashlib.sha256).hexdigest()
    with open(path, "w") as f:
        json.dump(d, f)
    rr = cp.read(store, key=key, process_state=True)
    assert rr.values == {"x": 41} and rr.process_state == [] and rr.manifest.process == {}
