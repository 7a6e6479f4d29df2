"""Lambdas, closures, classes and functions defined in a notebook (``__main__``) come back in a
fresh process that has never seen their source."""

from __future__ import annotations

import json

from .helpers import run_py

WRITER = """
import sys
from jupyter_pause.checkpoint import load_or_create_key, open_store, write

square = lambda x: x * x

def make_adder(n):
    def add(x):
        return x + n + OFFSET
    return add

OFFSET = 100

class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return helper(self.x) + helper(self.y)

def helper(v):
    return v * v

add5 = make_adder(5)
p = Point(3, 4)
q = Point(1, 1)
pts = [p, q]
data = [{"id": i, "score": i / 2, "name": str(i)} for i in range(1000)]
ns = {k: v for k, v in globals().items() if not k.startswith("_") and k not in
      ("sys", "load_or_create_key", "open_store", "write")}
res = write(ns, open_store(sys.argv[1]), key=load_or_create_key(sys.argv[2]))
print({v.name: v.status for v in res.variables})
print({g["pickler"] for g in res.manifest.groups if "data" in g["names"]})
"""

READER = """
import json, sys
from jupyter_pause.checkpoint import load_or_create_key, open_store, read

rr = read(open_store(sys.argv[1]), key=load_or_create_key(sys.argv[2]))
v = rr.values
# a fresh kernel merges the values into its namespace: the functions' globals are that namespace
globals().update(v)
out = {
    "square": square(7), "add5": add5(1), "norm2": p.norm2(), "Point_is_class": type(p) is Point,
    "same_class": type(q) is type(p), "pts_alias": pts[0] is p, "data": data[999]["name"],
    "statuses": {r.name: r.status for r in rr.variables},
}
print(json.dumps(out))
"""


def test_main_definitions_round_trip_in_fresh_process(tmp_path):
    store, keyp = str(tmp_path / "store"), str(tmp_path / "k.key")
    w = run_py(WRITER, store, keyp)
    assert "'square': 'saved'" in w.stdout and "'p': 'saved'" in w.stdout
    assert "{'pickle'}" in w.stdout  # plain data stays on the fast C pickler
    r = run_py(READER, store, keyp)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["square"] == 49
    assert out["add5"] == 106  # closure cell + global lookup in the restored namespace
    assert out["norm2"] == 25
    assert out["Point_is_class"] and out["same_class"] and out["pts_alias"]
    assert out["data"] == "999"
    assert all(s == "restored" for s in out["statuses"].values()), out["statuses"]


NO_TORCH = """
import sys
sys.modules["torch"] = None  # any `import torch` now fails, as on a machine without it
import numpy as np
from jupyter_pause.checkpoint import load_or_create_key, open_store, read, write

store, key = open_store(sys.argv[1]), load_or_create_key(sys.argv[2])
f = lambda x: x + 1
ns = {"arr": np.arange(400_000), "f": f, "d": {"a": 1}}
res = write(ns, store, key=key)
assert all(v.status == "saved" for v in res.variables), res.variables
v = read(store, key=key).values
assert v["f"](1) == 2 and v["arr"].sum() == ns["arr"].sum() and v["d"] == {"a": 1}
print("OK", sys.modules.get("torch"))
"""


def test_engine_works_without_torch(tmp_path):
    r = run_py(NO_TORCH, str(tmp_path / "store"), str(tmp_path / "k.key"))
    assert r.stdout.strip() == "OK None"
