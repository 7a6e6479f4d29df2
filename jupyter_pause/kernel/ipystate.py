"""IPython's share of the process state, registered into :mod:`..checkpoint.procstate`: the
execution counter and input history (the cell after a restore is numbered on, ``In[n]`` and
``_i<n>`` still work), output history (``Out[n]`` / ``_n``, stored as variables: their values go
through the pickler like any other), loaded extensions, ``%autoreload``'s mode, ``%config``
changes and the ``%matplotlib`` backend.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ..checkpoint import procstate
from ..checkpoint.procstate import (
    BadState,
    Entry,
    Outcome,
    environment,
    is_int,
    need,
    scalar,
    settings,
)
from ..variables import VariableRow, row

_IN_MAX_BYTES = 256 * 1024  # input history kept in the manifest (the newest cells)
_NOT_CONFIG = ("IPKernelApp", "KernelApp", "TerminalIPythonApp")  # the launch's, not %config's
_INLINE = "module://matplotlib_inline.backend_inline"
# What ipykernel puts into os.environ at its start (zmqshell's init_environment, the kernel
# app's MPLBACKEND and debugger flag): a fresh kernel sets them again, they are not the user's.
_IPYKERNEL_ENV = {"TERM": "xterm-color", "CLICOLOR": "1", "FORCE_COLOR": "1",
                  "CLICOLOR_FORCE": "1", "PAGER": "cat", "GIT_PAGER": "cat", "MPLBACKEND": _INLINE,
                  "PYDEVD_USE_FRAME_EVAL": "NO"}
OUT_ROW = "Out (output history)"


def _ip() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _next_cell(ip: Any) -> int:
    # Inside a cell IPython 9 has already counted it, IPython 8 counts it afterwards; In holds
    # the running cell either way: the next cell is the larger of the two.
    return max(int(ip.execution_count), len(ip.history_manager.input_hist_parsed))


# -- execution counter and In -----------------------------------------------------------------------


def _count_capture() -> Any:
    ip = _ip()
    if ip is None:
        return None
    nxt = _next_cell(ip)
    hist = list(ip.history_manager.input_hist_parsed[:nxt])
    first, used = len(hist), 0
    while first > 1 and used + len(hist[first - 1]) <= _IN_MAX_BYTES:
        first -= 1
        used += len(hist[first])
    return {"next": nxt, "first": first, "inputs": hist[first:]}


def _count_restore(state: Any) -> list[Outcome]:
    ip = _ip()
    if ip is None:
        return [("IPython execution count", "skipped", "not an IPython kernel")]
    need(isinstance(state, dict), "not a mapping")
    nxt, first, inputs = state.get("next"), state.get("first"), state.get("inputs")
    need(is_int(nxt) and 0 < nxt < 1 << 31, "next out of range")
    need(is_int(first) and 1 <= first <= nxt, "first out of range")
    need(isinstance(inputs, list) and len(inputs) == nxt - first
         and all(isinstance(s, str) for s in inputs), "inputs is not a list of cells")
    here = _next_cell(ip)
    if here > nxt:  # going back would reuse numbers of this session's own history
        return [("IPython execution count", "skipped",
                 f"this kernel already ran {here - 1} cells, the checkpoint {nxt - 1}")]
    hm = ip.history_manager
    in_cell = len(hm.input_hist_parsed) > ip.execution_count  # IPython 8 adds one afterwards
    hist = [""] * first + inputs  # cells before ``first`` were not kept
    for lst in (hm.input_hist_parsed, hm.input_hist_raw):
        lst[:] = hist
    ip.user_ns.update({f"_i{n}": s for n, s in enumerate(inputs, start=first)})
    ip.execution_count = nxt - 1 if in_cell else nxt
    return [("IPython execution count", "restored", f"the next cell is [{nxt}]")]


# -- Out: stored as variables ----------------------------------------------------------------------


def outputs(ip: Any) -> dict[str, Any]:
    """``{"_n": value}`` for IPython's output history, to be written with the variables."""
    out = getattr(ip.history_manager, "output_hist", None) or {}
    return {f"_{n}": v for n, v in sorted(out.items()) if is_int(n) and v is not None}


def is_output_name(name: Any) -> bool:
    return isinstance(name, str) and name[:1] == "_" and name[1:].isdigit()


def output_row(rows: list[VariableRow]) -> VariableRow | None:
    """The one process-state row for the ``_n`` rows of a report (which it leaves out)."""
    outs = [r for r in rows if is_output_name(r.get("name"))]
    if not outs:
        return None
    good = [r for r in outs if r.get("status") in ("saved", "restored")]
    bad = [f"Out[{str(r['name'])[1:]}]: {r.get('reason') or r.get('status')}" for r in outs
           if r not in good]
    status = (good[0]["status"] if good else outs[0].get("status")) or "skipped"
    why = f"{len(good)} of {len(outs)} outputs" + (f"; {'; '.join(bad[:3])}" if bad else "")
    return row(OUT_ROW, status, why, kind=procstate.KIND,
               size=sum(r.get("size") or 0 for r in good))


def adopt_outputs(ip: Any, values: dict[str, Any]) -> None:
    """Move restored ``_n`` values into IPython's output history (``Out`` and ``_``/``__``/
    ``___`` as the displayhook would have set them)."""
    outs = {int(k[1:]): values.pop(k) for k in [k for k in values if is_output_name(k)]}
    if not outs:
        return
    hist = ip.history_manager.output_hist
    hist.update(outs)
    ip.user_ns.update({f"_{n}": v for n, v in outs.items()})
    last = [hist[n] for n in sorted(hist)[-3:]][::-1]
    for name, v in zip(("_", "__", "___"), last, strict=False):
        ip.user_ns[name] = v


# -- extensions, %autoreload, %config, %matplotlib -------------------------------------------------


def _ext_capture() -> Any:
    ip = _ip()
    loaded = sorted(getattr(getattr(ip, "extension_manager", None), "loaded", ()) or ())
    return {"loaded": loaded} if loaded else None


def _dotted(s: Any) -> bool:
    return isinstance(s, str) and 0 < len(s) <= 200 and all(p.isidentifier() for p in s.split("."))


def _ext_restore(state: Any) -> list[Outcome]:
    ip = _ip()
    need(isinstance(state, dict) and isinstance(state.get("loaded"), list)
         and all(_dotted(s) for s in state["loaded"]), "not a list of extensions")
    if ip is None:
        return [("IPython extensions", "skipped", "not an IPython kernel")]
    em = ip.extension_manager
    done, failed = [], []
    for name in state["loaded"]:
        if name in em.loaded:
            continue
        try:
            em.load_extension(name)
            done.append(name)
        except Exception as e:  # noqa: BLE001 - one extension missing here is named
            failed.append(f"{name} ({type(e).__name__})")
    why = [f"loaded {', '.join(done)}"] if done else []
    if failed:
        why.append(f"not loaded: {', '.join(failed)}")
    return [("IPython extensions", "failed" if failed and not done else "restored",
             "; ".join(why) or None)]


_AUTORELOAD = ("enabled", "check_all", "autoload_obj")


def _reloader(ip: Any) -> Any:
    magics = getattr(getattr(ip, "magics_manager", None), "registry", {}).get("AutoreloadMagics")
    return getattr(magics, "_reloader", None)


def _ar_capture() -> Any:
    r = _reloader(_ip())
    if r is None:
        return None
    return {k: getattr(r, k) for k in _AUTORELOAD if isinstance(getattr(r, k, None), bool)}


def _ar_restore(state: Any) -> list[Outcome]:
    need(isinstance(state, dict) and all(k in _AUTORELOAD and isinstance(v, bool)
                                         for k, v in state.items()), "not autoreload flags")
    r = _reloader(_ip())
    if r is None:
        return [("%autoreload", "skipped", "the autoreload extension is not loaded")]
    for k, v in state.items():
        setattr(r, k, v)
    mode = 0 if not state.get("enabled") else 3 if state.get("autoload_obj") else (
        2 if state.get("check_all") else 1)
    return [("%autoreload", "restored", f"mode {mode}")]


def _cfg_capture() -> Any:
    ip = _ip()
    if ip is None:
        return None
    out: dict[str, dict[str, Any]] = {}
    for section, values in ip.config.items():
        if section in _NOT_CONFIG or not isinstance(values, Mapping):
            continue
        keep = {k: v for k, v in values.items() if isinstance(k, str) and _config_value(v)}
        if keep:
            out[section] = keep
    return out or None


def _config_value(v: Any) -> bool:
    return scalar(v) or (isinstance(v, list) and all(scalar(x) for x in v))


def _cfg_restore(state: Any) -> list[Outcome]:
    need(isinstance(state, dict) and all(
        isinstance(s, str) and s.isidentifier() and isinstance(v, dict)
        and all(isinstance(k, str) and k.isidentifier() and _config_value(x) for k, x in v.items())
        for s, v in state.items()), "not a config")
    ip = _ip()
    if ip is None:
        return [("%config", "skipped", "not an IPython kernel")]
    from traitlets.config import Config

    cfg, done, kept = Config(), [], []
    for section, values in state.items():
        have = dict.get(ip.config, section) or {}
        for k, v in values.items():
            if k in have and have[k] != v:
                kept.append(f"{section}.{k}")  # this kernel's launch set its own
            elif have.get(k, object()) != v:
                cfg[section][k] = v
                done.append(f"{section}.{k}")
    failed = []
    if done:
        for c in ip.configurables:  # as %config does
            try:
                c.update_config(cfg)
            except Exception as e:  # noqa: BLE001 - reported, the others still get theirs
                failed.append(f"{type(c).__name__}: {type(e).__name__}")
    why = [f"set {', '.join(done[:6])}"] if done else []
    if kept:
        why.append(f"differs from the new environment: kept {', '.join(kept[:6])}")
    if failed:
        why.append(f"not applied to {', '.join(failed[:3])}")
    return [("%config", "restored", "; ".join(why) or None)]


def _mpl_capture() -> Any:
    mpl = sys.modules.get("matplotlib")
    if mpl is None or _ip() is None:
        return None
    backend = mpl.rcParams._get_backend_or_none()
    start = environment.start_environ().get("MPLBACKEND") or _INLINE
    if not isinstance(backend, str) or backend == start:
        return None
    return {"backend": backend}


def _mpl_restore(state: Any) -> list[Outcome]:
    need(isinstance(state, dict) and isinstance(state.get("backend"), str)
         and 0 < len(state["backend"]) <= 200, "not a backend")
    ip = _ip()
    if ip is None:
        return [("%matplotlib", "skipped", "not an IPython kernel")]
    backend = state["backend"]
    gui = {_INLINE: "inline", "module://ipympl.backend_nbagg": "widget"}.get(
        backend, backend.lower())
    if not _dotted(gui.removeprefix("module://")):
        raise BadState("not a backend")
    ip.enable_matplotlib(gui)
    return [("%matplotlib", "restored", gui)]


_grad_mode: list[bool | None] = [None]


def _note_grad_mode(*_: Any) -> None:
    """After each cell, on the main thread: torch's grad mode, for captures on other threads."""
    torch = sys.modules.get("torch")
    fn = getattr(torch, "is_grad_enabled", None)
    _grad_mode[0] = bool(fn()) if fn is not None else None


if (_shell := _ip()) is not None:
    if isinstance(getattr(_shell, "starting_dir", None), str):
        environment.START_DIRS.append(_shell.starting_dir)
    if "ipykernel" in sys.modules:
        environment.RUNTIME_SET.update(_IPYKERNEL_ENV)
    _shell.events.register("post_run_cell", _note_grad_mode)
    settings.main_grad_mode = lambda: _grad_mode[0]

procstate.register(Entry("ipython.extensions", "IPython extensions", _ext_capture, _ext_restore,
                         order=80))
procstate.register(Entry("ipython.autoreload", "%autoreload", _ar_capture, _ar_restore, order=81))
procstate.register(Entry("ipython.config", "%config", _cfg_capture, _cfg_restore, order=82))
procstate.register(Entry("ipython.matplotlib", "%matplotlib", _mpl_capture, _mpl_restore,
                         order=83))
procstate.register(Entry("ipython.count", "IPython execution count", _count_capture,
                         _count_restore, order=90))
