"""Weak references in the stored graph point at the restored objects after a restore.

A weak reference is saved with its referent and grouped with every variable that holds the
referent (graph.py follows weak references), so pickle's memo rebuilds it onto the restored
object. One whose referent no saved variable holds comes back dead, and the restore says so by
variable name. A ``weakref.proxy`` is relinked the same way.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from jupyter_pause.checkpoint import read, write

from .helpers import statuses
from .resume_run import assert_continues


class Node:
    def __init__(self, name: str) -> None:
        self.name = name

    def hello(self) -> str:
        return f"hello from {self.name}"


def _roundtrip(ns, store, key):
    res = write(ns, store, key=key)
    rr = read(store, key=key)
    return res, rr, rr.load_notes


def test_forward_hook_handle_removes_the_hook_from_the_restored_module(store, key):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 2)
    handle = model.register_forward_hook(print)
    pre = model.register_forward_pre_hook(print, with_kwargs=True)
    _, rr, notes = _roundtrip({"model": model, "handle": handle, "pre": pre}, store, key)
    m, h, p = rr.values["model"], rr.values["handle"], rr.values["pre"]
    assert statuses(rr.variables) == {"model": "restored", "handle": "restored", "pre": "restored"}
    assert list(m._forward_hooks) == [h.id]
    h.remove()
    assert not m._forward_hooks  # the restored module's own hook dict, not a copy
    p.remove()
    assert not m._forward_pre_hooks and not m._forward_pre_hooks_with_kwargs
    assert not notes


def test_hook_fires_and_is_removable_in_a_fresh_process(tmp_path):
    pytest.importorskip("torch")
    setup = """
    import torch
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
    seen = []
    def record(mod, inp, out):
        seen.append(round(float(out.sum()), 6))
    handle = net[0].register_forward_hook(record)
    net(torch.ones(1, 3))
    """
    after = """
    net(torch.full((1, 3), 2.0))
    emit(list(seen))
    handle.remove()
    net(torch.ones(1, 3))
    emit(len(seen))  # removed: the hook did not fire again
    emit(len(net[0]._forward_hooks))
    """
    a, _ = assert_continues(setup, after, tmp_path)
    assert a["out"][1] == 2 and a["out"][2] == 0


def test_weak_containers_and_refs_point_at_restored_objects(store, key):
    a, b, c = Node("a"), Node("b"), Node("c")
    nodes = [a, b, c]
    ns = {
        "nodes": nodes,
        "ref": weakref.ref(a),
        "by_name": weakref.WeakValueDictionary({"a": a, "b": b}),
        "tags": weakref.WeakKeyDictionary({a: "first", c: "third"}),
        "live": weakref.WeakSet([b, c]),
        "method": weakref.WeakMethod(c.hello),
    }
    _, rr, notes = _roundtrip(ns, store, key)
    v = rr.values
    ra, rb, rc = v["nodes"]
    assert ra is not a  # a restored copy...
    assert v["ref"]() is ra  # ...that the weak reference now points at
    assert v["by_name"]["a"] is ra and v["by_name"]["b"] is rb
    assert v["tags"][ra] == "first" and v["tags"][rc] == "third"
    assert set(v["live"]) == {rb, rc}
    assert v["method"]()() == "hello from c" and v["method"]().__self__ is rc
    # and they are still weak: dropping the restored objects empties them
    del ra, rb, rc
    v["nodes"].clear()
    gc.collect()
    assert v["ref"]() is None and len(v["by_name"]) == 0 and len(v["live"]) == 0
    assert not notes


def test_finalizer_runs_for_the_restored_object(store, key):
    calls = []
    obj = Node("x")
    fin = weakref.finalize(obj, calls.append, "gone")
    _, rr, _ = _roundtrip({"obj": obj, "fin": fin, "calls": calls}, store, key)
    fin.detach()
    v = rr.values
    assert v["fin"].alive and v["fin"].peek()[0] is v["obj"]
    restored_calls = v["calls"]
    del v["obj"]
    gc.collect()
    assert restored_calls == ["gone"] and not v["fin"].alive


def test_weakref_to_an_object_nobody_saved_comes_back_dead_and_is_named(store, key):
    keep = Node("kept")
    gone = Node("not saved")
    ns = {"keep": keep, "ref_kept": weakref.ref(keep), "ref_gone": weakref.ref(gone)}
    res, rr, notes = _roundtrip(ns, store, key)
    assert statuses(res.variables) == {"keep": "saved", "ref_kept": "saved", "ref_gone": "saved"}
    assert rr.values["ref_kept"]() is rr.values["keep"]
    assert rr.values["ref_gone"]() is None
    assert list(notes) == ["ref_gone"], notes
    assert "came back dead" in notes["ref_gone"][0] and "Node" in notes["ref_gone"][0]


def test_weak_proxy_points_at_the_restored_object(store, key):
    """lightning's Trainer hands its loops ``weakref.proxy(trainer)``."""
    n, unsaved = Node("p"), Node("not saved")
    gone = weakref.proxy(n.hello)  # its bound method is already gone: dead, now and later
    meth = unsaved.hello  # alive until the checkpoint, but no saved variable holds it
    ns = {"n": n, "p": weakref.proxy(n), "call": weakref.proxy(meth), "gone": gone}
    _, rr, notes = _roundtrip(ns, store, key)
    v = rr.values
    assert set(statuses(rr.variables).values()) == {"restored"}
    assert v["p"].name == "p" and v["p"].hello() == "hello from p"
    v["n"].name = "renamed"
    assert v["p"].name == "renamed"  # the restored object itself, not a copy of it
    # the bound method was only held by the proxy: it comes back dead, and says so
    assert list(notes) == ["call"] and "came back dead" in notes["call"][0]
    for dead in ("call", "gone"):
        with pytest.raises(ReferenceError):
            v[dead]()
