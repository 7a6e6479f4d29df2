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
format as any other group's. When the sample says that strings shared but not seen in it would
be more than ``_MISS`` of the strings (many rare values repeated: cities, user names), or the
data is deeper than the sample, the caller pickles with the memo as always.

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
_CONTAINERS = frozenset((dict, list, tuple, set, frozenset))


class _NotPlain(Exception):
    pass


class _PlainPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        raise _NotPlain()


class _Head:
    """The pickler's file: holds the seeds' pickle to turn its final STOP into a POP, then
    passes every write on."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.held: list[bytes] | None = []

    def write(self, data: Any) -> int:
        if self.held is None:
            return int(self.out.write(data))
        self.held.append(bytes(data))
        return len(data)

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
    not plain data, a cycle, strings shared too widely to find by sampling."""
    seeds: list[Any] = []
    for v in values.values():
        s = shared_atoms(v)
        if s is None:
            return False
        seeds.extend(s)
    head = _Head(out)
    p = _PlainPickler(head, protocol=5)
    p.dump(tuple(seeds))
    head.release()
    p.fast = True
    try:
        p.dump(values)
    except (_NotPlain, ValueError):  # ValueError: fast mode met a cycle
        return False
    return True


def shared_atoms(value: Any) -> list[Any] | None:
    """The strings and bytes (longer than one character: shorter ones are interpreter-wide
    singletons) that ``value`` may hold more than once, from a sample of ``_K`` items of
    ``_K`` containers at each of its first ``_DEPTH`` levels; None when the sample cannot
    vouch for the rest (see the module's docstring)."""
    sampled = _sample(value)
    if sampled is None:
        return None
    found, whole = sampled
    if not found:
        return []
    counts = Counter(map(id, found))
    objs = {id(x): x for x in found}
    n = len(found)
    found.clear()  # from here on the only references of ours are objs' and the probe's
    probe = bytes(2)  # a fresh object held by one container: what "one reference" reads as
    box = [probe]
    objs[id(probe)] = probe
    del probe
    one = sys.getrefcount(objs[id(box[0])])
    del objs[id(box[0])]
    shared = [i for i in objs if sys.getrefcount(objs[i]) > one]
    # a string seen once but held twice: repeated where the sample did not look (or held
    # outside the value too: a code constant), and with it, likely, others never seen
    if not whole and sum(counts[i] == 1 for i in shared) > _MISS * n:
        return None
    return [objs[i] for i in shared]


def _sample(value: Any) -> tuple[list[Any], bool] | None:
    """The sampled strings and bytes longer than one, an entry per occurrence, and whether the
    sample is the whole value (in a function of its own: no local of it may still hold one
    when the reference counts are read)."""
    found: list[Any] = []
    level = [value]
    whole = True
    depth = 0
    while True:
        nxt: list[Any] = []
        whole = whole and len(level) <= _K
        for c in _spread(level):
            whole = whole and (type(c) not in _CONTAINERS or len(c) <= _K)
            for x in _items(c):
                t = type(x)
                if t is str or t is bytes:
                    if len(x) > 1:
                        found.append(x)
                elif t in _CONTAINERS:
                    nxt.append(x)
        if not nxt:
            return found, whole
        depth += 1
        if depth >= _DEPTH and not whole:  # all of a small value, however deep; else _DEPTH
            return None
        level = nxt


def _picks(n: int) -> list[int]:
    """Up to _K positions out of n, in order: at random (seeded, so the same data samples the
    same), as even spacing would see one value of data that repeats with its period."""
    if n <= _K:
        return list(range(n))
    return sorted(random.Random(n).sample(range(n), _K))


def _spread(seq: list[Any]) -> list[Any]:
    return [seq[i] for i in _picks(len(seq))]


def _items(c: Any) -> Any:
    t = type(c)
    if t is list or t is tuple:
        yield from _spread(c)
    elif t is dict:
        it, at = iter(c.items()), 0
        for i in _picks(len(c)):
            k, v = next(islice(it, i - at, None))  # skips in C
            at = i + 1
            yield k
            yield v
    elif t is set or t is frozenset:
        yield from _spread(list(c)) if len(c) <= 1 << 16 else islice(c, _K)
