"""Reducers by type: how objects of a given library class are saved and brought back.

One registry, keyed by the dotted name of a class (``"module.QualName"``) so that no library is
imported to register it; a type matches through its MRO, nearest class first. A reducer takes the
object and returns what ``reducer_override`` may return: a reduce tuple, ``NotImplemented`` (the
pickler's usual path), or raises ``SkipVariable``/``StaleObject`` with the precise reason. The
callables a reduce tuple names must live in this package: the stream refers to them by name.

Entries (a test each: tests/fidelity/test_reducers.py):
- files.py: open files (reopened, read mode only, when unchanged), astropy's FITS file handle;
- sync.py: free locks and the Condition/Event/Semaphore/Queue objects built on them;
- torch_autograd.py: tensors carrying autograd history;
- widgets.py: ipywidgets widgets and the functions ``interact`` wrapped;
- bokeh.py: bokeh models (figures, data sources, ...);
- weakrefs.py: weak references, weak containers, finalizers and torch hook handles, relinked to
  the restored objects (tests/checkpoint/test_weak_links.py);
- torch_data.py: DataLoader iterators mid-epoch (tests/checkpoint/test_iterators.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Reducer = Callable[[Any], Any]
_REGISTRY: dict[str, Reducer] = {}
_cache: dict[type, Reducer | None] = {}


def register(*qualnames: str) -> Callable[[Reducer], Reducer]:
    """Register ``fn`` for the classes named (``"module.QualName"``, as ``type.__module__``
    and ``__qualname__`` spell them)."""

    def deco(fn: Reducer) -> Reducer:
        for q in qualnames:
            _REGISTRY[q] = fn
        _cache.clear()
        return fn

    return deco


def lookup(t: type) -> Reducer | None:
    """The reducer of ``t``'s nearest registered class, or None."""
    try:
        return _cache[t]
    except KeyError:
        pass
    found = None
    for c in getattr(t, "__mro__", (t,)):
        found = _REGISTRY.get(f"{c.__module__}.{c.__qualname__}")
        if found is not None:
            break
    _cache[t] = found
    return found


def registered() -> dict[str, Reducer]:
    return dict(_REGISTRY)


from . import (  # noqa: F401 - they register themselves
    bokeh,
    files,
    sync,
    torch_autograd,
    torch_data,
    weakrefs,
    widgets,
)
