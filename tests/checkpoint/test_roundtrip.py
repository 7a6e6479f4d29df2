"""Round trips: the object kinds of a notebook namespace, library state, aliasing, reports."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import io
import mmap
import queue
import socket
import sqlite3
import subprocess
import sys
import threading
import weakref

import numpy as np
import pandas as pd
import pytest

from jupyter_pause.checkpoint import read, write

from .helpers import statuses


async def _coro():
    return 1


def test_object_kinds_from_the_reference_table(store, key, tmp_path):
    rfile = open(tmp_path / "r.txt", "w+")  # noqa: SIM115 - the open handle is the point
    wfile = open(tmp_path / "w.txt", "w")  # noqa: SIM115
    conn = sqlite3.connect(":memory:")
    sock = socket.socket()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    loop = asyncio.new_event_loop()
    mm = mmap.mmap(-1, 4096)
    coro = _coro()
    popen = subprocess.Popen([sys.executable, "-c", "pass"])
    target = {"alive": True}
    held = threading.Lock()
    held.acquire()
    ns = {
        "held": held,
        "lock": threading.Lock(),
        "rlock": threading.RLock(),
        "event": threading.Event(),
        "thread": threading.Thread(target=lambda: None),
        "q": queue.Queue(),
        "rfile": rfile,
        "wfile": wfile,
        "gen": (i for i in range(3)),
        "coro": coro,
        "sock": sock,
        "conn": conn,
        "cur": conn.cursor(),
        "pool": pool,
        "loop": loop,
        "popen": popen,
        "mm": mm,
        "mv": memoryview(b"abc"),
        "frame": sys._getframe(),
        "sha": hashlib.sha256(b"x"),
        "np_mod": np,
        "bio": io.BytesIO(b"bytes io"),
        "target": target,
        "ref": weakref.ref(weakref.WeakValueDictionary),
        # plain values that must come back whatever else fails
        "n": 42,
        "text": "hello",
        "lst": [1, 2.5, "x", None],
        "d": {"a": {"b": [1, 2]}},
        "t": (1, "two"),
        "s": {1, 2, 3},
        "by": b"\x00\x01",
        "cx": 1 + 2j,
    }
    try:
        res = write(ns, store, key=key)
        st = statuses(res.variables)
        for name in ("held", "thread", "rfile", "wfile", "popen"):
            assert st[name] == "stale", (name, st[name])
        for name in ("lock", "rlock", "event", "q"):  # free: a new one is the same
            assert st[name] == "saved", (name, st[name])
        for name in (
            "gen",
            "coro",
            "sock",
            "conn",
            "cur",
            "pool",
            "loop",
            "mm",
            "mv",
            "frame",
            "sha",
        ):
            assert st[name] == "skipped", (name, st[name])
        reasons = {v.name: v.reason for v in res.variables}
        assert "generator" in reasons["gen"]
        assert "held when the checkpoint was taken" in reasons["held"]
        assert "sqlite3" in reasons["conn"]
        rr = read(store, key=key)
        v = rr.values
        assert v["np_mod"] is np
        assert v["bio"].getvalue() == b"bytes io"
        for name in ("n", "text", "lst", "d", "t", "s", "by", "cx"):
            assert v[name] == ns[name]
        assert "held" not in v and "gen" not in v
        assert not v["lock"].locked() and v["q"].empty() and not v["event"].is_set()
        rst = statuses(rr.variables)
        assert rst["held"] == "stale" and rst["gen"] == "skipped" and rst["n"] == "restored"
    finally:
        rfile.close()
        wfile.close()
        conn.close()
        sock.close()
        pool.shutdown()
        loop.close()
        mm.close()
        coro.close()
        popen.wait()


def test_read_mode_files_come_back_at_their_position_unless_the_file_changed(store, key, tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n3,4\n")
    fh = open(data)  # noqa: SIM115 - the open handle is the point
    header = fh.readline()
    try:
        write({"fh": fh, "header": header}, store, key=key)
        rr = read(store, key=key)
        assert statuses(rr.variables) == {"fh": "restored", "header": "restored"}
        assert (rr.values["fh"].mode, rr.values["fh"].readline()) == ("r", "1,2\n")
        rr.values["fh"].close()
        data.write_text("a,b\n1,2\n3,4\n5,6\n")
        rr = read(store, key=key)
        failed = {v.name: v for v in rr.variables}["fh"]
        assert failed.status == "failed" and "fh" not in rr.values
        assert f"{data} changed since the checkpoint (size 12 -> 16 bytes)" in failed.reason
        assert rr.values["header"] == "a,b\n"
    finally:
        fh.close()


def test_numpy_pandas_sklearn(store, key):
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    y = (X[:, 0] > 0).astype(int)
    clf = LogisticRegression().fit(X, y)
    df = pd.DataFrame(
        {
            "i": np.arange(100_000, dtype=np.int64),
            "f": rng.normal(size=100_000),
            "c": pd.Categorical(["a", "b", "c", "d"] * 25_000),
            "t": pd.date_range("2026-01-01", periods=100_000, freq="s"),
        }
    )
    big = rng.normal(size=(512, 512)).astype(np.float32)  # 1 MiB: goes out of band
    ns = {"X": X, "clf": clf, "df": df, "big": big, "small": np.arange(5)}
    res = write(ns, store, key=key)
    assert all(v.status == "saved" for v in res.variables)
    kinds = {b["kind"] for b in res.manifest.blobs.values()}
    assert "buffer" in kinds  # large arrays left the pickle stream
    v = read(store, key=key).values
    np.testing.assert_array_equal(v["X"], X)
    np.testing.assert_array_equal(v["clf"].predict(X), clf.predict(X))
    pd.testing.assert_frame_equal(v["df"], df)
    np.testing.assert_array_equal(v["big"], big)
    v["big"][0, 0] = 7  # restored arrays are writable
    assert v["big"][0, 0] == 7


def test_torch_model_optimizer_views_shared_tied(store, key):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10))
    model[1].weight = model[0].weight  # tied weights (10x8 both)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 10, (4,))
    model(x).sum().backward()
    opt.step()
    base = torch.arange(20.0)
    view = base[5:10]
    other = base.view(4, 5).t()  # non-contiguous view of the same storage
    half = torch.ones(3, dtype=torch.bfloat16)
    loss = model(x).sum()  # non-leaf with a graph: saved by value
    ns = {
        "model": model,
        "opt": opt,
        "base": base,
        "view": view,
        "other": other,
        "half": half,
        "loss": loss,
    }
    res = write(ns, store, key=key)
    assert all(v.status == "saved" for v in res.variables), res.variables
    assert all(t["dtype"] and t["shape"] and t["device"] == "cpu" for t in res.manifest.tensors)
    rr = read(store, key=key)
    v, notes = rr.values, rr.load_notes  # the kernel's report turns these "restored" to "stale"
    assert list(notes) == ["loss"] and "without its autograd graph" in notes["loss"][0]
    m2, o2 = v["model"], v["opt"]
    assert o2.param_groups[0]["params"][0] is m2[0].weight
    assert m2[1].weight is m2[0].weight
    torch.testing.assert_close(m2[0].weight, model[0].weight)
    st = o2.state[o2.param_groups[0]["params"][0]]
    torch.testing.assert_close(
        st["exp_avg"], opt.state[opt.param_groups[0]["params"][0]]["exp_avg"]
    )
    v["base"][6] = 100.0
    assert v["view"][1].item() == 100.0  # the view still shares its base
    assert v["other"][1, 1].item() == 100.0 and v["other"].stride() == other.stride()
    assert v["half"].dtype == torch.bfloat16 and v["half"].sum().item() == 3
    assert not v["loss"].requires_grad and v["loss"].item() == pytest.approx(loss.item())
    # training continues on the restored model (storages are writable, files untouched)
    o2.zero_grad()
    m2(x).sum().backward()
    o2.step()
    v2 = read(store, key=key).values
    torch.testing.assert_close(v2["model"][0].weight, model[0].weight)


def test_aliasing_across_variables(store, key):
    shared = [1, 2, 3]
    arr = np.arange(10)
    rows = [{"id": i} for i in range(100)]  # untracked leaf dicts, shared by a slice
    buf = bytearray(b"abc")
    ns = {
        "a": shared,
        "b": {"x": shared},
        "c": (shared, 1),
        "lone": [1, 2, 3],
        "same": shared,
        "arr": arr,
        "data": {"X": arr},
        "rows": rows,
        "train": rows[:10],
        "first": rows[3],
        "buf": buf,
        "holder": {"b": buf},
    }
    res = write(ns, store, key=key)
    groups = {v["name"]: v["group"] for v in res.manifest.variables}
    assert groups["a"] == groups["b"] == groups["c"] == groups["same"] != groups["lone"]
    v = read(store, key=key).values
    assert v["b"]["x"] is v["a"] and v["c"][0] is v["a"] and v["same"] is v["a"]
    assert v["lone"] is not v["a"]
    assert v["data"]["X"] is v["arr"]
    assert v["train"][3] is v["rows"][3] is v["first"]
    assert v["holder"]["b"] is v["buf"]


def test_one_bad_variable_in_a_linked_group_spares_the_others(store, key):
    shared = {"k": 1}
    bad = [shared, (i for i in range(2))]
    ns = {"good1": [shared], "good2": {"s": shared}, "bad": bad}
    res = write(ns, store, key=key)
    st = statuses(res.variables)
    assert st == {"good1": "saved", "good2": "saved", "bad": "skipped"}
    v = read(store, key=key).values
    assert v["good1"][0] is v["good2"]["s"]


def test_provenance_include_exclude_max_size_progress(store, key):
    calls = []
    ns = {
        "a": 1,
        "b": np.zeros(2_000_000),
        "c": "x",
        "_private": 2,
        "_": 3,
        "In": [],
        "gen": (i for i in range(1)),
    }
    prov = {"gen": {"execution_count": 7, "source": "gen = (i for i in range(1))"}}
    res = write(
        ns,
        store,
        key=key,
        provenance=prov,
        max_size=1_000_000,
        exclude=["c"],
        progress=lambda d, t: calls.append((d, t)),
        meta={"trigger": "test"},
        liveness={"token": "tok", "pid": 1},
    )
    st = statuses(res.variables)
    assert st == {"a": "saved", "b": "skipped", "gen": "skipped"}  # "_" names are hidden
    rep = {v.name: v for v in res.variables}
    assert "size limit" in rep["b"].reason
    assert rep["gen"].cell == {"execution_count": 7, "source": "gen = (i for i in range(1))"}
    assert calls and calls[-1][0] == calls[-1][1] and all(d <= t for d, t in calls)
    m = res.manifest
    assert m.meta == {"trigger": "test"} and m.liveness == {"token": "tok", "pid": 1}
    assert m.env["python"] and "host" in m.env and "numpy" in m.env["packages"]
    rr = read(store, key=key, only=["a", "gen", "nope"], progress=lambda d, t: calls.append(1))
    assert rr.values == {"a": 1}
    rst = {v.name: v for v in rr.variables}
    assert rst["gen"].status == "skipped" and rst["gen"].cell["execution_count"] == 7
    assert rst["nope"].status == "failed"
    res2 = write(ns, store, key=key, include=["c", "a", "_private"])
    assert [v.name for v in res2.variables] == ["c", "a", "_private"]


def test_list_delete_and_ids(store, key):
    from jupyter_pause.checkpoint import NotFoundError

    with pytest.raises(NotFoundError):
        read(store, key=key)
    r1 = write({"a": 1}, store, key=key, stream="nb1.ipynb")
    r2 = write({"a": 2}, store, key=key, stream="nb1.ipynb")
    r3 = write({"b": 3}, store, key=key, stream="other/nb2.ipynb")
    assert [m.id for m in store.list("nb1.ipynb", key=key)] == [r2.checkpoint_id, r1.checkpoint_id]
    assert {m.id for m in store.list(key=key)} == {
        r1.checkpoint_id,
        r2.checkpoint_id,
        r3.checkpoint_id,
    }
    assert all(m.verified for m in store.list(key=key))
    assert read(store, key=key, stream="nb1.ipynb").values == {"a": 2}
    assert read(store, key=key, checkpoint_id=r1.checkpoint_id).values == {"a": 1}
    store.delete(r2.checkpoint_id)
    assert read(store, key=key, stream="nb1.ipynb").values == {"a": 1}
    with pytest.raises(NotFoundError, match="no checkpoint"):
        read(store, key=key, checkpoint_id=r2.checkpoint_id)
    with pytest.raises(NotFoundError):
        store.delete("../../etc")


def test_key_file_is_private_and_stable(tmp_path):
    import os
    import stat

    from jupyter_pause.checkpoint import load_or_create_key

    p = tmp_path / "d" / "k.key"
    k1 = load_or_create_key(str(p))
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert load_or_create_key(str(p)) == k1 and len(k1) == 32


def test_numpy_views_keep_sharing_memory(store, key):
    base = np.arange(1000.0)
    big = np.zeros((512, 300))  # > 1 MiB: its buffer goes out of band
    ns = {
        "base": base,
        "view": base[10:20],
        "col": base.reshape(10, 100)[:, 3],
        "big": big,
        "bigrow": big[7],
        "alone": np.arange(5e5)[5:10],  # its 4 MB root is not in the namespace: a copy
    }
    res = write(ns, store, key=key)
    groups = {v["name"]: v["group"] for v in res.manifest.variables}
    assert groups["base"] == groups["view"] == groups["col"]
    v = read(store, key=key).values
    v["base"][15] = -1.0
    v["base"][203] = -2.0
    assert v["view"][5] == -1.0 and v["col"][2] == -2.0
    v["big"][7, 0] = 5.0
    assert v["bigrow"][0] == 5.0
    np.testing.assert_array_equal(v["alone"], np.arange(5.0, 10.0))
    assert v["alone"].base is None or v["alone"].base.nbytes < 1000


def test_views_of_a_root_no_variable_holds_keep_sharing_it(store, key):
    grid = np.arange(24.0).reshape(4, 6)  # a view of the arange the notebook never named
    days = np.arange("2020-01-01", "2020-01-11", dtype="datetime64[D]")
    w = np.ones(4)  # two views of one small fitted vector
    ns = {"grid": grid, "row": grid[1], "days": days[2:], "coef": w[:3], "tail": w[1:]}
    write(ns, store, key=key)
    v = read(store, key=key).values
    v["grid"][1, 0] = -1.0
    assert v["row"][0] == -1.0 and v["tail"][1] == 1.0
    v["coef"][2] = 7.0
    assert v["tail"][1] == 7.0
    assert v["days"].dtype == days.dtype and v["days"][0] == np.datetime64("2020-01-03")


def test_a_failing_progress_callback_never_fails_the_checkpoint(store, key):
    def broken(done, total):
        raise RuntimeError("the progress display broke")

    res = write({"a": 1, "arr": np.zeros(300_000)}, store, key=key, progress=broken)
    assert statuses(res.variables) == {"a": "saved", "arr": "saved"}
    assert read(store, key=key, progress=broken).values["a"] == 1
