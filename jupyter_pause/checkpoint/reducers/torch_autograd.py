"""Tensors that carry autograd history (``grad_fn``).

A graph is process memory: it cannot be saved. Two cases:
- a view of a leaf that requires grad (``w = model.weight[0]``): rebuilt exactly, as the same
  view of the restored leaf, so gradients still reach the parameter;
- any other result of an operation (``loss = criterion(out, y)``): its value is saved, and at
  restore the variable is marked as having lost its graph (see ``ReadResult.load_notes``), so
  the report says so instead of "restored", and ``%restore --recompute`` re-runs its cell.
A leaf's accumulated gradient (``.grad``) is saved with it: torch's own pickling drops it, and a
``backward()`` in the next cell accumulates onto it (gradient accumulation, or a step taken
after the pause), so without it the next step would differ.
"""

from __future__ import annotations

from typing import Any

from ..outcomes import note_loaded
from . import register


def _graph_view(base: Any, size: tuple[Any, ...], stride: tuple[Any, ...], offset: int) -> Any:
    return base.as_strided(size, stride, offset)


def _graph_lost(value: Any, grad_fn: str) -> Any:
    note_loaded(
        value,
        f"value restored without its autograd graph (grad_fn={grad_fn}): backward() from it "
        "would not reach the tensors it was computed from",
    )
    return value


def _with_grad(rebuild: Any, args: tuple[Any, ...], grad: Any) -> Any:
    t = rebuild(*args)
    t.grad = grad
    return t


@register("torch.Tensor")
def reduce_tensor(t: Any) -> Any:
    gf = t.grad_fn
    if gf is None:
        grad = t.grad if t.requires_grad else None
        if grad is None:
            return NotImplemented  # leaves and plain tensors: the pickler's storage path
        rv = t.__reduce_ex__(5)  # torch's own (storage, offset, ...), then the gradient on it
        if not isinstance(rv, tuple) or len(rv) != 2:
            return NotImplemented
        return (_with_grad, (rv[0], rv[1], grad))
    base = t._base
    if base is not None and base.is_leaf and base.requires_grad and t.layout == base.layout:
        return (_graph_view, (base, tuple(t.size()), tuple(t.stride()), t.storage_offset()))
    return (_graph_lost, (t.detach(), type(gf).__name__))
