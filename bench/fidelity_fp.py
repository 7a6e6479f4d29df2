"""Structural fingerprints of a kernel's variables, for comparing a namespace with its restore.

Runs inside the kernels (original and restored). Each variable becomes a nested tuple built from
its value, attribute by attribute where the library has no value equality of its own, and a
hash of it is what gets compared. Aliasing is part of the fingerprint: a mutable object reached a
second time is written as a reference to where it was first met (variable, position), and arrays
and tensors record which memory they share, so ``b = a`` or a view that became a copy shows up as
a difference. Process-bound identity (ids, comm ids, addresses in reprs) is left out.
"""

from __future__ import annotations

import hashlib
import io
import re
import socket
import sys
import threading
import types
from typing import Any

_ATOMIC = (int, float, complex, str, bytes, bool, type(None), range, slice)
_ADDR = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")
MAX_DEPTH = 40
MAX_ITEMS = 5000  # a container is fingerprinted by its first items and its length beyond that
# attributes that name the process, not the value (widget comm ids, bokeh document links)
_VOLATILE = frozenset({"comm", "_model_id", "log", "_document", "_temp_document", "_callbacks"})


def _h(b: bytes) -> str:
    return hashlib.blake2b(b, digest_size=12).hexdigest()


class _FP:
    def __init__(self) -> None:
        self.seen: dict[int, tuple[str, int]] = {}  # id -> (variable, position)
        self.mem: dict[Any, tuple[str, int]] = {}  # memory owner -> first (variable, position)
        self.keep: list[Any] = []  # objects made while fingerprinting stay alive (stable ids)
        self.var = ""
        self.pos = 0

    def run(self, name: str, value: Any) -> Any:
        self.var, self.pos = name, 0
        return self.fp(value, 0)

    def _ref(self, obj: Any) -> tuple | None:
        r = self.seen.get(id(obj))
        if r is not None:
            return ("ref", r[0] if r[0] != self.var else "", r[1])
        self.seen[id(obj)] = (self.var, self.pos)
        self.keep.append(obj)
        self.pos += 1
        return None

    def _mem(self, owner: Any) -> tuple:
        self.keep.append(owner)
        r = self.mem.setdefault(id(owner), (self.var, self.pos))
        return (r[0] if r[0] != self.var else "", r[1])

    def fp(self, obj: Any, depth: int) -> Any:
        t = type(obj)
        if isinstance(obj, _ATOMIC):
            return (t.__name__, repr(obj))
        if depth > MAX_DEPTH:
            return ("deep", t.__qualname__)
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return ("tuple", tuple(self.fp(x, depth + 1) for x in obj[:MAX_ITEMS]), len(obj))
        if isinstance(obj, (frozenset,)):
            return ("frozenset", tuple(sorted(repr(self.fp(x, depth + 1)) for x in obj)))
        if isinstance(obj, type):
            return ("class", obj.__module__, obj.__qualname__)
        ref = self._ref(obj)
        if ref is not None:
            return ref
        np = sys.modules.get("numpy")
        torch = sys.modules.get("torch")
        pd = sys.modules.get("pandas")
        if np is not None and isinstance(obj, np.ndarray):
            return self._ndarray(obj, depth)
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(obj, depth)
        if pd is not None and isinstance(obj, (pd.DataFrame, pd.Series, pd.Index)):
            return self._pandas(obj, pd)
        if isinstance(obj, (list, bytearray, set, dict)):
            return self._container(obj, depth)
        if isinstance(obj, (types.FunctionType, types.LambdaType)):
            return self._function(obj, depth)
        if isinstance(obj, types.MethodType):
            return ("method", obj.__func__.__qualname__, self.fp(obj.__self__, depth + 1))
        if isinstance(obj, types.BuiltinFunctionType):
            owner = getattr(obj, "__self__", None)
            return ("builtin", getattr(obj, "__qualname__", ""), _ADDR.sub("", repr(owner)))
        if isinstance(obj, io.IOBase):
            return self._file(obj)
        if isinstance(obj, types.GeneratorType):
            return ("generator", obj.__qualname__, obj.gi_frame is None)
        return self._object(obj, depth)

    def _ndarray(self, a: Any, depth: int) -> tuple:
        owner: Any = a
        while True:  # the object that owns the memory: views of one array share it
            nxt = owner.obj if isinstance(owner, memoryview) else getattr(owner, "base", None)
            if nxt is None:
                break
            owner = nxt
        shares = self._mem(owner)
        if a.dtype.hasobject:
            body = tuple(self.fp(x, depth + 1) for x in a.ravel().tolist()[:MAX_ITEMS])
        else:
            body = _h(a.tobytes())
        return ("ndarray", type(a).__name__, str(a.dtype), a.shape, body, shares)

    def _tensor(self, t: Any, depth: int) -> tuple:
        try:
            st = t.untyped_storage()
            shares = self._mem(("storage", st.data_ptr(), st.nbytes()))
            body = _h(t.detach().cpu().contiguous().numpy().tobytes())
        except Exception:  # noqa: BLE001 - sparse/meta tensors: value only
            shares, body = None, repr(t)
        grad = self.fp(t.grad, depth + 1) if t.grad is not None else None
        gf = type(t.grad_fn).__name__ if t.grad_fn is not None else None
        return ("tensor", str(t.dtype), tuple(t.shape), t.requires_grad, gf, body, shares, grad)

    def _pandas(self, obj: Any, pd: Any) -> tuple:
        try:
            vals = _h(pd.util.hash_pandas_object(obj, index=True).to_numpy().tobytes())
        except Exception:  # noqa: BLE001 - unhashable cells (lists): the text form
            vals = _h(obj.to_string().encode())
        meta = [type(obj).__name__, getattr(obj, "shape", None), getattr(obj, "name", None)]
        if isinstance(obj, pd.DataFrame):
            meta += [list(map(str, obj.columns)), list(map(str, obj.dtypes))]
        else:
            meta.append(str(obj.dtype))
        if isinstance(obj, pd.Index):
            meta.append(str(getattr(obj, "freq", None)))
        return ("pandas", repr(meta), vals)

    def _container(self, obj: Any, depth: int) -> tuple:
        if isinstance(obj, bytearray):
            return ("bytearray", _h(bytes(obj)))
        if isinstance(obj, set):
            return ("set", tuple(sorted(repr(self.fp(x, depth + 1)) for x in obj)))
        if isinstance(obj, dict):
            items = list(obj.items())[:MAX_ITEMS]
            return (
                type(obj).__name__,
                tuple((self.fp(k, depth + 1), self.fp(v, depth + 1)) for k, v in items),
                len(obj),
            )
        body = tuple(self.fp(x, depth + 1) for x in obj[:MAX_ITEMS])
        return (type(obj).__name__, body, len(obj), self._attrs(obj, depth))

    def _function(self, f: Any, depth: int) -> tuple:
        mod, qual = getattr(f, "__module__", None), f.__qualname__
        if mod and mod != "__main__" and "<" not in qual:
            return ("function", mod, qual)  # importable by name: the same function
        code = f.__code__
        consts = tuple(
            self.fp(c, depth + 1) for c in code.co_consts if not isinstance(c, types.CodeType)
        )  # frozenset constants: fingerprinted in sorted order (their repr order is random)
        closure = tuple(
            self.fp(c.cell_contents, depth + 1) for c in (f.__closure__ or ()) if _full(c)
        )
        return (
            "function",
            mod,
            qual,
            _h(code.co_code + repr(consts).encode()),
            self.fp(f.__defaults__, depth + 1),
            closure,
            self._attrs(f, depth),
        )

    def _file(self, f: Any) -> tuple:
        try:
            pos = f.tell() if not f.closed else None
        except (OSError, ValueError):
            pos = None
        name = getattr(f, "name", None)
        return ("file", type(f).__name__, repr(name), getattr(f, "mode", None), f.closed, pos)

    def _attrs(self, obj: Any, depth: int) -> Any:
        d = getattr(obj, "__dict__", None)
        if not isinstance(d, dict) or not d:
            return None
        return tuple((k, self.fp(v, depth + 1)) for k, v in sorted(d.items()) if k not in _VOLATILE)

    def _object(self, obj: Any, depth: int) -> tuple:
        t = type(obj)
        name = f"{t.__module__}.{t.__qualname__}"
        custom = self._library(obj, depth)
        if custom is not None:
            return (name, custom)
        state: list[Any] = []
        getstate = getattr(t, "__getstate__", None)
        if getstate is not None and getstate is not object.__getstate__:
            # the class says what its state is (and so what pickling keeps): compare that
            try:
                return (name, "state", self.fp(obj.__getstate__(), depth + 1))
            except Exception:  # noqa: BLE001, S110 - then attribute by attribute
                pass
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            state.append(self._attrs(obj, depth))
        for cls in t.__mro__:
            for s in (
                getattr(cls, "__slots__", ())
                if isinstance(cls.__dict__.get("__slots__"), (tuple, list, str))
                else ()
            ):
                s = s if not s.startswith("__") or s.endswith("__") else f"_{cls.__name__}{s}"  # noqa: PLW2901 - the mangled name from here on
                if s in ("__dict__", "__weakref__") or s in _VOLATILE:
                    continue
                if hasattr(obj, s):
                    state.append((s, self.fp(getattr(obj, s), depth + 1)))
        if not state or state == [None]:
            # a C object with no Python-level state: its text form, addresses left out
            try:
                text = _ADDR.sub("", repr(obj))
            except Exception:  # noqa: BLE001
                text = ""
            return (name, text)
        return (name, tuple(state))

    def _library(self, obj: Any, depth: int) -> Any:
        """Libraries whose objects are best compared through their own public state."""
        traitlets = sys.modules.get("traitlets")
        if traitlets is not None and isinstance(obj, traitlets.HasTraits):
            vals = obj.trait_values() if hasattr(obj, "trait_values") else {}
            names = sorted(k for k in vals if k not in _VOLATILE and not k.startswith("_"))
            extra = self._attrs_public(obj, depth, set(vals))
            return (tuple((k, self.fp(vals[k], depth + 1)) for k in names), extra)
        bokeh_model = sys.modules.get("bokeh.model")
        if bokeh_model is not None and isinstance(obj, bokeh_model.Model):
            # every property's value, defaults included: which ones count as "set" differs
            # when a value equal to the default is set (Field("x") with bokeh's own Unspecified
            # is the default of a glyph's x), while the figure is the same
            props = obj.properties_with_values(include_defaults=True)
            return (obj.id, tuple((k, self.fp(v, depth + 1)) for k, v in sorted(props.items())))
        bokeh_wrappers = sys.modules.get("bokeh.core.property.wrappers")
        if bokeh_wrappers is not None and isinstance(obj, bokeh_wrappers.PropertyValueContainer):
            if isinstance(obj, dict):
                return tuple((repr(k), self.fp(v, depth + 1)) for k, v in obj.items())
            return tuple(self.fp(v, depth + 1) for v in obj)
        np = sys.modules.get("numpy")
        cbook = sys.modules.get("matplotlib.cbook")
        if cbook is not None and isinstance(obj, cbook.CallbackRegistry):
            # connection ids are handed out again when a figure is rebuilt: compare what is
            # connected to which signal, not the numbering
            return tuple(
                (
                    sig,
                    tuple(
                        sorted(
                            repr(self.fp(getattr(r, "_obj", r), depth + 1)) for r in cbs.values()
                        )
                    ),
                )
                for sig, cbs in sorted(obj.callbacks.items())
            )
        if isinstance(obj, socket.socket):  # the descriptor number is the process's, not a value
            return (int(obj.family), int(obj.type), obj.proto, obj.fileno() == -1)
        if type(obj).__module__ == "_hashlib" and hasattr(obj, "hexdigest"):
            return (obj.name, obj.hexdigest())
        bases = sys.modules.get("matplotlib.backend_bases")
        if bases is not None and isinstance(obj, bases.FigureManagerBase):
            return ("figure manager", obj.num)  # the window binding, rebuilt by pyplot
        if isinstance(obj, threading.local):
            return "per-thread state"  # each thread sees its own: not a value of the object
        wcs = sys.modules.get("astropy.wcs")
        if wcs is not None and isinstance(obj, wcs.WCS):
            # astropy's own description of a WCS: its FITS header (SIP/distortions included)
            return (obj.to_header_string(relax=True), obj.pixel_shape, obj.naxis)
        if np is not None and isinstance(obj, np.random.Generator):
            return repr(obj.bit_generator.state)
        if np is not None and isinstance(obj, np.random.RandomState):
            st = obj.get_state(legacy=False)
            return repr(
                {k: (_h(v.tobytes()) if hasattr(v, "tobytes") else v) for k, v in st.items()}
            )
        return None

    def _attrs_public(self, obj: Any, depth: int, skip: set[str]) -> Any:
        d = getattr(obj, "__dict__", None)
        if not isinstance(d, dict):
            return None
        return tuple(
            (k, self.fp(v, depth + 1))
            for k, v in sorted(d.items())
            if k not in skip and not k.startswith("_") and k not in _VOLATILE
        )


def _full(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def fingerprints(ns: dict[str, Any], detail: bool = False) -> dict[str, str]:
    """name -> digest (or, with ``detail``, the full structure as text) for the user variables of
    ``ns``, in one shared walk so that aliasing between variables counts."""
    fp = _FP()
    out: dict[str, str] = {}
    for name in user_names(ns):
        try:
            text = repr(fp.run(name, ns[name]))
            out[name] = text if detail else _h(text.encode())
        except Exception as e:  # noqa: BLE001 - a variable we cannot read is a variable lost
            out[name] = f"unreadable: {type(e).__name__}: {e}"
    return out


def user_names(ns: dict[str, Any]) -> list[str]:
    """IPython's rule (%who): no ``_`` names, no modules, no names IPython put there itself."""
    try:
        hidden = get_ipython().user_ns_hidden  # type: ignore[name-defined]
    except NameError:
        hidden = {}
    always = {"In", "Out", "exit", "quit", "get_ipython"}
    missing = object()
    return sorted(
        k
        for k, v in ns.items()
        if not k.startswith("_")
        and k not in always
        and not isinstance(v, types.ModuleType)
        and hidden.get(k, missing) is not v
    )
