"""Iterators caught mid-stream come back at the same position, or are named with why not.

- a single-process torch DataLoader iterator (shuffled or not): the rest of its epoch, in the
  same order (reducers/torch_data.py), and the live iterator goes on unchanged;
- list, tuple, range and dict iterators and ``itertools.count``: Python's own pickling;
- a generator, a multi-process DataLoader iterator, an IterableDataset's iterator: skipped, with
  a reason naming what cannot be saved (so a restore reports it instead of restarting an epoch).
"""

from __future__ import annotations

import itertools

import pytest

from jupyter_pause.checkpoint import read, write

from .helpers import statuses
from .resume_run import assert_continues


def _batches(it) -> list:
    return [b.tolist() if hasattr(b, "tolist") else b for b in it]


def test_shuffled_dataloader_iterator_continues_in_a_fresh_process(tmp_path):
    pytest.importorskip("torch")
    setup = """
    import torch
    torch.manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    loader = torch.utils.data.DataLoader(ds, batch_size=3, shuffle=True)
    it = iter(loader)
    first = next(it)
    """
    after = """
    emit(len(it))
    emit([[x.tolist(), y.tolist()] for x, y in it])  # the rest of this epoch
    torch.manual_seed(5)  # the next epoch draws from the global generator (process state)
    emit([y.tolist() for _, y in loader])
    """
    a, _ = assert_continues(setup, after, tmp_path)
    rest = [y for _, y in a["out"][1]]
    assert sum(len(y) for y in rest) == 7  # 10 samples, 3 of them yielded before the pause


def test_dataloader_iterator_position_and_live_iterator_unchanged(store, key):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(list(range(12)), batch_size=2, shuffle=True)
    it = iter(loader)
    seen = [next(it).tolist(), next(it).tolist()]
    res = write({"loader": loader, "it": it}, store, key=key)
    assert statuses(res.variables) == {"loader": "saved", "it": "saved"}
    back = read(store, key=key).values["it"]
    rest_live, rest_back = _batches(it), _batches(back)
    assert rest_back == rest_live and len(rest_live) == 4
    assert sorted(x for b in seen + rest_live for x in b) == list(range(12))  # none twice/lost


def test_plain_python_iterators_keep_their_position(store, key):
    lst, tup, rng, dct = iter([1, 2, 3, 4]), iter((5, 6, 7)), iter(range(10, 15)), iter({"a": 1,
                                                                                          "b": 2})
    cnt = itertools.count(100, 5)
    for i in (lst, tup, rng, dct, cnt):
        next(i)
    res = write({"lst": lst, "tup": tup, "rng": rng, "dct": dct, "cnt": cnt}, store, key=key)
    assert set(statuses(res.variables).values()) == {"saved"}
    v = read(store, key=key).values
    assert list(v["lst"]) == [2, 3, 4] and list(v["tup"]) == [6, 7]
    assert list(v["rng"]) == [11, 12, 13, 14] and list(v["dct"]) == ["b"]
    assert next(v["cnt"]) == 105


def test_unsaveable_iterators_are_named_with_why(store, key):
    torch = pytest.importorskip("torch")

    def numbers():
        yield from range(5)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))

    gen = numbers()
    next(gen)
    multi = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=1)
    mit = iter(multi)
    next(mit)
    sit = iter(torch.utils.data.DataLoader(Stream(), batch_size=2))
    next(sit)
    try:
        res = write({"gen": gen, "mit": mit, "sit": sit}, store, key=key)
    finally:
        mit._shutdown_workers()
    by = {v.name: v for v in res.variables}
    assert by["gen"].status == "skipped" and "numbers()" in by["gen"].reason
    assert "generator" in by["gen"].reason
    assert by["mit"].status == "skipped" and "num_workers=1" in by["mit"].reason
    assert by["sit"].status == "skipped" and "IterableDataset" in by["sit"].reason
