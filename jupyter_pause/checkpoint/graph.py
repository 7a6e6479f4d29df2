"""Co-variable groups: variables whose object graphs share an object are stored together.

One breadth-first walk over ``gc.get_referents`` for the whole namespace; every gc-tracked object
is visited once and "owned" by the first variable that reaches it, and reaching an owned object
unions the two variables. The walk is kept cheap for namespaces of millions of small objects:
- filtering of referents happens in C (``map``/``compress``), Python loops only see the few
  objects that need a decision (modules, classes, functions, arrays, tensors);
- untracked mutable leaves (dicts of atomic values, bytearrays) are not hashed one by one: their
  ids go into numpy arrays and one sort at the end finds leaves reached by two variables;
- numpy arrays and torch tensors are keyed by the memory they view (root buffer, storage), not
  traversed, so views and shared storage tie their variables together.
Modules, module dicts (function globals), and classes/functions importable by name stop the walk:
they are pickled by reference, so sharing them does not tie variables together.
"""

from __future__ import annotations

import gc
import sys
import types
from itertools import chain, compress, repeat
from operator import not_
from typing import Any

_BATCH = 1 << 15
_ATOMIC = (int, float, complex, str, bytes, bool, type(None), range, slice)


class _UF:
    def __init__(self, n: int) -> None:
        self.p = list(range(n))

    def find(self, a: int) -> int:
        p = self.p
        while p[a] != a:
            p[a] = p[p[a]]
            a = p[a]
        return a

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[max(ra, rb)] = min(ra, rb)


def _by_reference(obj: Any) -> bool:
    """True for functions/classes that pickle as a global name (not by value)."""
    mod = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", "")
    return bool(mod) and mod != "__main__" and "<locals>" not in qual and "<lambda>" not in qual


class Walk:
    """Result of grouping: ``groups`` (lists of names) and per-variable size estimates."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.big_bytes: dict[str, int] = {}
        self.array_ids: set[int] = set()  # numpy arrays reachable from the namespace


def group_variables(items: list[tuple[str, Any]], namespace: Any = None) -> Walk:
    was_enabled = gc.isenabled()
    gc.disable()  # a collection mid-walk could untrack dicts and hide an alias
    try:
        return _group(items, namespace)
    finally:
        if was_enabled:
            gc.enable()


def _group(items: list[tuple[str, Any]], namespace: Any) -> Walk:
    walker = _Walker(namespace, len(items))
    for vi, (_name, value) in enumerate(items):
        walker.walk(vi, value)
    _union_shared_leaves(walker.np, walker.uf, walker.owner, walker.leaves, walker.leaf_sets)
    groups: dict[int, list[str]] = {}
    for vi, (name, _v) in enumerate(items):
        groups.setdefault(walker.uf.find(vi), []).append(name)
    w = Walk()
    w.groups = list(groups.values())
    w.big_bytes = {name: walker.big[vi] for vi, (name, _v) in enumerate(items)}
    w.array_ids = walker.array_ids
    return w


class _Walker:
    """The walk's state: who owns what, the union of variables, their big-memory sizes."""

    def __init__(self, namespace: Any, n: int) -> None:
        np = sys.modules.get("numpy")
        if np is None:
            try:  # not for arrays (there are none), for sorting leaf ids: far cheaper than a set
                import numpy as np
            except ImportError:
                np = None
        self.np = np
        torch = sys.modules.get("torch")
        self.ndarray = np.ndarray if np is not None and "numpy" in sys.modules else None
        self.tensor = torch.Tensor if torch is not None else None
        # tracked objects that need a per-object decision (pickled by name, or keyed by memory)
        self.slow_tracked = (types.ModuleType, type, types.FunctionType) + (
            (self.tensor,) if self.tensor is not None else ()
        )
        # untracked but mutable, so sharing them is aliasing: dicts of atomic values, bytearrays
        self.leafy = (dict, bytearray) + ((self.ndarray,) if self.ndarray is not None else ())
        self.stop_ids = {id(m.__dict__) for m in list(sys.modules.values())
                         if hasattr(m, "__dict__")}
        if namespace is not None:
            self.stop_ids.add(id(namespace))
        self.uf = _UF(n)
        self.owner: dict[Any, int] = {}  # tracked objects (and memory keys) -> first variable
        self.leaves: list[Any] = []  # per variable: ids of untracked mutable leaves (numpy)
        self.leaf_sets: dict[int, set[int]] = {}  # the same without numpy
        self.big = [0] * n  # per variable: bytes of array/tensor memory it owns
        self.array_ids: set[int] = set()

    def walk(self, vi: int, value: Any) -> None:
        """Breadth-first over everything variable ``vi`` reaches."""
        if isinstance(value, _ATOMIC):
            return
        frontier: list[Any] = []
        if isinstance(value, self.slow_tracked) or (
            self.ndarray is not None and isinstance(value, self.ndarray)
        ):
            self.slow(value, vi, frontier)
        elif id(value) not in self.stop_ids:
            if gc.is_tracked(value):
                if self.claim(id(value), vi):
                    frontier.append(value)
            else:
                self.add_leaves(vi, [value], frontier)
        while frontier:
            level, frontier = frontier, []
            for refs in _batches(level):
                self.step(refs, vi, frontier)

    def claim(self, key: Any, vi: int) -> bool:
        """Own ``key`` for variable vi; False (and union) if someone already did."""
        o = self.owner.get(key)
        if o is None:
            self.owner[key] = vi
            return True
        if o != vi:
            self.uf.union(o, vi)
        return False

    def slow(self, r: Any, vi: int, nxt: list) -> None:
        """An object that needs a decision: pickled by name, or keyed by the memory it views."""
        if isinstance(r, types.ModuleType) or (
            isinstance(r, (type, types.FunctionType)) and _by_reference(r)
        ):
            return
        i = id(r)
        ndarray, tensor = self.ndarray, self.tensor
        if ndarray is not None and isinstance(r, ndarray):
            self.array_ids.add(i)
            if not self.claim(i, vi):
                return
            base = r
            while isinstance(getattr(base, "base", None), ndarray):
                base = base.base
            root = base.base if base.base is not None else base
            if self.claim(("mem", id(root)), vi):
                self.big[vi] += base.nbytes
            return
        if tensor is not None and isinstance(r, tensor):
            if not self.claim(i, vi):
                return
            try:
                st = r.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                st = None  # sparse/meta/wrapper tensors: the walk below still links them
            if st is not None and self.claim(("st", st._cdata), vi):
                self.big[vi] += st.nbytes()
            nxt.append(r)  # a tensor's __dict__ / grad may hold more
            return
        if i not in self.stop_ids and self.claim(i, vi):
            nxt.append(r)  # a class or function defined in the notebook: walk into it

    def add_leaves(self, vi: int, objs: list, nxt: list) -> None:
        """Untracked mutable objects: record their identity; an untracked dict can still hold
        non-gc objects such as numpy arrays or bytearrays, so look one level in."""
        if not objs:
            return
        ndarray, owner, leafy = self.ndarray, self.owner, self.leafy
        # values only (keys are hashable, so never a dict, array or bytearray), and a full scan
        # only when one of their types calls for it: usually they are all int/float/str
        dicts = [o for o in objs if type(o) is dict] if len(objs) < 64 else objs
        if dicts is objs and not all(map(isinstance, objs, repeat(dict))):
            dicts = [o for o in objs if isinstance(o, dict)]
        inner = list(chain.from_iterable(map(dict.values, dicts)))
        if inner and any(issubclass(t, leafy) for t in set(map(type, inner))):
            for r in compress(inner, map(isinstance, inner, repeat(leafy))):
                if ndarray is not None and isinstance(r, ndarray):
                    if id(r) not in owner:
                        self.slow(r, vi, nxt)
                    elif owner[id(r)] != vi:
                        self.uf.union(owner[id(r)], vi)
                else:
                    objs.append(r)  # a bytearray (an untracked dict holds no dict)
        np = self.np
        if np is not None:
            self.leaves.append((vi, np.fromiter(map(id, objs), dtype=np.int64, count=len(objs))))
        else:
            self.leaf_sets.setdefault(vi, set()).update(map(id, objs))

    def step(self, refs: list, vi: int, frontier: list) -> None:
        """One batch of referents of variable vi's current level."""
        # the filtering runs in C (map/compress); Python loops only over "slow" objects
        ndarray, owner, uf = self.ndarray, self.owner, self.uf
        tracked_flags = list(map(gc.is_tracked, refs))
        tracked = list(compress(refs, tracked_flags))
        untracked = list(compress(refs, map(not_, tracked_flags)))
        leaf = list(compress(untracked, map(isinstance, untracked, repeat(self.leafy))))
        del refs, tracked_flags, untracked
        if ndarray is not None and leaf:
            arrays = list(map(isinstance, leaf, repeat(ndarray)))
            for r in compress(leaf, arrays):
                self.slow(r, vi, frontier)
            leaf = list(compress(leaf, map(not_, arrays)))
        self.add_leaves(vi, leaf, frontier)
        is_slow = list(map(isinstance, tracked, repeat(self.slow_tracked)))
        for r in compress(tracked, is_slow):
            o = owner.get(id(r))
            if o is None:
                self.slow(r, vi, frontier)
            elif o != vi:
                uf.union(o, vi)
        cands = list(compress(tracked, map(not_, is_slow)))
        if not cands:
            return
        ids = set(map(id, cands))
        ids.difference_update(self.stop_ids)
        for i in ids & owner.keys():
            o = owner[i]
            if o != vi:
                uf.union(o, vi)
        new = ids - owner.keys()
        if not new:
            return
        owner.update(dict.fromkeys(new, vi))
        frontier.extend({id(r): r for r in cands if id(r) in new}.values())


def _batches(level: list) -> Any:
    """The referents of ``level`` in slices of _BATCH. Each slice is a few milliseconds of C
    work; between slices the interpreter can hand the GIL to the blob-writer threads, which a
    single pass over a million objects would starve for a second or more."""
    for i in range(0, len(level), _BATCH):
        refs = gc.get_referents(*level[i : i + _BATCH])
        for j in range(0, len(refs), _BATCH):
            yield refs[j : j + _BATCH]


def _union_shared_leaves(np: Any, uf: _UF, owner: dict, leaves: list, leaf_sets: dict) -> None:
    """Union variables that reach the same untracked leaf (or a leaf that is another variable's
    tracked object): one vectorised sort instead of a hash insert per leaf."""
    if np is not None and leaves:
        tracked_ids = [k for k in owner if isinstance(k, int)]
        ids = [a for _, a in leaves]
        vis = [np.full(len(a), vi, dtype=np.int64) for vi, a in leaves]
        if tracked_ids:
            ids.append(np.fromiter(tracked_ids, dtype=np.int64, count=len(tracked_ids)))
            vis.append(
                np.fromiter((owner[k] for k in tracked_ids), dtype=np.int64, count=len(tracked_ids))
            )
        all_ids = np.concatenate(ids)
        all_vis = np.concatenate(vis)
        order = np.argsort(all_ids, kind="stable")
        all_ids, all_vis = all_ids[order], all_vis[order]
        dup = np.flatnonzero((all_ids[1:] == all_ids[:-1]) & (all_vis[1:] != all_vis[:-1]))
        for k in dup.tolist():
            uf.union(int(all_vis[k]), int(all_vis[k + 1]))
    elif leaf_sets:
        seen: dict[int, int] = {k: v for k, v in owner.items() if isinstance(k, int)}
        for vi, ids in leaf_sets.items():
            for i in ids & seen.keys():
                if seen[i] != vi:
                    uf.union(seen[i], vi)
            seen.update(dict.fromkeys(ids - seen.keys(), vi))
