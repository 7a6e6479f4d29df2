"""The server's calls (checkpoint / restore / liveness / recompute) through bridge.run_bridge."""

from __future__ import annotations

import pytest

from .bridge_util import bridge

pytestmark = pytest.mark.timeout(120)

STATE = (
    "(sorted(get_ipython().user_ns), get_ipython().execution_count, "
    "len(get_ipython().history_manager.input_hist_raw))"
)


def test_bridge_checkpoint_liveness_restore_recompute(kernel_factory, tmp_path):
    k = kernel_factory()  # never ran %load_ext: the bridge installs the provenance hooks itself
    k.ok("import numpy as np")
    k.ok("data = np.arange(200_000)\nlabel = 'run-1'")
    k.ok("squares = (i * i for i in range(5))")
    store = str(tmp_path / "server-store")
    key = str(tmp_path / "server.key")

    before = at_checkpoint = k.eval(STATE)
    progress: list = []
    res = bridge(
        k,
        "checkpoint",
        progress=progress,
        store_url=store,
        key_path=key,
        stream="nb/analysis.ipynb",
        token="tok-123",
        meta={"kernel_id": "k1"},
        keep=3,
    )
    assert res["ok"] is True, res
    assert res["token"] == "tok-123" and res["pid"] == k.eval("__import__('os').getpid()")
    assert res["bytes_total"] >= 200_000 * 8
    status = {v["name"]: v["status"] for v in res["variables"]}
    assert status["data"] == "saved" and status["squares"] == "skipped"
    assert progress and progress[-1][0] == progress[-1][1] == res["bytes_total"]
    assert k.eval(STATE) == before  # no names, no history, no execution count

    live = bridge(k, "liveness")
    assert live["token"] == "tok-123" and live["provenance"] is True

    k.restart()
    fresh = bridge(k, "liveness")
    assert fresh["token"] is None and fresh["restored"] is None
    before = k.eval(STATE)
    progress = []
    res = bridge(
        k,
        "restore",
        progress=progress,
        store_url=store,
        key_path=key,
        stream="nb/analysis.ipynb",
        checkpoint_id=None,
        device="cpu",
        only=None,
    )
    assert res["ok"] is True, res
    assert progress
    rows = {v["name"]: v for v in res["variables"]}
    assert rows["data"]["status"] == "restored"
    assert rows["squares"]["recomputable"] is True
    assert rows["squares"]["cell"]["source"] == "squares = (i * i for i in range(5))"
    assert k.eval("(int(data.sum()), label, np.__name__)") == (
        sum(range(200_000)),
        "run-1",
        "numpy",
    )
    after = k.eval(STATE)
    # the variables, the modules, and IPython's input history come back (process state)
    assert set(after[0]) - set(before[0]) == {"data", "label", "np", "_i1", "_i2", "_i3"}
    # the next cell is numbered on from the checkpointed kernel, not from [1]
    assert after[1:] == at_checkpoint[1:] == (4, 4)
    assert res["process_state"], res  # reported apart from the variables
    restored = bridge(k, "liveness")
    assert (
        restored["token"] is None and restored["restored"]["checkpoint_id"] == res["checkpoint_id"]
    )

    # liveness carries the restore's rows, so a server that finds the kernel already restored
    # can still report what came back
    assert {v["name"]: v["status"] for v in restored["restored"]["variables"]} == {
        v["name"]: v["status"] for v in res["variables"]
    }
    rec = bridge(k, "recompute", names=["squares"])
    assert rec["ok"] is True
    assert [(v["name"], v["status"]) for v in rec["variables"]] == [("squares", "recomputed")]
    rows = {v["name"]: v for v in bridge(k, "liveness")["restored"]["variables"]}
    assert rows["squares"]["status"] == "recomputed" and rows["data"]["status"] == "restored"
    assert k.eval("list(squares)") == [0, 1, 4, 9, 16]
    assert k.eval(STATE)[1:] == after[1:]  # a recompute is not a cell of the person's


def test_bridge_errors_are_one_line(kernel_factory, tmp_path):
    k = kernel_factory()
    k.ok("x = 1")
    res = bridge(
        k,
        "restore",
        store_url=str(tmp_path / "nothing"),
        key_path=None,
        stream="s",
        checkpoint_id=None,
        device="auto",
        only=None,
    )
    assert res["ok"] is False and "\n" not in res["error"]
    assert k.eval("x") == 1
    res = bridge(k, "restore", store_url=None, key_path=None, stream="s", device="tpu")
    assert res["ok"] is False


def test_second_checkpoint_is_incremental(kernel, tmp_path):
    # One WriteCache per kernel process and store, shared by %checkpoint and the bridge.
    kernel.ok("import numpy as np\nbig = np.random.default_rng(1).random(250_000)\nsmall = [1, 2]")
    store = str(tmp_path / "inc-store")
    kernel.ok(f"%checkpoint --to {store}")
    first = bridge(kernel, "checkpoint", store_url=store, stream="analysis.ipynb")
    assert first["ok"] and first["bytes_total"] >= 2_000_000
    assert first["bytes_written"] < first["bytes_total"] // 10  # the magic already wrote it
    kernel.ok("small.append(3)")
    second = bridge(kernel, "checkpoint", store_url=store, stream="analysis.ipynb")
    assert second["ok"] and second["bytes_written"] < 10_000
