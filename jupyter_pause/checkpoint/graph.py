"""Co-variable groups: variables whose object graphs share an object are stored together.

One breadth-first walk over ``gc.get_referents`` for the whole namespace; every gc-tracked object
is visited once and "owned" by the first variable that reaches it, and reaching an owned object
unions the two variables. The walk is kept cheap for namespaces of millions of small objects:
- filtering of referents happens in C (``map``/``compress``), Python loops only see the few
  objects that need a decision (modules, classes, functions, arrays, tensors);
- untracked mutable leaves (dicts of atomic values, bytearrays) are not hashed one by one: their
  ids go into numpy arrays and one sort at the end finds leaves reached by two variables;
  untracked dicts and tuples are looked into (gc stops tracking a tuple of arrays or bytearrays,
  and what it holds is shared like anything else);
- numpy arrays and torch tensors are keyed by the memory they view (root buffer, storage), not
  traversed, so views and shared storage tie their variables together.
Modules, module dicts (function globals), and classes/functions importable by name stop the walk:
they are pickled by reference, so sharing them does not tie variables together.

The walk is iterative (a linked list or a nested list of a million levels is a million small
steps, never a recursion) and linear: set operations never iterate the whole ``owner`` map
(``set - dict.keys()`` does, which made deep structures quadratic). Each variable's walk runs
under ``time_limit``; one that takes longer is left out with a reason and the others go on.
Numpy arrays and CPU torch storages are also keyed by the address range of their memory, so
``torch.from_numpy(a)`` and ``t.numpy()`` tie their variables together like views do.
A weak reference is followed to its referent (and a ``weakref.finalize`` to what it holds) as
if it were a strong one: the pickler saves a weakref with its referent (reducers/weakrefs.py),
so a handle and the module whose hook dict it points at must be stored together to stay linked.
"""

from __future__ import annotations

import enum
import gc
import sys
import time
import types
import weakref
from collections.abc import Callable
from itertools import compress, repeat
from operator import not_
from typing import Any

_BATCH = 1 << 15
_SMALL = 16  # a level this small (a chain's one node) skips the vectorised filtering
_PENDING_MAX = 1 << 16  # leaf ids buffered in a list before they become one numpy array
_TICK = 0.25  # seconds between progress callbacks during the walk
_ATOMIC = (int, float, complex, str, bytes, bool, type(None), range, slice)
# kinds of untracked objects (see _Walker.add_leaves); types are classified once
_K_ATOM, _K_TUPLE, _K_DICT, _K_ARRAY, _K_LEAF = range(5)
_MUTABLE_KINDS = frozenset((_K_DICT, _K_LEAF))


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
        # ids of arrays the walk met twice, and of memory roots two arrays view: what a
        # restore must bring back shared (the pickler saves anything else the cheapest way)
        self.shared_arrays: set[int] = set()
        self.skipped: dict[str, str] = {}  # variables whose walk ran past the limit -> reason
        # variables whose graph the walk found to be a tree: no object (container, mutable
        # leaf, tuple) reached twice, so pickling it without the memo brings it back the same
        self.trees: set[str] = set()
        # (lo, hi, obj) of memory that a numpy array and a CPU torch storage both use; obj is an
        # ndarray owning its data or an UntypedStorage (the pickler rebuilds one over the other)
        self.shared_mem: list[tuple[int, int, Any]] = []
        # (lo, hi) of every array or CPU storage whose memory another one also uses
        self.overlaps: list[tuple[int, int]] = []
        self.storages: list[Any] = []  # every CPU torch storage found, once


class _WalkTimeout(Exception):
    pass


def group_variables(
    items: list[tuple[str, Any]],
    namespace: Any = None,
    *,
    time_limit: float | None = None,
    tick: Callable[[int], None] | None = None,
) -> Walk:
    """Group ``items`` (name, value) into co-variable groups. ``time_limit``: seconds one
    variable's walk may take (past it the variable is in ``skipped``, in no group); ``tick``:
    called about every 0.25 s with the array/tensor bytes found so far (progress)."""
    was_enabled = gc.isenabled()
    gc.disable()  # a collection mid-walk could untrack dicts and hide an alias
    try:
        return _group(items, namespace, time_limit, tick)
    finally:
        if was_enabled:
            gc.enable()


def _group(items: list[tuple[str, Any]], namespace: Any, time_limit: float | None,
           tick: Callable[[int], None] | None) -> Walk:
    walker = _Walker(namespace, len(items))
    walker.tick = tick
    w = Walk()
    for vi, (name, value) in enumerate(items):
        walker.deadline = time.monotonic() + time_limit if time_limit and time_limit > 0 else None
        try:
            walker.walk(vi, value)
        except _WalkTimeout:
            walker.forget(vi)
            w.skipped[name] = (f"its object graph took longer than {time_limit:g} s to walk "
                               "(the variable_timeout)")
    walker.deadline = None
    _union_shared_leaves(walker.np, walker.uf, walker.owner, walker.leaves, walker.leaf_sets,
                         walker.repeats)
    nd = walker.ndarray
    w.storages = [m[3] for m in walker.mem if nd is None or not isinstance(m[3], nd)]
    w.shared_mem, w.overlaps = _union_shared_memory(walker.mem, walker.uf)
    groups: dict[int, list[str]] = {}
    for vi, (name, _v) in enumerate(items):
        if name not in w.skipped:
            groups.setdefault(walker.uf.find(vi), []).append(name)
    w.groups = list(groups.values())
    w.big_bytes = {name: walker.big[vi] for vi, (name, _v) in enumerate(items)}
    # (variables linked to others reach what those reach: a group of one at most)
    w.trees = {g[0] for g in w.groups if len(g) == 1} - {
        items[vi][0] for vi in walker.repeats}
    w.array_ids = walker.array_ids
    # an array whose memory a tensor shares is shared too (its views must be rebuilt over it)
    walker.shared.update(id(m[2]) for m in w.shared_mem if nd is not None and isinstance(m[2], nd))
    w.shared_arrays = walker.shared
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
        # (an ndarray subclass with a __dict__ is tracked: np.matrix, a masked array)
        self.slow_tracked = (types.ModuleType, type, types.FunctionType, enum.Enum) + (
            (self.tensor,) if self.tensor is not None else ()
        ) + ((self.ndarray,) if self.ndarray is not None else ())
        # untracked objects by exact type: tuples (looked into), dicts (leaves, looked into),
        # bytearrays (leaves: mutable, so sharing one is aliasing), arrays (keyed by memory);
        # anything else is not linked through (atoms, and shared immutable singletons such as
        # a class, a numpy or torch dtype: linking through those would tie unrelated variables)
        self.kinds: dict[type, int] = dict.fromkeys(_ATOMIC, _K_ATOM)
        self.kinds.update({tuple: _K_TUPLE, dict: _K_DICT, bytearray: _K_LEAF})
        self.stop_ids = {id(m.__dict__) for m in list(sys.modules.values())
                         if hasattr(m, "__dict__")}
        if namespace is not None:
            self.stop_ids.add(id(namespace))
        # singletons that pickle as themselves (their reduce names them): sharing one is no
        # link, and object columns hold them by the million (a missing value, a masked item)
        self.stop_ids.update(id(x) for x in _singletons())
        self.uf = _UF(n)
        self.owner: dict[Any, int] = {}  # tracked objects (and memory keys) -> first variable
        self.leaves: list[Any] = []  # per variable: ids of untracked mutable leaves (numpy)
        self.leaf_sets: dict[int, set[int]] = {}  # the same without numpy
        self.big = [0] * n  # per variable: bytes of array/tensor memory it owns
        self.array_ids: set[int] = set()
        self.shared: set[int] = set()  # see Walk.shared_arrays
        self.repeats: set[int] = set()  # variables that reach some object twice (Walk.trees)
        self.pending: list[int] = []  # the current variable's leaf ids, not yet in numpy
        self.mem: list[tuple[int, int, int, Any]] = []  # (lo, hi, variable, array or storage)
        self.tuples_seen: dict[int, int] = {}  # untracked tuple -> the last variable into it
        self.deadline: float | None = None
        self.tick: Callable[[int], None] | None = None
        self.last_tick = time.monotonic()
        self.byte_bounds: Callable[[Any], tuple[int, int]] | None
        try:
            from numpy.lib.array_utils import byte_bounds
            self.byte_bounds = byte_bounds
        except ImportError:  # numpy < 2
            self.byte_bounds = getattr(np, "byte_bounds", None)

    def walk(self, vi: int, value: Any) -> None:
        """Breadth-first over everything variable ``vi`` reaches."""
        frontier: list[Any] = []
        if type(value) in _WEAK:  # before isinstance(), which would ask a proxy's referent
            self.weak(value, vi, frontier)
        elif isinstance(value, _ATOMIC):
            return
        elif isinstance(value, self.slow_tracked) or (
            self.ndarray is not None and isinstance(value, self.ndarray)
        ):
            self.slow(value, vi, frontier)
        elif id(value) in self.stop_ids:  # globals(), a module's dict: not walked, so no tree
            self.repeats.add(vi)
        else:
            if gc.is_tracked(value):
                if self.claim(id(value), vi):
                    frontier.append(value)
            else:
                self.add_leaves(vi, [value], frontier)
        try:
            while frontier:
                level, frontier = frontier, []
                for refs in _batches(level):
                    self.step(refs, vi, frontier)
                if self.deadline is not None or self.tick is not None:
                    self.check()
        finally:
            self.flush_leaves(vi)

    def check(self) -> None:
        """Once a level: the time limit, and a progress tick now and then."""
        now = time.monotonic()
        if self.deadline is not None and now > self.deadline:
            raise _WalkTimeout()
        if self.tick is not None and now - self.last_tick >= _TICK:
            self.last_tick = now
            self.tick(sum(self.big))

    def forget(self, vi: int) -> None:
        """Undo what a timed-out walk of ``vi`` claimed: its half-walked objects must not hide
        from later variables what they share (unions it made stay: grouping too much is safe)."""
        owner = self.owner
        for k in [k for k, o in owner.items() if o == vi]:
            del owner[k]
        self.leaves = [(v, a) for v, a in self.leaves if v != vi]
        self.leaf_sets.pop(vi, None)
        self.pending = []  # its leaf ids not yet flushed (a timeout can come before the flush)
        self.mem = [m for m in self.mem if m[2] != vi]
        self.big[vi] = 0

    def flush_leaves(self, vi: int) -> None:
        np, ids = self.np, self.pending
        if ids and np is not None:  # leaf ids are gathered only with numpy (add_leaves)
            self.leaves.append((vi, np.array(ids, dtype=np.int64)))
            self.pending = []

    def claim(self, key: Any, vi: int) -> bool:
        """Own ``key`` for variable vi; False (and union) if someone already did."""
        o = self.owner.get(key)
        if o is None:
            self.owner[key] = vi
            return True
        if o != vi:
            self.uf.union(o, vi)
        return False

    def slow(self, r: Any, vi: int, nxt: list[Any]) -> None:
        """An object that needs a decision: pickled by name, or keyed by the memory it views."""
        if id(r) in self.stop_ids:  # decided already, or a singleton (numpy's ``masked``)
            return
        if isinstance(r, types.ModuleType) or (
            isinstance(r, (type, types.FunctionType)) and _by_reference(r)
        ) or (isinstance(r, enum.Enum) and _by_reference(type(r))):  # pickled by name
            self.stop_ids.add(id(r))  # decided once: a chain's every node reaches its class
            return
        i = id(r)
        ndarray, tensor = self.ndarray, self.tensor
        if ndarray is not None and isinstance(r, ndarray):
            self.array_ids.add(i)
            if not self.claim(i, vi):
                self.shared.add(i)
                return
            if type(r) is not ndarray:  # a subclass: its class and its attributes (a mask)
                if gc.is_tracked(r):
                    nxt.append(r)
                else:  # __slots__ = (): its class alone
                    self.walk_into(type(r), vi, nxt)
            base = r
            while isinstance(getattr(base, "base", None), ndarray):
                base = base.base
            root = base.base if base.base is not None else base
            if self.claim(("mem", id(root)), vi):
                self.big[vi] += base.nbytes
                if base.dtype.hasobject:
                    self.add_elements(base, nxt)
                elif self.tensor is not None:  # only torch can alias numpy memory unseen
                    self.add_array_range(base, vi)
            else:  # a second array over this memory
                self.shared.add(id(root))
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
                if st.device.type == "cpu" and st.nbytes():
                    lo = st.data_ptr()
                    self.mem.append((lo, lo + st.nbytes(), vi, st))
            nxt.append(r)  # a tensor's __dict__ / grad may hold more
            return
        if self.claim(i, vi):
            nxt.append(r)  # a class or function defined in the notebook: walk into it

    def add_elements(self, base: Any, nxt: list[Any]) -> None:
        """The objects an object array holds (a pandas column of lists or dicts, say): numpy
        arrays take no part in gc, so they are walked as if they were its referents, and what
        they share with other variables links them. Only the parts of object dtype (a
        structured array's object fields, sub-array fields included), through a plain ndarray
        view (a matrix's or masked array's own ``tolist`` makes new lists or hides masked
        items); ``tolist`` of an object array gives the stored objects themselves. Atoms alone
        (a column of str) need no walk."""
        kinds = self.kinds
        for part in _object_parts(base.view(self.ndarray)):
            items = part.ravel(order="K").tolist()
            if not all(kinds.get(t) == _K_ATOM for t in set(map(type, items))):
                nxt.append(items)  # its referents are the next level (the list is not claimed)

    def weak(self, r: Any, vi: int, nxt: list[Any]) -> None:
        """A weakref, proxy or finalizer: its own referents (a callback), and its target."""
        if self.claim(id(r), vi):
            nxt.append(r)
            target = _weak_target(r)
            if target is not None:
                self.walk_into(target, vi, nxt)

    def walk_into(self, r: Any, vi: int, nxt: list[Any]) -> None:
        """One object reached other than through gc referents (a weakref's referent)."""
        if isinstance(r, _ATOMIC) or id(r) in self.stop_ids:
            return
        if isinstance(r, self.slow_tracked) or (
            self.ndarray is not None and isinstance(r, self.ndarray)
        ):
            if id(r) not in self.owner:
                self.slow(r, vi, nxt)
            else:
                self.shared.add(id(r))
                if self.owner[id(r)] != vi:
                    self.uf.union(self.owner[id(r)], vi)
        elif gc.is_tracked(r):
            if self.claim(id(r), vi):
                nxt.append(r)
        else:
            self.add_leaves(vi, [r], nxt)

    def add_array_range(self, base: Any, vi: int) -> None:
        """The address range of an array's memory (``base``: its outermost ndarray)."""
        if base.nbytes == 0 or base.dtype.hasobject:
            return
        if base.base is None:  # owns its data: one block from its data pointer
            lo = base.__array_interface__["data"][0]
            hi = lo + base.nbytes
        elif self.byte_bounds is not None:
            lo, hi = self.byte_bounds(base)
        else:
            return
        self.mem.append((lo, hi, vi, base))

    def kind(self, t: type) -> int:
        return _K_ARRAY if self.ndarray is not None and issubclass(t, self.ndarray) else _K_ATOM

    def add_leaves(self, vi: int, objs: list[Any], nxt: list[Any]) -> None:
        """Untracked objects reached by vi: record the identity of the mutable ones (sharing
        them is aliasing), key arrays by memory, and look into dicts and tuples. An untracked
        dict or tuple holds only objects gc does not track (CPython untracks a tuple only when
        none of its items can be tracked), so this stays among untracked objects, and an array
        or bytearray in a tuple in a dict is found like one in a list. A tuple is looked into
        once per variable, so a tuple reached a million times, or a DAG of tuples, costs its
        size once; being immutable, it links variables only through what it holds."""
        kinds, owner, uf = self.kinds, self.owner, self.uf
        todo = [objs]
        while todo:
            objs = todo.pop()
            tset = set(map(type, objs))
            for t in tset.difference(kinds):
                kinds[t] = self.kind(t)
            if all(kinds[t] == _K_ATOM for t in tset):  # the usual case: ints, floats, strs
                continue
            # _K_ATOM is 0, so a level's kinds are its mask of what is not an atom
            if len(tset) == 1:  # a level of one type (records in a list): no per-item lookup
                k = kinds[next(iter(tset))]
                ks, present = [k] * len(objs), {k}
            else:
                ks = list(map(kinds.__getitem__, map(type, objs)))
                present = set(ks)
            if len(present) > 1:
                objs = list(compress(objs, ks))
                ks = list(filter(None, ks))
            if _K_ARRAY in present:
                for r in compress(objs, map(_K_ARRAY.__eq__, ks)):
                    o = owner.get(id(r))
                    if o is None:
                        self.slow(r, vi, nxt)
                    else:
                        self.shared.add(id(r))
                        if o != vi:
                            uf.union(o, vi)
            mutable = (objs if present <= {_K_ATOM, _K_DICT, _K_LEAF}
                       else list(compress(objs, map(_MUTABLE_KINDS.__contains__, ks))))
            if mutable:
                if self.np is not None:
                    # one numpy array per level would be a million tiny arrays for a deep chain
                    self.pending.extend(map(id, mutable))
                    if len(self.pending) >= _PENDING_MAX:
                        self.flush_leaves(vi)
                else:
                    ids = self.leaf_sets.setdefault(vi, set())
                    n = len(ids)
                    ids.update(map(id, mutable))
                    if len(ids) - n < len(mutable):
                        self.repeats.add(vi)
            inside: list[Any] = []
            if _K_DICT in present:  # a dict reached twice is looked into twice (atoms, mostly)
                inside = (objs if present <= {_K_ATOM, _K_DICT}
                          else list(compress(objs, map(_K_DICT.__eq__, ks))))
            if _K_TUPLE in present:
                # immutable, so a tuple two variables reach links nothing by itself (a code
                # constant, the empty tuple); what it holds still does, from each variable
                seen = self.tuples_seen
                # the empty tuple is one object, and pickles as itself without the memo
                tl = list(filter(None, compress(objs, map(_K_TUPLE.__eq__, ks))))
                tuples = {id(o): o for o in tl}
                new = [i for i in tuples if seen.get(i) != vi]
                if len(new) < len(tl):
                    self.repeats.add(vi)
                seen.update(dict.fromkeys(new, vi))
                inside.extend(map(tuples.__getitem__, new))
            # gc.get_referents traverses an untracked dict or tuple all the same (a dict's keys
            # too unless all are str: hashable, so never a dict, array or bytearray); in slices,
            # so that the blob-writer threads get the GIL between them (see _batches)
            for i in range(0, len(inside), _BATCH):
                refs = gc.get_referents(*inside[i : i + _BATCH])
                todo.extend(refs[j : j + _BATCH] for j in range(0, len(refs), _BATCH))
            if self.deadline is not None:
                self.check()

    def step(self, refs: list[Any], vi: int, frontier: list[Any]) -> None:
        """One batch of referents of variable vi's current level."""
        if len(refs) <= _SMALL:
            refs = self.step_small(refs, vi, frontier)
            if not refs:
                return
        # the filtering runs in C (map/compress); Python loops only over "slow" objects
        owner, uf = self.owner, self.uf
        tracked_flags = list(map(gc.is_tracked, refs))
        if not any(tracked_flags):  # a dict of records: its keys and untracked values
            tracked, untracked = [], refs
        elif all(tracked_flags):
            tracked, untracked = refs, []
        else:
            tracked = list(compress(refs, tracked_flags))
            untracked = list(compress(refs, map(not_, tracked_flags)))
        weak = list(map(_WEAK.__contains__, map(type, tracked)))
        if any(weak):  # by exact type, before any isinstance() (a dead proxy raises there)
            for r in compress(tracked, weak):
                self.weak(r, vi, frontier)
            tracked = list(compress(tracked, map(not_, weak)))
        del refs, tracked_flags
        self.add_leaves(vi, untracked, frontier)
        is_slow = list(map(isinstance, tracked, repeat(self.slow_tracked)))
        for r in compress(tracked, is_slow):
            o = owner.get(id(r))
            if o is None:
                self.slow(r, vi, frontier)
            else:
                self.shared.add(id(r))  # met again (only arrays' ids are ever asked for)
                self.repeats.add(vi)
                if o != vi:
                    uf.union(o, vi)
        cands = list(compress(tracked, map(not_, is_slow)))
        if not cands:
            return
        ids = set(map(id, cands))
        ids.difference_update(self.stop_ids)
        met = ids & owner.keys()
        # one object twice in this batch, a stop point (what it holds is not walked: a cycle
        # through globals() would go unseen), or an object met before: not a tree
        if met or len(ids) < len(cands):
            self.repeats.add(vi)
        for i in met:
            o = owner[i]
            if o != vi:
                uf.union(o, vi)
        new = ids.difference(owner)  # not ``ids - owner.keys()``: that iterates all of owner
        if not new:
            return
        owner.update(dict.fromkeys(new, vi))
        frontier.extend({id(r): r for r in cands if id(r) in new}.values())


    def step_small(self, refs: list[Any], vi: int, frontier: list[Any]) -> list[Any]:
        """A few referents (a deep chain's level): plain tracked objects handled one by one,
        which for a handful beats building the vectorised lists; returns the rest for step."""
        owner, stop, slow_t, kinds = self.owner, self.stop_ids, self.slow_tracked, self.kinds
        rest = []
        for r in refs:
            if not gc.is_tracked(r):
                if kinds.get(type(r)) != _K_ATOM:
                    rest.append(r)  # for add_leaves, through step
                continue
            i = id(r)
            if i in stop:
                self.repeats.add(vi)  # see step
                continue
            if type(r) in _WEAK:
                self.weak(r, vi, frontier)
                continue
            o = owner.get(i)
            if o is None:
                if isinstance(r, slow_t):
                    rest.append(r)
                else:
                    owner[i] = vi
                    frontier.append(r)
            else:
                if isinstance(r, slow_t):
                    self.shared.add(i)  # an array met again (see step)
                self.repeats.add(vi)
                if o != vi:
                    self.uf.union(o, vi)
        return rest


_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)
# matched by exact type, a cheap set lookup per object (subclasses of these are rare)
_WEAK = frozenset((*_PROXIES, weakref.ref, weakref.KeyedRef, weakref.WeakMethod, weakref.finalize))


def _singletons() -> list[Any]:
    out: list[Any] = []
    pd = sys.modules.get("pandas")
    if pd is not None:
        out += [getattr(pd, n) for n in ("NA", "NaT") if hasattr(pd, n)]
    ma = sys.modules.get("numpy.ma")
    if ma is not None and hasattr(ma, "masked"):
        out.append(ma.masked)
    return out


def _object_parts(a: Any) -> Any:
    """The object-dtype parts of an array: itself, or its (nested) fields that hold objects."""
    dt = a.dtype
    if dt.names is None:
        if dt.kind == "O":
            yield a
        return
    for name in dt.names:
        if dt.fields[name][0].hasobject:
            yield from _object_parts(a[name])


def _weak_target(r: Any) -> Any:
    """What a weakref or proxy points at (the instance, for a WeakMethod), or a finalizer's
    record (its weakref, function and arguments live in a class-level registry, not in it)."""
    if type(r) not in _PROXIES:  # isinstance() on a proxy would ask its (maybe dead) referent
        if isinstance(r, weakref.finalize):
            # CPython's own table of live finalizers (no public way to their callback)
            return weakref.finalize._registry.get(r)  # type: ignore[attr-defined]
        return weakref.ref.__call__(r)
    from .reducers.weakrefs import proxy_target

    target = proxy_target(r)
    return target if target is not None and type(target) is not object else None


def _batches(level: list[Any]) -> Any:
    """The referents of ``level`` in slices of _BATCH. Each slice is a few milliseconds of C
    work; between slices the interpreter can hand the GIL to the blob-writer threads, which a
    single pass over a million objects would starve for a second or more."""
    for i in range(0, len(level), _BATCH):
        refs = gc.get_referents(*level[i : i + _BATCH])
        for j in range(0, len(refs), _BATCH):
            yield refs[j : j + _BATCH]


def _union_shared_leaves(np: Any, uf: _UF, owner: dict[Any, int], leaves: list[Any],
                         leaf_sets: dict[int, Any], repeats: set[int]) -> None:
    """Union variables that reach the same untracked leaf (or a leaf that is another variable's
    tracked object): one vectorised sort instead of a hash insert per leaf. A variable that
    reaches one leaf twice goes into ``repeats``."""
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
        same_id = all_ids[1:] == all_ids[:-1]
        repeats.update(np.unique(all_vis[1:][same_id & (all_vis[1:] == all_vis[:-1])]).tolist())
        dup = np.flatnonzero(same_id & (all_vis[1:] != all_vis[:-1]))
        for k in dup.tolist():
            uf.union(int(all_vis[k]), int(all_vis[k + 1]))
    elif leaf_sets:
        seen: dict[int, int] = {k: v for k, v in owner.items() if isinstance(k, int)}
        for vi, ids in leaf_sets.items():
            for i in ids & seen.keys():
                if seen[i] != vi:
                    uf.union(seen[i], vi)
            seen.update(dict.fromkeys(ids - seen.keys(), vi))


def _union_shared_memory(mem: list[tuple[int, int, int, Any]],
                         uf: _UF) -> tuple[list[Any], list[tuple[int, int]]]:
    """Union variables whose arrays/storages overlap in memory (one sort, one sweep); returns
    the members of overlaps that mix numpy and torch, for the pickler to rebuild together, and
    the ranges of every member of an overlap."""
    if len(mem) < 2:
        return [], []
    mem.sort(key=lambda m: m[0])
    out: list[tuple[int, int, Any]] = []
    overlaps: list[tuple[int, int]] = []
    cluster = [mem[0]]
    hi = mem[0][1]

    def close(c: list[Any]) -> None:
        if len(c) > 1:
            overlaps.extend((lo_, hi_) for lo_, hi_, _vi, _obj in c)
        if len(c) > 1 and len({type(m[3]).__module__.split(".")[0] for m in c}) > 1:
            out.extend((lo_, hi_, obj) for lo_, hi_, _vi, obj in c)

    for m in mem[1:]:
        if m[0] < hi:
            uf.union(cluster[0][2], m[2])
            cluster.append(m)
            hi = max(hi, m[1])
        else:
            close(cluster)
            cluster, hi = [m], m[1]
    close(cluster)
    return out, overlaps
