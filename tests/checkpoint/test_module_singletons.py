"""Objects a library module holds as attributes are saved by reference, like its classes.

A sentinel (``typing_extensions._marker``, ``dataclasses.MISSING``), a process-wide object
(``torch.default_generator``) reached from a variable comes back as the module's own object, so
library code that tests ``x is MISSING`` still works, and a singleton whose ``__reduce__`` names
a global that is another object (``typing_extensions``' sentinel names itself "sentinel", its
class) still saves. In the dill fallback, classes that their module holds by name are saved by
name too (dill looks ``torch.optim.adamw`` up as an attribute of ``torch.optim``, misses it and
saved ``AdamW`` by value, which is how a ``transformers.Trainer`` failed on that sentinel).
Plain containers a module also holds stay the notebook's data: saved by value.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from jupyter_pause.checkpoint import read, write

from .helpers import statuses


class Holder:
    def __init__(self, **kw) -> None:
        self.__dict__.update(kw)


def test_sentinels_come_back_as_the_modules_own(store, key):
    te = pytest.importorskip("typing_extensions")
    marker = getattr(te, "_marker", None)
    if marker is None:
        pytest.skip("this typing_extensions has no module-level sentinel")
    h = Holder(default=marker, missing=dataclasses.MISSING, n=3)
    res = write({"h": h}, store, key=key)
    assert statuses(res.variables) == {"h": "saved"}, res.variables
    back = read(store, key=key).values["h"]
    assert back is not h and back.n == 3
    assert back.default is marker
    assert back.missing is dataclasses.MISSING


def test_process_wide_objects_by_reference_containers_by_value(store, key):
    torch = pytest.importorskip("torch")
    h = Holder(gen=torch.default_generator, path=sys.path, dtype=torch.float64)
    write({"h": h}, store, key=key)
    back = read(store, key=key).values["h"]
    assert back.gen is torch.default_generator
    assert back.dtype is torch.float64
    assert back.path == sys.path and back.path is not sys.path  # the notebook's copy


def test_dill_fallback_saves_library_classes_by_name(store, key):
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(net.parameters())
    net(torch.ones(1, 2)).sum().backward()
    opt.step()
    # a lambda sends the group to dill; its AdamW must still be torch's class, not a copy
    ns = {"net": net, "opt": opt, "sched": torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5)}
    res = write(ns, store, key=key)
    assert {g["pickler"] for g in res.manifest.groups} == {"dill"}
    v = read(store, key=key).values
    assert type(v["opt"]) is torch.optim.AdamW
    assert v["opt"].param_groups[0]["params"][0] is v["net"].weight
    assert v["sched"].optimizer is v["opt"]
    assert torch.equal(v["opt"].state[v["net"].weight]["exp_avg"], opt.state[net.weight]["exp_avg"])
