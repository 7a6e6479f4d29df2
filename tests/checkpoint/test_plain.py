"""Plain data pickled without the pickler's memo (``plain.py``): what comes back must be what a
memo pickle brings back, the same values and the same sharing, and the strings that records
share stay shared (memory on restore). Anything the walk met twice keeps the memo."""

from __future__ import annotations

import datetime
import gc
import pickle
import pickletools
import sys

import pytest

from jupyter_pause.checkpoint import graph, pickling, plain, read, write
from jupyter_pause.checkpoint.graph import group_variables
from jupyter_pause.checkpoint.pickling import dump_group_frames

from .helpers import run_py, statuses


def _memo_puts(stream: bytes) -> int:
    return sum(op.name in ("MEMOIZE", "BINPUT", "LONG_BINPUT")
               for op, _a, _p in pickletools.genops(stream))


@pytest.fixture
def plain_calls(monkeypatch):
    """What each plain attempt of the writer returned (True: the stream has no memo)."""
    calls: list[bool] = []

    def spy(values, out):
        ok = plain.dump_plain(values, out)
        calls.append(ok)
        return ok

    monkeypatch.setattr(pickling, "dump_plain", spy)
    return calls


def test_records_come_back_equal_with_keys_and_repeated_values_shared(store, key, plain_calls):
    cats = ["red", "green", "blue"]
    recs = [{"id": i, "name": f"n{i}", "cat": cats[i % 3], "score": i / 7, "tags": ("a", i)}
            for i in range(60_000)]
    by_key = {f"k{i}": {"v": [i, i + 1], "s": {"x", "y"}} for i in range(5_000)}
    res = write({"recs": recs, "by_key": by_key}, store, key=key)
    assert statuses(res.variables) == {"recs": "saved", "by_key": "saved"}
    assert plain_calls == [True, True]
    back = read(store, key=key)
    got = back.values["recs"]
    assert got == recs and back.values["by_key"] == by_key
    # what a memo pickle would keep: five key objects, three category objects, in every record
    assert len({id(k) for r in got for k in r}) == 5
    assert len({id(r["cat"]) for r in got}) == 3
    assert len({id(v) for d in back.values["by_key"].values() for v in d["s"]}) == 2


def test_the_stream_is_one_standard_pickle_without_memo():
    recs = [{"id": i, "name": f"n{i}"} for i in range(10_000)]
    frames, name, ctx = dump_group_frames({"recs": recs}, tree=True)
    stream = frames.getvalue()
    assert name == "pickle" and not ctx.buffers
    assert pickle.loads(stream) == {"recs": recs}  # any standard unpickler reads it
    assert _memo_puts(stream) <= 4  # the seeds ("id", "name") and their tuple
    memo = dump_group_frames({"recs": recs})[0].getvalue()
    assert _memo_puts(memo) > 10_000 and len(stream) < len(memo)
    # seeds too long for one frame: the STOP turned POP is still inside its frame's count
    big = "x" * 300_000
    long = [{"doc": big, "i": i} for i in range(1_000)]
    stream = dump_group_frames({"long": long}, tree=True)[0].getvalue()
    got = pickle.loads(stream)["long"]
    assert got == long and len({id(r["doc"]) for r in got}) == 1
    assert len(stream) < 400_000


def test_what_the_walk_meets_twice_keeps_the_memo(store, key, plain_calls):
    # each variable its own objects: one object in two variables would make them one unit
    def d():
        return {"a": 1}  # untracked: only atoms

    def deep():
        x = d()
        out: list = [x, x]
        for _ in range(100):
            out = [out]
        return out

    cyc: list = []
    cyc.append(cyc)
    t, lst, lst2, lst3, lst4, lst5, far = ("ab", 1.5), [1], [2], [3], [4], [5], d()
    ns = {
        "dict_twice": [(x := d()), x],
        "tuple_twice": [t, t],  # untracked (atoms only): twice is memory, not aliasing
        "list_twice": [lst, lst],
        "wide_twice": [lst5, lst5, *range(40)],  # twice in one batch of the vectorised step
        "batches_apart": [far, *range(3 * graph._BATCH), far],
        "in_one_dict": {"x": lst2, "y": lst2},
        "cycle": cyc,
        "next_level": [lst3, [lst3]],  # a small level (step_small)
        "next_wide_level": [lst4, [lst4, *range(40)]],  # a level of the vectorised step
        "deep": deep(),
        "equal_not_same": [d(), d(), (), ()],
    }
    gc.collect()  # what gc untracks in a notebook over time: a tuple of atoms
    assert not gc.is_tracked(t)
    walk = group_variables(list(ns.items()), ns)
    assert sorted(map(sorted, walk.groups)) == sorted([n] for n in ns)
    assert walk.trees == {"equal_not_same"}
    res = write(ns, store, key=key)
    assert set(statuses(res.variables).values()) == {"saved"}
    assert plain_calls == [True]
    v = read(store, key=key).values
    for name in ("dict_twice", "tuple_twice", "list_twice", "batches_apart"):
        assert v[name][0] is v[name][-1], name
    assert v["wide_twice"][0] is v["wide_twice"][1]
    assert v["in_one_dict"]["x"] is v["in_one_dict"]["y"]
    assert v["cycle"][0] is v["cycle"]
    assert v["next_level"][0] is v["next_level"][1][0]
    assert v["next_wide_level"][0] is v["next_wide_level"][1][0]
    bottom = v["deep"]
    for _ in range(100):
        bottom = bottom[0]
    assert bottom[0] is bottom[1]
    assert v["equal_not_same"] == [{"a": 1}, {"a": 1}, (), ()]
    assert v["equal_not_same"][0] is not v["equal_not_same"][1]


def test_the_walk_without_numpy_finds_the_same_trees(monkeypatch):
    d, d2 = {"a": 1}, {"a": 1}
    ns = {"twice": [d, d], "in_tuple_twice": [(d2,), ] * 2, "once": [{"a": 1}, {"a": 1}]}
    gc.collect()
    monkeypatch.setitem(sys.modules, "numpy", None)  # leaf ids then go into sets
    walk = group_variables(list(ns.items()), ns)
    assert walk.trees == {"once"}


def test_two_variables_sharing_an_object_keep_it_shared(store, key):
    d = {"a": 1}
    ns = {"a": [d], "b": {"k": d}, "c": [{"a": 1}]}
    walk = group_variables(list(ns.items()), ns)
    assert walk.trees == {"c"}  # a and b: one unit, written with the memo
    write(ns, store, key=key)
    v = read(store, key=key).values
    assert v["a"][0] is v["b"]["k"]


def test_strings_shared_too_widely_to_sample_keep_the_memo(store, key, plain_calls):
    cities = [f"city{i}" for i in range(20_000)]
    recs = [{"city": cities[i % 20_000], "i": i} for i in range(100_000)]
    assert plain.shared_atoms(recs) is None  # many cities, each seen once in the sample
    write({"recs": recs}, store, key=key)
    assert plain_calls == [False]
    got = read(store, key=key).values["recs"]
    assert got == recs
    assert len({id(r["city"]) for r in got}) == 20_000  # not 100,000


def test_shared_atoms_finds_periodic_values_and_no_unique_ones():
    cats = ["red", "green", "blue", "cyan"]
    recs = [{"cat": cats[i % 4], "uid": f"u{i}", "xx": cats[0]} for i in range(64 * 64 * 4)]
    found = plain.shared_atoms(recs)
    assert found is not None and set(found) == {"cat", "uid", "xx", "red", "green", "blue", "cyan"}
    assert plain.shared_atoms([f"u{i}" for i in range(10_000)]) == []
    # a small value is sampled whole: a code constant seen once is no sign of more
    assert plain.shared_atoms(frozenset({"ab", "cd"})) is not None
    assert plain.shared_atoms(7) == [] and plain.shared_atoms("text") is not None


def test_values_that_are_not_plain_data_are_pickled_as_before(store, key, plain_calls):
    when = [{"i": i, "at": datetime.datetime(2026, 1, 1) + datetime.timedelta(seconds=i)}
            for i in range(1_000)]
    late = [*({"i": i} for i in range(50_000)), {"i": complex(1, 2)}, range(3)]
    buf = [bytearray(b"abc"), b"\x00" * 10]
    ns = {"when": when, "late": late, "buf": buf}
    res = write(ns, store, key=key)
    assert statuses(res.variables) == dict.fromkeys(ns, "saved")
    assert sorted(plain_calls) == [False, False, True]  # range: not plain; bytearray: plain
    v = read(store, key=key).values
    assert v["when"] == when and v["late"] == late and v["buf"] == buf


def test_a_cycle_through_the_namespace_or_a_module_dict_keeps_the_memo(tmp_path):
    # what the walk stops at (the namespace, a module's dict) it does not look into, so it
    # cannot tell a tree; the sample itself stops at a container met twice (a hang before)
    run_py(f"""
        import sys, types
        from jupyter_pause.checkpoint import load_or_create_key, open_store, read, write
        from jupyter_pause.checkpoint import plain
        from jupyter_pause.checkpoint.graph import group_variables
        ns = {{}}
        ns["env"] = {{"ns": ns}}  # globals() held in a young notebook
        m = types.ModuleType("cfgmod")
        m.items = [1]
        sys.modules["cfgmod"] = m
        ns["x"] = {{"a": m.__dict__, "b": [m.__dict__]}}
        walk = group_variables(list(ns.items()), ns)
        assert not walk.trees & {{"env", "x"}}, walk.trees
        cyc = [[]]
        cyc[0].append(cyc)
        assert plain.plan(cyc) is None
        key = load_or_create_key({str(tmp_path / "k")!r})
        store = open_store({str(tmp_path / "s")!r})
        write({{"x": ns["x"]}}, store, key=key)
        v = read(store, key=key).values
        assert v["x"]["a"] is v["x"]["b"][0]
        print("ok")
    """, timeout=60)


def test_strings_the_sample_cannot_vouch_for_keep_the_memo(store, key, plain_calls):
    marks = ["✓" if i % 3 else "✗" for i in range(300_000)]  # one character, not Latin-1
    doc = "lorem ipsum " * 5_000  # 60 KB, in 800 of 200,000 records: the sample misses it
    recs = [{"id": f"r{i}", "doc": doc if i % 250 == 0 else None} for i in range(200_000)]
    write({"marks": marks, "recs": recs}, store, key=key)
    assert sorted(plain_calls) == [False, True]  # recs: its stream was twice the prediction
    v = read(store, key=key).values
    assert v["marks"] == marks and v["recs"] == recs
    assert len({id(x) for x in v["marks"]}) == 2
    assert len({id(r["doc"]) for r in v["recs"] if r["doc"] is not None}) == 1


def test_a_picklebuffer_goes_out_of_band_as_before(store, key, plain_calls):
    data = bytearray(b"x" * (2 << 20))
    ns = {"pb": [pickle.PickleBuffer(data)]}
    write(ns, store, key=key)
    assert plain_calls == [False]
    back = read(store, key=key).values["pb"][0]
    assert bytes(back) == bytes(data)
