"""Pickling plain data (builtin containers and atoms) without the pickler's memo.

The pickler's memo records every object it writes, so that an object met twice comes back as one.
For a million small records that bookkeeping is most of the work: three quarters of the C
pickler's time on a dict of a million small dicts (the memo's hash table and a PUT per object).
When the walk (``graph.Walk.trees``) found that a variable reaches no container, mutable leaf or
tuple twice, identity needs no memo, and the pickler runs in its ``fast`` mode, which keeps none.

What the walk does not see is the sharing of strings and bytes (atoms to it): the keys of a
million records are three string objects, and a memo-less pickle would bring back three million.
So the strings the value holds more than once are found first, by sampling its first levels
(at random, seeded: even spacing would see one value of data that repeats with its period) and
asking each sampled string's reference count. They are pickled first, with the
memo, and their pickle's STOP becomes a POP: what follows (the value, without memo) refers to
them by memo index. The stream stays one standard pickle that ``pickle.loads`` reads, the same
format as any other group's. The caller pickles with the memo as always when the sample cannot
vouch for the rest:
- strings shared but seen once in the sample are more than ``_MISS`` of the sampled strings
  (many rare values repeated: cities, user names; Good-Turing: what was seen once estimates
  what was never seen);
- the stream came out more than twice the size the sample predicts (a Horvitz-Thompson sum of
  what each sampled item would write): a large string repeated in a few records the sample
  missed, each copy of which would come back as one more string;
- the data is deeper than the sample, or the sample meets one container twice.

The C pickler calls ``reducer_override`` for every object except None, bools and exact ints,
floats, str, bytes, dict, set, frozenset, list and tuple: its first call means the value is not
plain data, and the attempt is dropped.
"""

from __future__ import annotations

import pickle
import random
import sys
from collections import Counter
from itertools import islice
from typing import Any

_K = 64  # containers sampled per level, and items per container
_DEPTH = 6  # levels of containers sampled; deeper data keeps the memo, unless small
_MISS = 0.02  # the share of sampled strings that may be shared yet left out of the seeds
_SLACK = 1 << 20  # bytes a stream may exceed twice its predicted size by
_CONTAINERS = frozenset((dict, list, tuple, set, frozenset))
# predicted bytes per item: a container's own opcodes, an atom other than a string, a string
# of the memo (BINGET), and the header of any other string
_B_CONTAINER, _B_ATOM, _B_SEEDED, _B_HEADER = 3, 9, 2, 5


class _NotPlain(Exception):
    pass


def _refuse(_buffer: Any) -> bool:
    raise _NotPlain()  # a PickleBuffer: out of band, as the memo pickler saves it


class _PlainPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        raise _NotPlain()


class _Head:
    """The pickler's file: holds the seeds' pickle to turn its final STOP into a POP, then
    passes every write on, counting."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.held: list[bytes] | None = []
        self.written = 0

    def write(self, data: Any) -> int:
        n = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        self.written += n
        if self.held is None:
            return int(self.out.write(data))
        self.held.append(bytes(data))
        return n

    def release(self) -> None:
        assert self.held is not None
        head = b"".join(self.held)
        assert head[-1:] == pickle.STOP
        self.held = None
        # the same length, so a frame header that counts the STOP still counts the POP
        self.out.write(head[:-1] + pickle.POP)


def dump_plain(values: dict[str, Any], out: Any) -> bool:
    """Pickle ``values`` to ``out`` (anything with ``write``) without the memo, after the strings
    they share. False (``out`` then holds a partial stream: drop it) when that does not suit:
    not plain data, a cycle, strings shared in ways the sample cannot vouch for."""
    seeds: list[Any] = []
    predicted = 0.0
    for v in values.values():
        planned = plan(v)
        if planned is None:
            return False
        seeds.extend(planned[0])
        predicted += planned[1]
    head = _Head(out)
    pickler = _PlainPickler(head, protocol=5, buffer_callback=_refuse)
    pickler.dump(tuple(seeds))
    head.release()
    pickler.fast = True
    try:
        pickler.dump(values)
    except (_NotPlain, ValueError):  # ValueError: fast mode met a cycle
        return False
    return head.written <= 2 * predicted + _SLACK


def shared_atoms(value: Any) -> list[Any] | None:
    """The strings and bytes that ``value`` may hold more than once (see :func:`plan`)."""
    p = plan(value)
    return None if p is None else p[0]


def plan(value: Any) -> tuple[list[Any], float] | None:
    """The strings and bytes (but interpreter-wide singletons: the empty string, one Latin-1
    character) that ``value`` may hold more than once, from a sample of ``_K`` items of ``_K``
    containers at each of its first ``_DEPTH`` levels, and the stream size the sample predicts;
    None when the sample cannot vouch for the rest (see the module's docstring)."""
    sampled = _sample(value)
    if sampled is None:
        return None
    found, weights, predicted, whole = sampled
    if not found:
        return [], predicted
    ids = list(map(id, found))
    counts = Counter(ids)
    objs = dict(zip(ids, found, strict=True))
    sizes = list(map(len, found))
    n = len(found)
    found.clear()  # from here on the only references of ours are objs' and the probe's
    probe = bytes(2)  # a fresh object held by one container: what "one reference" reads as
    box = [probe]
    objs[id(probe)] = probe
    del probe
    one = sys.getrefcount(objs[id(box[0])])
    del objs[id(box[0])]
    shared = {i for i in objs if sys.getrefcount(objs[i]) > one}
    # a string seen once but held twice: repeated where the sample did not look (or held
    # outside the value too: a code constant), and with it, likely, others never seen
    if not whole and sum(counts[i] == 1 for i in shared) > _MISS * n:
        return None
    for i, size, w in zip(ids, sizes, weights, strict=True):
        predicted += w * (_B_SEEDED if i in shared else size + _B_HEADER)
    return [objs[i] for i in shared], predicted


def _sample(value: Any) -> tuple[list[Any], list[float], float, bool] | None:
    """The sampled strings and bytes, an entry per occurrence with its weight (how many items
    of the value it stands for), the predicted stream bytes of everything else, and whether the
    sample is the whole value. In a function of its own: no local of it may still hold a
    string when the reference counts are read."""
    found: list[Any] = []
    weights: list[float] = []
    predicted = 0.0
    if type(value) not in _CONTAINERS:
        if _counted(value):
            return [value], [1.0], 0.0, True
        return [], [], float(_B_ATOM), True
    level: list[tuple[Any, float]] = [(value, 1.0)]
    met: set[int] = set()
    whole = True
    depth = 0
    while True:
        nxt: list[tuple[Any, float]] = []
        picks = _picks(len(level))
        whole = whole and len(picks) == len(level)
        scale = len(level) / len(picks)
        for j in picks:
            c, w = level[j]
            if c:  # (the empty tuple is one object wherever it is)
                if id(c) in met:  # a container met twice: not a tree after all
                    return None
                met.add(id(c))
            items, k = _items(c)
            whole = whole and k == len(c)
            w *= scale
            predicted += w * _B_CONTAINER
            cw = w * len(c) / k if k else 0.0
            for x in items:
                t = type(x)
                if t in _CONTAINERS:
                    nxt.append((x, cw))
                elif _counted(x):
                    found.append(x)
                    weights.append(cw)
                else:
                    predicted += cw * _B_ATOM
        if not nxt:
            return found, weights, predicted, whole
        depth += 1
        if depth >= _DEPTH and not whole:  # all of a small value, however deep; else _DEPTH
            return None
        level = nxt


def _counted(x: Any) -> bool:
    """A string or bytes that pickling may duplicate (not a singleton)."""
    t = type(x)
    if t is str:
        return len(x) > 1 or x > "\xff"
    return t is bytes and len(x) > 1


def _picks(n: int) -> list[int]:
    """Up to _K positions out of n, in order: at random (seeded, so the same data samples the
    same), as even spacing would see one value of data that repeats with its period."""
    if n <= _K:
        return list(range(n))
    return sorted(random.Random(n).sample(range(n), _K))


def _items(c: Any) -> tuple[list[Any], int]:
    """A sample of a container's items (a dict's keys and values) and how many entries."""
    t = type(c)
    if t is list or t is tuple:
        p = _picks(len(c))
        return [c[i] for i in p], len(p)
    if t is dict:
        p = _picks(len(c))
        out: list[Any] = []
        it, at = iter(c.items()), 0
        for i in p:
            out.extend(next(islice(it, i - at, None)))  # skips in C
            at = i + 1
        return out, len(p)
    if len(c) <= 1 << 16:  # set, frozenset: no positions, so a list of them first
        members = list(c)
        p = _picks(len(members))
        return [members[i] for i in p], len(p)
    return list(islice(c, _K)), _K
