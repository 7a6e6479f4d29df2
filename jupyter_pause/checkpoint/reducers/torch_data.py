"""torch DataLoader iterators mid-epoch: ``it = iter(loader); next(it)`` comes back at its place.

A single-process iterator is the dataset, a fetcher and the sampler's iterator (a generator, which
cannot be pickled). What is left of the epoch is what that generator will still yield: the index
batches. They are drawn out of it at checkpoint time and the live iterator is given a list
iterator over the very same batches, so it goes on exactly as it would have; the checkpoint
stores that list (a few bytes per sample) and the number of batches yielded, which is what
torchdata's ``StatefulDataLoader`` replays from. The restored iterator yields the same batches in
the same order, then stops where the epoch would have; the next ``iter(loader)`` starts a new
epoch from the (restored) global generator as usual.

Not saved, by name:
- an iterator over an ``IterableDataset``: its position is inside the dataset's own iterator,
  which is usually a generator;
- a sampler that never ends (no ``__len__``, e.g. an infinite stream): its remaining indices
  cannot be drawn out;
- a multi-process iterator (``num_workers > 0``): batches already handed to worker processes
  live in those processes and queues, and cannot be put back.
"""

from __future__ import annotations

import itertools
from typing import Any

from ..outcomes import SkipVariable
from . import register

REMAINING_MAX = 50_000_000  # indices drawn out of a sampler at most; an epoch is rarely longer


def _rebuild_iter(cls: type[object], state: dict[str, Any], remaining: list[Any]) -> Any:
    it: Any = cls.__new__(cls)  # its attributes are the DataLoader iterator's private ones
    it.__dict__.update(state)
    it._sampler_iter = iter(remaining)
    from torch.utils.data.dataloader import _DatasetKind

    it._dataset_fetcher = _DatasetKind.create_fetcher(
        it._dataset_kind, it._dataset, it._auto_collation, it._collate_fn, it._drop_last
    )
    return it


def _draw_remaining(it: Any) -> list[Any]:
    """What the sampler's iterator has still to yield; the live iterator goes on over it."""
    try:
        total = len(it._index_sampler)
    except TypeError:
        raise SkipVariable(
            "a DataLoader iterator whose sampler has no length (an endless sampler): its "
            "remaining indices cannot be drawn out; re-run its cell"
        ) from None
    if total > REMAINING_MAX:
        raise SkipVariable(f"a DataLoader iterator over {total} batches: too many to store")
    left = max(total - it._num_yielded, 0)
    src = it._sampler_iter
    remaining = list(itertools.islice(src, left + 1))
    if len(remaining) > left:  # yields more than its length says: maybe endless; leave it be
        it._sampler_iter = itertools.chain(remaining, src)
        raise SkipVariable(
            f"a DataLoader iterator whose sampler yields more than its len() ({total}): its "
            "remaining indices cannot be drawn out; re-run its cell"
        )
    it._sampler_iter = iter(remaining)  # the live iterator yields the same, from a list now
    return remaining


@register("torch.utils.data.dataloader._SingleProcessDataLoaderIter")
def reduce_single(it: Any) -> Any:
    from torch.utils.data.dataloader import _DatasetKind

    if it._dataset_kind != _DatasetKind.Map:
        raise SkipVariable(
            "a DataLoader iterator over an IterableDataset: its position is inside the dataset's "
            "own iterator (a generator), which cannot be saved; re-run its cell"
        )
    remaining = _draw_remaining(it)
    state = {k: v for k, v in it.__dict__.items() if k not in ("_sampler_iter", "_dataset_fetcher")}
    return (_rebuild_iter, (type(it), state, remaining))


@register("torch.utils.data.dataloader._MultiProcessingDataLoaderIter")
def reduce_multi(it: Any) -> Any:
    raise SkipVariable(
        f"a DataLoader iterator with num_workers={it._num_workers}: the batches already handed "
        "to its worker processes live in them and cannot be put back; use num_workers=0 for an "
        "iterator kept across a pause, or re-run its cell"
    )
