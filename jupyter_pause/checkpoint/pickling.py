"""Pickling one co-variable group: the C pickler first, dill only where it is needed.

Both picklers share one ``reducer_override`` that
- swaps torch storages for references into the checkpoint's safetensors packs (tensors never go
  through pickle; torch's own tensor reduce rebuilds views on top, so views and shared storage
  survive, as with ``torch.save``);
- pickles modules by name (dill would pickle non-stdlib modules by value);
- hands objects of registered library classes to their reducer (``reducers/``: open files,
  autograd tensors, widgets, bokeh models, ...), one registry rather than cases in here;
- refuses objects that cannot be saved (generators, sockets, ...) with a clear reason, and objects
  that would only "serialize" into a stale lie (locks, threads, other streams, Popen) as stale;
- in the C pickler, hands classes/functions defined in ``__main__`` (and lambdas/closures) to dill,
  since the C pickler would store them by a name a fresh kernel does not have; in dill, saves
  every class/function that its module really holds under its name by that name (dill looks
  modules up as package attributes, misses ``torch.optim.adamw``, and then saves the class by
  value, with whatever singletons its methods' defaults hold);
- saves by reference an object that a library module holds as an attribute and whose class
  is that library's (a sentinel such as ``typing_extensions._marker``, ``dataclasses.MISSING``,
  ``torch.default_generator``): identity-checked at save time, imported at load time, so
  ``x is MISSING`` tests in library code still hold and a singleton whose own ``__reduce__``
  names the wrong global still saves. Plain containers are not included: a dict or list is the
  notebook's data even when a module holds it too;
Large contiguous buffers (numpy, pandas, pyarrow) leave the stream out of band (protocol 5).
Memory that a numpy array and a torch tensor share (``torch.from_numpy``, ``Tensor.numpy``) is
saved once: the side that does not own it is rebuilt over the other on load, so writes through
one still show in the other. Structures too deep for the default stack are pickled (and
unpickled) again in a thread with a big one (``deep.py``).
"""

from __future__ import annotations

import copyreg
import importlib
import io
import pickle
import sys
import threading
import types
from typing import Any

from . import reducers
from .deep import call_deep

# SkipVariable and StaleObject: callers outside the package import them here too
from .outcomes import (
    SkipVariable,
    StaleObject,
    collecting_notes,
    notes_by_variable,
)
from .plain import dump_plain
from .reducers import weakrefs

OOB_MIN = 1 << 20  # buffers below this stay in the stream: a blob per tiny array costs more
VIEW_ROOT_MAX = 64 << 10  # a view's unreferenced root up to this size is saved to keep sharing


class _NeedsDill(Exception):
    pass


# -- type classification ------------------------------------------------------------------------
(_PLAIN, _MODULE, _TENSOR, _STORAGE, _CODE, _STALE_KIND, _UNSER_KIND, _NDARRAY, _REDUCER,
 _NDSUB) = range(10)
_kind_cache: dict[type, tuple[int, Any]] = {}


def _stale_reasons() -> list[tuple[tuple[type, ...], str]]:
    import io as _io
    import subprocess

    lock_types = (type(threading.Lock()), type(threading.RLock()))
    out: list[tuple[tuple[type, ...], str]] = [
        (lock_types, "holds a threading lock; a restored copy would be a new lock, not this one"),
        ((threading.Thread,), "holds a thread; a restored copy would not be running"),
        (
            (threading.Condition, threading.Event, threading.Semaphore, threading.Barrier),
            "holds a thread synchronization object; its state would not carry over",
        ),
        ((subprocess.Popen,), "holds a subprocess handle; the process does not come back"),
    ]
    try:
        import _multiprocessing

        out.append(((_multiprocessing.SemLock,), "holds a multiprocessing lock"))
    except ImportError:
        pass
    out.append(((_io.IOBase,), "holds an open file or stream; a restored copy would not be it"))
    return out


def _unser_reasons() -> list[tuple[tuple[type, ...], str]]:
    import asyncio
    import concurrent.futures
    import mmap
    import socket
    import sqlite3

    out: list[tuple[tuple[type, ...], str]] = [
        ((types.GeneratorType, types.AsyncGeneratorType), "a generator cannot be saved"),
        ((types.CoroutineType,), "a coroutine cannot be saved"),
        ((types.FrameType, types.TracebackType), "a frame/traceback cannot be saved"),
        ((socket.socket,), "a socket cannot be saved"),
        ((sqlite3.Connection, sqlite3.Cursor), "an sqlite3 connection/cursor cannot be saved"),
        ((mmap.mmap,), "an mmap cannot be saved"),
        ((concurrent.futures.Executor,), "a thread/process pool cannot be saved"),
        ((asyncio.AbstractEventLoop,), "an event loop cannot be saved"),
    ]
    import hashlib

    out.append(((type(hashlib.sha256()), type(hashlib.md5())), "a hashlib object cannot be saved"))
    try:
        import _queue

        out.append(((_queue.SimpleQueue,), "holds a SimpleQueue (thread pool internals)"))
    except ImportError:
        pass
    return out


_STALE_LIST: list[Any] = []
_UNSER_LIST: list[Any] = []
_SAFE_IO: tuple[type, ...] = (io.BytesIO, io.StringIO)


def _classify(t: type) -> tuple[int, Any]:
    """(kind, reason or reducer) for objects of type ``t``."""
    if not _STALE_LIST:
        _UNSER_LIST.extend(_unser_reasons())
        _STALE_LIST.extend(_stale_reasons())
    if issubclass(t, types.ModuleType):
        return _MODULE, ""
    np = sys.modules.get("numpy")
    if np is not None and t is np.ndarray:
        return _NDARRAY, ""
    torch = sys.modules.get("torch")
    if torch is not None:
        if issubclass(t, torch.Tensor):
            return _TENSOR, reducers.lookup(t)
        if issubclass(t, (torch.storage.TypedStorage, torch.UntypedStorage)):
            return _STORAGE, ""
    if issubclass(t, type) or t is types.FunctionType:
        return _CODE, ""
    reducer = reducers.lookup(t)
    if reducer is not None:
        return _REDUCER, reducer
    if np is not None and issubclass(t, np.ndarray) and _state_is_dict(np, t):
        return _NDSUB, ""
    name = f"{t.__module__}.{t.__qualname__}"
    for ts, reason in _UNSER_LIST:
        if issubclass(t, ts):
            return _UNSER_KIND, f"{name}: {reason}"
    if issubclass(t, _SAFE_IO):
        return _PLAIN, ""
    for ts, reason in _STALE_LIST:
        if issubclass(t, ts):
            return _STALE_KIND, f"{name}: {reason}"
    return _PLAIN, ""


_PICKLING = ("__reduce__", "__reduce_ex__", "__getstate__", "__setstate__")


def _state_is_dict(np: Any, t: type) -> bool:
    """An ndarray subclass whose whole state beyond its memory is its ``__dict__``: one that
    leaves pickling to ndarray, or numpy's masked array (its reduce saves just that). A class
    with pickling of its own (astropy's Column keeps its info apart) keeps its own reduce, as
    does a memmap (it comes back in memory: its mmap cannot travel) and ``masked`` (a
    singleton)."""
    if issubclass(t, (np.memmap, np.ma.MaskedArray)):
        return t is np.ma.MaskedArray
    return all(getattr(k, "__dict__", {}).keys().isdisjoint(_PICKLING)
               for k in t.__mro__ if k is not np.ndarray and k is not object)


def _by_name(obj: Any) -> bool:
    mod = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", "") or ""
    return bool(mod) and mod != "__main__" and "<locals>" not in qual and "<lambda>" not in qual


def _resolves(obj: Any) -> bool:
    """``obj`` is what its module (from sys.modules, as pickle looks it up) holds under its
    qualified name."""
    if not _by_name(obj):
        return False
    found: Any = sys.modules.get(obj.__module__)
    try:
        for part in obj.__qualname__.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 - a lazy module's __getattr__ may raise anything
        return False
    return found is obj


# -- module-level objects, saved by reference ---------------------------------------------------
_BY_VALUE: tuple[type, ...] = (int, float, complex, str, bytes, bool, type(None), dict, list, set,
                               frozenset, tuple, bytearray, type, types.ModuleType,
                               types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                               memoryview, range, slice)
_globals_index: dict[int, tuple[str, str]] = {}
_globals_key: list[int] = [-1]


def _module_globals() -> dict[int, tuple[str, str]]:
    """id -> (module, attribute) of the objects library modules hold (rebuilt when modules were
    imported since; every hit is checked again by identity, so a stale entry is only a miss)."""
    if _globals_key[0] == len(sys.modules):
        return _globals_index
    skip = _BY_VALUE + tuple(c for c in (_np_ndarray(), _torch_tensor()) if c is not None)
    index: dict[int, tuple[str, str]] = {}
    main = getattr(sys.modules.get("__main__"), "__dict__", None)
    for mname, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType) or mname in ("__main__", "__mp_main__"):
            continue  # the notebook's own namespace (multiprocessing aliases it) is by value
        if mod.__dict__ is main or mname.startswith(("jupyter_pause", "IPython", "ipykernel")):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        top = mname.partition(".")[0]
        for attr, v in items:
            # type(), not isinstance(): a deprecated alias's __class__ property warns
            t = type(v)
            if issubclass(t, skip) or attr.startswith("__"):
                continue
            # only a library's own objects (their class from the same package): something the
            # notebook hung on a module (``utils.model = model``) is not there after a restart
            if str(getattr(t, "__module__", "")).partition(".")[0] != top:
                continue
            i = id(v)
            if i not in index or t.__module__ == mname:
                index[i] = (mname, attr)
    _globals_index.clear()
    _globals_index.update(index)
    _globals_key[0] = len(sys.modules)
    return _globals_index


def _np_ndarray() -> type | None:
    np = sys.modules.get("numpy")
    return getattr(np, "ndarray", None)


def _torch_tensor() -> type | None:
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def _module_attr(module: str, attr: str) -> Any:
    """Unpickling side of a module-level object saved by reference."""
    return getattr(importlib.import_module(module), attr)


def _as_global(obj: Any, index: dict[int, tuple[str, str]]) -> Any:
    """A reduce to the module attribute that is ``obj``, or NotImplemented."""
    hit = index.get(id(obj))
    if hit is None:
        return NotImplemented
    mod = sys.modules.get(hit[0])
    if mod is None or getattr(mod, "__dict__", {}).get(hit[1]) is not obj:
        return NotImplemented
    return (_module_attr, hit)


# -- restore helpers (referenced by name from the pickle streams) -------------------------------
_load = threading.local()


def _load_storage(idx: int, dtype: str | None) -> Any:
    """Unpickling side of a storage reference: the storage restored by the reader."""
    storage = _load.resolver(idx)
    if dtype is None:
        return storage
    import torch

    return torch.storage.TypedStorage(
        wrap_storage=storage, dtype=getattr(torch, dtype), _internal=True
    )


def _identity(x: Any) -> Any:
    """Kept for streams written before reducers/torch_autograd.py (they name it)."""
    return x


def _rebuild_view(root: Any, offset: int, shape: tuple[Any, ...], strides: tuple[Any, ...],
                  dtype: Any, cls: type | None = None, readonly: bool = False) -> Any:
    """A numpy view onto its (restored) root array, so views keep sharing memory; of class
    ``cls`` (an ndarray subclass, built as numpy's own reconstruct builds one: its
    ``__array_finalize__`` sees no parent), read-only when the original was."""
    import numpy as np

    # through bytes in memory order (a Fortran-ordered root too), as a plain array (a masked
    # root would reshape its mask to the bytes): datetime64/timedelta64 have no buffer
    raw = root.view(np.ndarray).reshape(-1, order="A").view(np.uint8)
    out = np.ndarray.__new__(cls or np.ndarray, shape, dtype=dtype, buffer=raw, offset=offset,
                             strides=strides)
    if readonly:
        out.flags.writeable = False
    return out


def _array_over_storage(us: Any, offset: int, shape: tuple[Any, ...], strides: tuple[Any, ...],
                        dtype: Any, cls: type | None = None, readonly: bool = False) -> Any:
    """A numpy array over a restored torch storage (``Tensor.numpy()`` memory): they share."""
    import torch

    if us.device.type != "cpu":  # mapped to a GPU on restore: numpy can only get a copy
        us = us.cpu()
    raw = torch.empty(0, dtype=torch.uint8).set_(us).numpy()
    return _rebuild_view(raw, offset, shape, strides, dtype, cls, readonly)


def _storage_over_array(root: Any, offset: int, nbytes: int, dtype: str | None) -> Any:
    """A torch storage over a restored numpy array (``torch.from_numpy`` memory): they share."""
    import numpy as np
    import torch

    raw = root.reshape(-1, order="A") if root.ndim != 1 else root
    raw = raw.view(np.uint8)[offset : offset + nbytes]
    us = torch.from_numpy(raw).untyped_storage()
    if dtype is None:
        return us
    return torch.storage.TypedStorage(wrap_storage=us, dtype=getattr(torch, dtype), _internal=True)


def _extent(a: Any) -> tuple[int, int]:
    try:
        from numpy.lib.array_utils import byte_bounds
    except ImportError:  # numpy < 2 (whose stubs are not the ones installed here)
        from numpy import byte_bounds  # type: ignore[attr-defined,no-redef]
    bounds: tuple[int, int] = byte_bounds(a)
    return bounds


def _owner_of(lo: int, hi: int, shared: list[Any], kind: type) -> tuple[int, Any] | None:
    """(start, object) of a ``kind`` entry of ``shared`` whose memory holds [lo, hi)."""
    for s_lo, s_hi, o in shared:
        if isinstance(o, kind) and s_lo <= lo and hi <= s_hi:
            return s_lo, o
    return None


def _numpy_over_torch(obj: Any, shared: list[Any]) -> Any:
    """An array whose memory torch owns (its base chain ends in a tensor, not an ndarray):
    reduced over that storage, which the group's tensors save anyway."""
    import torch

    base = _root(obj)
    if base.base is None or obj.dtype.hasobject:
        return NotImplemented  # numpy owns it: torch storages are rebuilt over it instead
    lo, hi = _extent(obj)
    hit = _owner_of(lo, hi, shared, torch.UntypedStorage)
    if hit is None:
        return NotImplemented
    start, us = hit
    offset = obj.__array_interface__["data"][0] - start
    return (_array_over_storage, (us, offset, obj.shape, obj.strides, obj.dtype, *_extra(obj)))


def _extra(obj: Any) -> tuple[Any, ...]:
    """The optional arguments of :func:`_rebuild_view`, left out where they are the defaults."""
    import numpy as np

    cls = None if type(obj) is np.ndarray else type(obj)
    if not obj.flags.writeable:
        return (cls, True)
    return (cls,) if cls is not None else ()


def _root(obj: Any) -> Any:
    """The outermost ndarray of ``obj``'s base chain (``obj`` when it owns its memory)."""
    import numpy as np

    root = obj
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


def _owns(root: Any) -> bool:
    """``root`` owns its memory, or is the whole of a buffer (a restored array is built over
    the bytes read back: its views must keep sharing it in the next checkpoint too)."""
    if root.base is None:
        return True
    try:
        with memoryview(root.base) as mv:  # released at once: an mmap must stay closable
            return bool(mv.nbytes == root.nbytes)
    except (TypeError, ValueError, BufferError):
        return False


def _view_reduce(obj: Any, array_ids: set[int], roots: set[int]) -> Any:
    import numpy as np

    if not isinstance(obj.base, np.ndarray) or obj.dtype.hasobject:
        return NotImplemented
    root = _root(obj)
    # the root travels when a variable reaches it, when another view already took it along, or
    # when it costs little (owned by no one else, and small or mostly covered by this view);
    # else pickling it would save memory nobody asked for and the view is saved as a copy
    if not (root.flags.c_contiguous or root.flags.f_contiguous) or root.dtype.hasobject:
        return NotImplemented
    cheap = _owns(root) and root.nbytes <= max(VIEW_ROOT_MAX, 2 * obj.nbytes)
    if id(root) not in array_ids and id(root) not in roots and not cheap:
        return NotImplemented
    roots.add(id(root))
    offset = obj.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return (_rebuild_view, (root, offset, obj.shape, obj.strides, obj.dtype, *_extra(obj)))


def _set_dict(obj: Any, state: dict[str, Any]) -> None:
    """The subclass's attributes (a masked array's mask, a unit), set once ``obj`` exists
    (a state_setter: ndarray's own ``__setstate__`` takes numpy's tuple, not a dict)."""
    obj.__dict__.update(state)


def _subclass_from_buffer(buf: Any, dtype: Any, shape: tuple[Any, ...], order: Any, cls: type,
                          readonly: bool = False) -> Any:
    """An ndarray subclass instance over its saved bytes."""
    import numpy as np

    out = np.ndarray.__new__(cls, shape, dtype=dtype, buffer=buf, order=order)
    if readonly:
        out.flags.writeable = False
    return out


def _subclass_from_plain(plain: Any, cls: type) -> Any:
    """An ndarray subclass instance over a plain copy that numpy pickled (objects, datetimes:
    no buffer to build it over)."""
    return plain.view(cls)


def _shared_in(obj: Any, ctx: Ctx) -> bool:
    """``obj``'s memory is shared with another array the checkpoint saves: the walk met it or
    its root twice (see graph.Walk.shared_arrays), or its root already travels in this stream."""
    root = _root(obj)
    key = root.base if root.base is not None else root
    return id(root) in ctx.view_roots or id(root) in ctx.shared or id(key) in ctx.shared


def _subclass_reduce(obj: Any, ctx: Ctx) -> Any:
    """An ndarray subclass (``np.matrix``, a masked array, a notebook's own).

    numpy's own reduce of a subclass copies its data into the stream and drops the attributes
    of a subclass that does not save them itself (a masked array's saves its mask as bytes: a
    shared mask comes back apart, and ``nomask`` as an array of False). It is kept for one
    without attributes whose memory nothing else shares (a small matrix: the cheapest stream).
    Otherwise the memory is saved as a plain array's (a view rebuilt over its root, so the
    arrays that shared it still do) or as its own bytes (out of band when large), and the
    attributes go through the pickler. It is rebuilt as numpy rebuilds one
    (``__array_finalize__`` sees no parent)."""
    import numpy as np

    cls = type(obj)
    state = dict(obj.__dict__) if cls.__dictoffset__ and obj.__dict__ else None
    if obj.base is not None:
        # memory a tensor shares (the walk's shared_mem), or a root another array views
        r = _numpy_over_torch(obj, ctx.shared_mem) if ctx.shared_mem else NotImplemented
        if r is NotImplemented and _shared_in(obj, ctx):
            r = _view_reduce(obj, ctx.array_ids, ctx.view_roots)
        if r is not NotImplemented:
            return (*r, state, None, None, _set_dict)
    if state is None:
        return NotImplemented
    if obj.size and not obj.dtype.hasobject and obj.dtype.kind not in "mM" and (
            obj.flags.c_contiguous or obj.flags.f_contiguous):
        try:
            buf = pickle.PickleBuffer(obj)
        except (BufferError, TypeError, ValueError):
            pass
        else:
            order = "C" if obj.flags.c_contiguous else "F"
            return (_subclass_from_buffer, (buf, obj.dtype, obj.shape, order, cls,
                                            *(() if obj.flags.writeable else (True,))),
                    state, None, None, _set_dict)
    # a copy (never a view of obj: pickling that would come back here); an object array's
    # copy holds the same items, which the pickler keeps shared
    plain = np.array(obj, subok=False, order="K")
    return (_subclass_from_plain, (plain, cls), state, None, None, _set_dict)


# -- the pickling context -----------------------------------------------------------------------
class Ctx:
    """What one pickling attempt collected: out-of-band buffers and storages."""

    def __init__(self, oob_min: int = OOB_MIN, array_ids: set[int] | None = None,
                 shared_mem: list[Any] | None = None, shared: set[int] | None = None) -> None:
        self.oob_min = oob_min
        self.array_ids = array_ids or set()
        self.shared_mem = shared_mem or []  # see graph.Walk.shared_mem
        self.view_roots: set[int] = set()  # roots of views pickled so far (kept alive by obj)
        self.shared = shared or set()  # see graph.Walk.shared_arrays
        self.buffers: list[memoryview] = []
        self.storages: list[Any] = []  # UntypedStorage, in stream index order
        self.storage_dtype: list[str] = []
        self._sidx: dict[int, int] = {}
        self.module_globals = _module_globals()

    def buffer_callback(self, pb: pickle.PickleBuffer) -> bool:
        try:
            mv = pb.raw()
        except BufferError:  # not contiguous: pickle copies it in band
            return True
        if mv.nbytes < self.oob_min:
            return True
        self.buffers.append(mv)
        return False

    def storage_ref(self, obj: Any) -> tuple[Any, ...]:
        torch = sys.modules["torch"]
        if isinstance(obj, torch.storage.TypedStorage):
            us, dtype = obj._untyped_storage, str(obj.dtype).replace("torch.", "")
        else:
            us, dtype = obj, None
        if self.shared_mem and us.device.type == "cpu" and us.nbytes():
            over = self._over_numpy(us, dtype)
            if over is not None:
                return over
        key = us._cdata
        idx = self._sidx.get(key)
        if idx is None:
            idx = self._sidx[key] = len(self.storages)
            self.storages.append(us)
            self.storage_dtype.append(dtype or "uint8")
        return (_load_storage, (idx, dtype))


    def _over_numpy(self, us: Any, dtype: str | None) -> tuple[Any, ...] | None:
        """A storage inside memory a numpy array owns (``torch.from_numpy``): rebuilt over
        that array, which then travels in the stream instead of a pack."""
        import numpy as np

        lo = us.data_ptr()
        owners = [m for m in self.shared_mem if isinstance(m[2], np.ndarray) and m[2].base is None]
        hit = _owner_of(lo, lo + us.nbytes(), owners, np.ndarray)
        if hit is None:
            return None
        start, root = hit
        return (_storage_over_array, (root, lo - start, us.nbytes(), dtype))


def _override(self: Any, obj: Any, strict: bool) -> Any:
    t = type(obj)
    k = _kind_cache.get(t)
    if k is None:
        k = _kind_cache[t] = _classify(t)
    kind = k[0]
    if kind in (_PLAIN, _REDUCER, _STALE_KIND, _NDSUB):
        r = _as_global(obj, self.ctx.module_globals)
        if r is not NotImplemented or kind == _PLAIN:
            return r
    if kind == _NDARRAY:
        if obj.base is None:
            return NotImplemented
        if self.ctx.shared_mem:
            r = _numpy_over_torch(obj, self.ctx.shared_mem)
            if r is not NotImplemented:
                return r
        return _view_reduce(obj, self.ctx.array_ids, self.ctx.view_roots)
    if kind == _NDSUB:
        if t in copyreg.dispatch_table:  # a registration of the notebook's wins
            return NotImplemented
        return _subclass_reduce(obj, self.ctx)
    if kind == _MODULE:
        return (importlib.import_module, (obj.__name__,))
    if kind == _REDUCER:
        return k[1](obj)
    if kind == _TENSOR:
        if k[1] is not None:  # autograd history: see reducers/torch_autograd.py
            r = k[1](obj)
            if r is not NotImplemented:
                return r
        return NotImplemented
    if kind == _STORAGE:
        return self.ctx.storage_ref(obj)
    if kind == _CODE:
        if strict:
            if not _by_name(obj):
                raise _NeedsDill()
            return NotImplemented
        return obj.__qualname__ if _resolves(obj) else NotImplemented
    if kind == _UNSER_KIND:
        qual = getattr(obj, "__qualname__", None)
        if isinstance(obj, (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType)):
            raise SkipVariable(f"{qual}(): {k[1]}: its paused frame is process memory; re-run "
                               "its cell (or keep a list of what it yields)")
        raise SkipVariable(k[1])
    raise StaleObject(k[1])


class FastPickler(pickle.Pickler):
    """The standard pickler, with tensors and large buffers handed to ``ctx`` out of band."""

    def __init__(self, file: Any, ctx: Ctx) -> None:
        super().__init__(file, protocol=5, buffer_callback=ctx.buffer_callback)
        self.ctx = ctx

    def reducer_override(self, obj: Any) -> Any:
        return _override(self, obj, True)


_dill_pickler: type | None = None


def _dill_class() -> type:
    global _dill_pickler
    if _dill_pickler is None:
        import dill

        class DillPickler(dill.Pickler):  # type: ignore[misc]  # dill ships no types
            """dill for what the standard pickler refuses, buffers out of band as above."""

            def __init__(self, file: Any, ctx: Ctx) -> None:
                super().__init__(file, protocol=5, buffer_callback=ctx.buffer_callback)
                self.ctx = ctx

            def reducer_override(self, obj: Any) -> Any:
                return _override(self, obj, False)

        _dill_pickler = DillPickler
    return _dill_pickler


def reason_of(e: BaseException) -> str:
    if isinstance(e, SkipVariable):
        return str(e.args[0]) if e.args else "cannot be saved"
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class _Frames:
    """The picklers' output file. Its ``write`` is Python code on purpose: the C pickler calls it
    once per 64 KiB frame, and only while running Python code can the interpreter hand the GIL
    to the blob-writer threads. Into a BytesIO, one dump of a million small objects holds the
    GIL for seconds, and the array writes that should overlap it stall."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, data: Any) -> int:
        # large payloads come as the object itself (bytearray, PickleBuffer): copy them now
        b = data if type(data) is bytes else bytes(data)
        self.parts.append(b)
        self.size += len(b)
        return len(b)

    def getvalue(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


def dump_group(
    values: dict[str, Any], oob_min: int = OOB_MIN, array_ids: set[int] | None = None,
    shared_mem: list[Any] | None = None, shared: set[int] | None = None,
) -> tuple[bytes, str, Ctx]:
    """Pickle ``values`` (name -> object) as one stream. Returns (stream, pickler name, ctx).

    Raises SkipVariable/StaleObject with a reason, or the pickler's own exception.
    """
    frames, pickler, ctx = dump_group_frames(values, oob_min, array_ids, shared_mem, shared)
    return frames.getvalue(), pickler, ctx


def dump_group_frames(
    values: dict[str, Any], oob_min: int = OOB_MIN, array_ids: set[int] | None = None,
    shared_mem: list[Any] | None = None, shared: set[int] | None = None, tree: bool = False,
) -> tuple[_Frames, str, Ctx]:
    """:func:`dump_group`, the stream left in its frames (``parts``): a writer hands them on
    as they are, where joining them would copy the whole stream once more under the GIL.
    ``tree``: the walk found no object reached twice (``graph.Walk.trees``), so plain data may
    be pickled without the memo (``plain.py``)."""
    try:
        return _dump(values, oob_min, array_ids, shared_mem, shared, tree)
    except RecursionError:
        pass  # a deep structure: again, on a stack that holds it
    try:
        return call_deep(lambda: _dump(values, oob_min, array_ids, shared_mem, shared, tree))
    except RecursionError:
        raise SkipVariable(_TOO_DEEP) from None


_TOO_DEEP = ("nested too deeply to pickle, even on a large stack (RecursionError); "
             "Python 3.12/3.13 cap C recursion at a fixed depth")


def _dump(values: dict[str, Any], oob_min: int, array_ids: set[int] | None,
          shared_mem: list[Any] | None, shared: set[int] | None = None, tree: bool = False
          ) -> tuple[_Frames, str, Ctx]:
    ctx = Ctx(oob_min, array_ids, shared_mem, shared)
    buf = _Frames()
    if tree:
        if dump_plain(values, buf):
            return buf, "pickle", ctx
        buf = _Frames()
    try:
        FastPickler(buf, ctx).dump(values)
        return buf, "pickle", ctx
    except (SkipVariable, RecursionError):
        raise
    except Exception:  # noqa: BLE001, S110 - lambdas, closures, __main__ code: dill's job
        pass
    ctx = Ctx(oob_min, array_ids, shared_mem, shared)
    buf = _Frames()
    _dill_class()(buf, ctx).dump(values)
    return buf, "dill", ctx


def load_group(stream: Any, pickler: str, buffers: list[Any], resolver: Any
               ) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Unpickle one group: its values by name, and for each variable that came back only in
    part what is missing (notes of the reducers, e.g. a tensor without its autograd graph)."""
    try:
        got, notes = _load_group(stream, pickler, buffers, resolver)
    except RecursionError:  # a deep structure's __setstate__ chain etc.: on a big stack
        got, notes = call_deep(lambda: _load_group(stream, pickler, buffers, resolver))
    return got, (notes_by_variable(got, notes) if notes and isinstance(got, dict) else {})


def _load_group(stream: Any, pickler: str, buffers: list[Any], resolver: Any) -> tuple[Any, list[Any]]:
    _load.resolver = resolver
    weakrefs.start()
    try:
        with collecting_notes() as notes:
            if pickler == "dill":
                import dill

                got = dill.Unpickler(io.BytesIO(stream), buffers=buffers).load()
            else:
                got = pickle.Unpickler(io.BytesIO(stream), buffers=buffers).load()
            weakrefs.finish()  # the unpickler's memo is gone: a referent only it held died
    finally:
        _load.resolver = None
        weakrefs.stop()
    return got, notes
