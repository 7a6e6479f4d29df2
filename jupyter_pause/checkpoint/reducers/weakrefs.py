"""Weak references: saved with their referent, so they point at the restored object.

A weak reference (``weakref.ref``, ``WeakMethod``, ``KeyedRef``), a weak container
(``WeakValueDictionary``, ``WeakKeyDictionary``, ``WeakSet``), a ``weakref.finalize`` and
torch's ``RemovableHandle`` (a weakref to the module's hook dict) are saved with the objects they
point at. The grouping walk (graph.py) follows weak references like strong ones, so the referent
is in the same stream as every variable that holds it and pickle's memo makes the restored weakref
point at the restored object: ``handle.remove()`` removes the hook from the restored module.
A referent that no saved variable holds strongly would die right after the load (only the
weakref's own stream held it): such a weakref comes back dead, and the variable holding it is
noted as such, by name, in the restore report. A ``weakref.proxy`` is saved the same way; its
referent is read from the weakref's C struct, which only CPython has: elsewhere it is skipped.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import weakref
from typing import Any

from ..outcomes import SkipVariable, note_loaded
from . import register

_load = threading.local()


def start() -> None:
    """Before a group is unpickled: collect the weak links it rebuilds."""
    _load.links = []


def stop() -> None:
    _load.links = None


def finish() -> None:
    """After a group is unpickled (its memo gone): note the weak links whose referent died,
    since nothing restored holds it strongly."""
    links = getattr(_load, "links", None)
    stop()
    if not links:
        return
    gc.collect()  # a referent kept only by a cycle with the unpickler's garbage must go now
    for obj, alive, what in links:
        lost = alive(obj)
        if lost:
            note_loaded(obj, f"{what} came back dead: {lost}")


def _track(obj: Any, alive: Any, what: str) -> None:
    links = getattr(_load, "links", None)
    if links is not None:
        links.append((obj, alive, what))


_NOT_HELD = "no saved variable holds the object it pointed to"


def _ref_dead(r: Any) -> str:
    return _NOT_HELD if weakref.ref.__call__(r) is None else ""


def _type_name(o: Any) -> str:
    t = type(o)
    return f"{t.__module__}.{t.__qualname__}"


# -- weakref.ref and its subclasses ---------------------------------------------------------------
def _dead_ref() -> Any:
    """A weakref that was dead at checkpoint time: dead again."""
    return weakref.ref(set())


def _new_ref(referent: Any, callback: Any, what: str) -> Any:
    r = weakref.ref(referent, callback)
    _track(r, _ref_dead, what)
    return r


def _new_keyed(referent: Any, callback: Any, key: Any, what: str) -> Any:
    r = weakref.KeyedRef(referent, callback, key)
    _track(r, _ref_dead, what)
    return r


def _new_method(instance: Any, func: Any, callback: Any, what: str) -> Any:
    import types

    r = weakref.WeakMethod(types.MethodType(func, instance), callback)
    _track(r, lambda m: "" if m() is not None else _NOT_HELD, what)
    return r


@register("weakref.ReferenceType")
def reduce_ref(r: Any) -> Any:
    target = weakref.ref.__call__(r)
    if target is None:
        return (_dead_ref, ())
    cb = r.__callback__
    what = f"weak reference to a {_type_name(target)}"
    if isinstance(r, weakref.WeakMethod):
        method = r()
        if method is None:
            return (_dead_ref, ())
        what = f"weak method reference to {method.__func__.__qualname__} of a {_type_name(target)}"
        return (_new_method, (method.__self__, method.__func__, cb, what))
    if isinstance(r, weakref.KeyedRef):
        return (_new_keyed, (target, cb, r.key, what))
    if type(r) is not weakref.ref:
        raise SkipVariable(f"{_type_name(r)}: a weakref subclass this checkpoint cannot rebuild")
    return (_new_ref, (target, cb, what))


_PROXY_TYPES = (weakref.ProxyType, weakref.CallableProxyType)


def proxy_target(p: Any) -> Any:
    """The object a ``weakref.proxy`` stands for (None when dead). Python has no API for it
    (every attribute access is forwarded), so on CPython it is read from the weakref's
    ``wr_object`` field, right after the object header, as the C API's PyWeakref_GetObject
    does; elsewhere it cannot be read and the proxy cannot be saved."""
    if sys.implementation.name != "cpython":
        return _NO_TARGET
    field = ctypes.c_void_p.from_address(id(p) + object.__basicsize__)
    return ctypes.cast(field, ctypes.py_object).value  # a new reference; Py_None when dead


_NO_TARGET = object()


def _new_proxy(referent: Any, callback: Any, what: str) -> Any:
    p = weakref.proxy(referent, callback)
    _track(p, lambda p: "" if proxy_target(p) is not None else _NOT_HELD, what)
    return p


def _dead_proxy(callable_: bool = False) -> Any:
    """A proxy dead at checkpoint time: dead again, callable if it was (calling it then raises
    ReferenceError, not TypeError)."""
    return weakref.proxy((lambda: None) if callable_ else set())


@register("weakref.ProxyType", "weakref.CallableProxyType")
def reduce_proxy(p: Any) -> Any:
    target = proxy_target(p)
    if target is _NO_TARGET:
        raise SkipVariable(
            f"weakref.{type(p).__name__}: a weakref.proxy cannot be saved on "
            f"{sys.implementation.name} (its referent cannot be read); re-run its cell"
        )
    if target is None:
        return (_dead_proxy, (type(p) is weakref.CallableProxyType,))
    # its callback is the next field (attribute access would reach the referent's)
    cb_addr = ctypes.c_void_p.from_address(id(p) + object.__basicsize__
                                           + ctypes.sizeof(ctypes.c_void_p)).value
    cb = ctypes.cast(cb_addr, ctypes.py_object).value if cb_addr else None
    return (_new_proxy, (target, cb, f"weak proxy of a {_type_name(target)}"))


# -- weak containers ------------------------------------------------------------------------------
_INTERNAL = frozenset({"data", "_remove", "_pending_removals", "_iterating", "_dirty",
                       "_atomic_removal"})


def _extra_state(obj: Any) -> dict[str, Any]:
    """Attributes a subclass added (the container's own internals are rebuilt by its class)."""
    return {k: v for k, v in getattr(obj, "__dict__", {}).items() if k not in _INTERNAL}


def _lost_entries(n: int) -> Any:
    def check(c: Any) -> str:
        gone = n - len(c)
        return f"{gone} of its {n} entries' objects are not held by any saved variable" if gone else ""

    return check


def _new_container(cls: type, items: list[Any], extra: dict[str, Any]) -> Any:
    c = cls()
    if isinstance(c, weakref.WeakSet):
        for x in items:
            c.add(x)
    else:
        for k, v in items:
            c[k] = v
    c.__dict__.update(extra)
    _track(c, _lost_entries(len(items)), f"a {cls.__module__}.{cls.__qualname__}")
    return c


@register("weakref.WeakValueDictionary", "weakref.WeakKeyDictionary")
def reduce_weak_dict(d: Any) -> Any:
    return (_new_container, (type(d), list(d.items()), _extra_state(d)))


@register("_weakrefset.WeakSet")
def reduce_weak_set(s: Any) -> Any:
    return (_new_container, (type(s), list(s), _extra_state(s)))


# -- weakref.finalize -----------------------------------------------------------------------------
def _new_finalize(obj: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], atexit: bool) -> Any:
    f = weakref.finalize(obj, func, *args, **kwargs)
    f.atexit = atexit
    _track(f, lambda f: "" if f.alive else _NOT_HELD + "; its function will not run",
           f"finalizer of a {_type_name(obj)}")
    return f


def _detached_finalize() -> Any:
    f = weakref.finalize(_dead_ref, _dead_ref)  # any long-lived object; detached at once
    f.detach()
    return f


@register("weakref.finalize")
def reduce_finalize(f: Any) -> Any:
    peek = f.peek()
    if peek is None:
        return (_detached_finalize, ())
    obj, func, args, kwargs = peek
    return (_new_finalize, (obj, func, args, kwargs, f.atexit))


# -- torch.utils.hooks.RemovableHandle --------------------------------------------------------------
def _handle_dead(h: Any) -> str:
    if h.hooks_dict_ref() is None:
        return "the module (hook dict) it removes from is not held by any saved variable"
    return ""


def _new_handle(cls: type[object], state: tuple[Any, ...]) -> Any:
    h: Any = cls.__new__(cls)  # torch's RemovableHandle, untyped __setstate__
    h.__setstate__(state)
    _track(h, _handle_dead, "hook handle")
    return h


@register("torch.utils.hooks.RemovableHandle")
def reduce_handle(h: Any) -> Any:
    # its own __getstate__ dereferences its weakrefs; the hook dict then comes back as the
    # restored module's (same stream), and __setstate__ rebuilds the weakrefs onto it
    return (_new_handle, (type(h), h.__getstate__()))
