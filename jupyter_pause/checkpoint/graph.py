"""Co-variable groups: variables whose object graphs share an object are stored together.

One breadth-first walk over ``gc.get_referents`` for the whole namespace; every object is visited
once and "owned" by the first variable that reaches it, and reaching an owned object unions the
two variables. The walk is kept cheap: filtering of referents happens in C (``map``/``compress``),
untracked objects (atomic values, dicts/tuples of atomic values) are never descended into, and
numpy arrays and torch tensors are keyed by the memory they view instead of being traversed.
Modules, module dicts (function globals), and classes/functions importable by name stop the walk:
they are pickled by reference, so sharing them does not tie variables together.
"""

from __future__ import annotations

import gc
import sys
import types
from itertools import compress, repeat
from operator import not_, or_
from typing import Any

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


def group_variables(items: list[tuple[str, Any]], namespace: Any = None) -> Walk:
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    ndarray = np.ndarray if np is not None else None
    tensor = torch.Tensor if torch is not None else None
    # objects that need a per-object decision (pickled by name, or keyed by their memory)
    slow_types = (types.ModuleType, type, types.FunctionType) + tuple(
        t for t in (ndarray, tensor) if t is not None
    )
    # untracked but mutable, so sharing them is aliasing: plain dicts of atomic values etc.
    untracked_mutable = (dict, bytearray)

    stop_ids = {id(m.__dict__) for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    if namespace is not None:
        stop_ids.add(id(namespace))

    n = len(items)
    uf = _UF(n)
    owner: dict[Any, int] = {}
    big = [0] * n

    def claim(key: Any, vi: int) -> bool:
        """Own ``key`` for variable vi; False (and union) if someone already did."""
        o = owner.get(key)
        if o is None:
            owner[key] = vi
            return True
        if o != vi:
            uf.union(o, vi)
        return False

    def slow(r: Any, vi: int, nxt: list) -> None:
        if isinstance(r, types.ModuleType) or (
            isinstance(r, (type, types.FunctionType)) and _by_reference(r)
        ):
            return
        i = id(r)
        if ndarray is not None and isinstance(r, ndarray):
            if not claim(i, vi):
                return
            base = r
            while isinstance(getattr(base, "base", None), ndarray):
                base = base.base
            root = base.base if base.base is not None else base
            if claim(("mem", id(root)), vi):
                big[vi] += base.nbytes
            return
        if tensor is not None and isinstance(r, tensor):
            if not claim(i, vi):
                return
            try:
                st = r.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                st = None  # sparse/meta/wrapper tensors: the walk below still links them
            if st is not None and claim(("st", st._cdata), vi):
                big[vi] += st.nbytes()
            nxt.append(r)  # a tensor's __dict__ / grad may hold more
            return
        if i not in stop_ids and claim(i, vi):
            nxt.append(r)  # a class or function defined in the notebook: walk into it

    for vi, (_name, value) in enumerate(items):
        if isinstance(value, _ATOMIC):
            continue
        frontier: list[Any] = []
        if isinstance(value, slow_types):
            slow(value, vi, frontier)
        elif id(value) not in stop_ids and claim(id(value), vi) and gc.is_tracked(value):
            frontier.append(value)
        while frontier:
            refs = gc.get_referents(*frontier)
            frontier = []
            # everything below runs in C except the loops over hits and "slow" objects
            is_slow = list(map(isinstance, refs, repeat(slow_types)))
            for r in compress(refs, is_slow):
                if id(r) in owner:
                    o = owner[id(r)]
                    if o != vi:
                        uf.union(o, vi)
                else:
                    slow(r, vi, frontier)
            fast = list(compress(refs, map(not_, is_slow)))
            keep = map(or_, map(gc.is_tracked, fast), map(isinstance, fast, repeat(untracked_mutable)))
            cands = list(compress(fast, keep))
            if not cands:
                continue
            ids = set(map(id, cands))
            ids.difference_update(stop_ids)
            for i in ids & owner.keys():
                o = owner[i]
                if o != vi:
                    uf.union(o, vi)
            new = ids - owner.keys()
            if not new:
                continue
            owner.update(dict.fromkeys(new, vi))
            tracked = compress(cands, map(gc.is_tracked, cands))
            frontier.extend({id(r): r for r in tracked if id(r) in new}.values())

    groups: dict[int, list[str]] = {}
    for vi, (name, _v) in enumerate(items):
        groups.setdefault(uf.find(vi), []).append(name)
    w = Walk()
    w.groups = list(groups.values())
    w.big_bytes = {name: big[vi] for vi, (name, _v) in enumerate(items)}
    return w
