"""Library settings that differ from their defaults: numpy's and torch's print options, torch's
default dtype, threads, determinism, cuDNN/TF32 flags and grad mode, pandas options, matplotlib
rcParams. Read only for libraries the process has imported; on restore, a library is imported
only to put back settings it had (the notebook used it).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from . import Entry, Outcome, is_int, need, register, scalar
from .environment import PLATFORM_VARS, start_environ

_MAX_KEYS = 2048
# Grad mode is per thread: a capture off the main thread (the kernel's autosave) asks this for
# the mode the main thread last had (the kernel side records it after each cell); None: unknown.
main_grad_mode: Callable[[], bool | None] | None = None


def _settings(state: Any) -> dict[str, Any]:
    need(isinstance(state, dict) and len(state) <= _MAX_KEYS, "not a mapping")
    need(all(isinstance(k, str) and len(k) <= 200 for k in state), "a key is not text")
    return dict(state)


def _row(label: str, done: list[str], failed: list[str]) -> list[Outcome]:
    why = [f"set {', '.join(done[:8])}{' ...' if len(done) > 8 else ''}"] if done else []
    if failed:
        why.append(f"not set: {'; '.join(failed[:4])}")
    status = "failed" if failed and not done else "restored"
    return [(label, status, "; ".join(why) or None)]


def _apply(label: str, items: dict[str, Any], setter: Any) -> list[Outcome]:
    done, failed = [], []
    for k, v in items.items():
        try:
            setter(k, v)
            done.append(k)
        except Exception as e:  # noqa: BLE001 - one setting never stops the others
            failed.append(f"{k}: {str(e)[:100] or type(e).__name__}")
    return _row(label, done, failed)


# -- numpy ------------------------------------------------------------------------------------------

_NP_DEFAULTS = {"edgeitems": 3, "threshold": 1000, "floatmode": "maxprec", "precision": 8,
                "suppress": False, "linewidth": 75, "nanstr": "nan", "infstr": "inf", "sign": "-",
                "legacy": False}


def _np_capture() -> Any:
    np = sys.modules.get("numpy")
    if np is None:
        return None
    opts = np.get_printoptions()
    diff = {k: opts[k] for k, d in _NP_DEFAULTS.items() if k in opts and opts[k] != d}
    if opts.get("formatter") is not None:
        raise ValueError("a formatter of functions is not saved")
    return diff or None


def _np_restore(state: Any) -> list[Outcome]:
    opts = _settings(state)
    need(all(k in _NP_DEFAULTS and scalar(v) for k, v in opts.items()), "unknown option")
    import numpy as np

    return _apply("numpy print options", opts, lambda k, v: np.set_printoptions(**{k: v}))


# -- torch ------------------------------------------------------------------------------------------

_DTYPES = ("float32", "float64", "float16", "bfloat16")
_PRINT_DEFAULTS = {"precision": 4, "threshold": 1000, "edgeitems": 3, "linewidth": 80,
                   "sci_mode": None}
_CUDNN_DEFAULTS = {"benchmark": False, "deterministic": False, "enabled": True, "allow_tf32": True}


def default_threads() -> int:
    """What torch picks when nothing sets it: the platform's variable, else the physical cores
    (as torch's cpuinfo counts them), else the logical CPUs."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        v = start_environ().get(var, "")
        if v.isdigit() and int(v) > 0:
            return int(v)
    cores = set()
    try:
        with open("/proc/cpuinfo") as f:
            phys = core = None
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    phys = val.strip()
                elif key == "core id":
                    core = val.strip()
                    cores.add((phys, core))
    except OSError:
        pass
    return len(cores) or os.cpu_count() or 1


def _platform_threads() -> list[str]:
    env = start_environ()
    return [v for v in sorted(PLATFORM_VARS) if v.endswith("_THREADS") and env.get(v)]


def _torch_capture() -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_default_dtype"):
        return None
    out: dict[str, Any] = {}
    dt = str(torch.get_default_dtype()).removeprefix("torch.")
    if dt != "float32":
        out["default_dtype"] = dt
    po = torch._tensor_str.PRINT_OPTS
    printed = {k: getattr(po, k) for k, d in _PRINT_DEFAULTS.items() if getattr(po, k, d) != d}
    if printed:
        out["print"] = printed
    n = torch.get_num_threads()
    if n != default_threads() and not _platform_threads():
        out["num_threads"] = n
    if torch.are_deterministic_algorithms_enabled():
        out["deterministic"] = {"warn_only": torch.is_deterministic_algorithms_warn_only_enabled()}
    cudnn = {k: getattr(torch.backends.cudnn, k) for k, d in _CUDNN_DEFAULTS.items()
             if getattr(torch.backends.cudnn, k) != d}
    if cudnn:
        out["cudnn"] = cudnn
    if torch.backends.cuda.matmul.allow_tf32:
        out["cuda_matmul_allow_tf32"] = True
    prec = torch.get_float32_matmul_precision()
    if prec != "highest":
        out["float32_matmul_precision"] = prec
    if threading.current_thread() is threading.main_thread():
        grad = torch.is_grad_enabled()
    else:
        grad = main_grad_mode() if main_grad_mode is not None else None
    if grad is False:
        out["grad_enabled"] = False
    return out or None


def _torch_setters(torch: Any) -> dict[str, Any]:
    def dtype(v: Any) -> None:
        need(v in _DTYPES, f"unknown dtype {str(v)[:20]}")
        torch.set_default_dtype(getattr(torch, v))

    def printopts(v: Any) -> None:
        need(isinstance(v, dict) and all(k in _PRINT_DEFAULTS and scalar(x) for k, x in v.items()),
             "unknown print option")
        torch.set_printoptions(**v)

    def deterministic(v: Any) -> None:
        need(isinstance(v, dict) and isinstance(v.get("warn_only"), bool), "not a flag")
        torch.use_deterministic_algorithms(True, warn_only=v["warn_only"])

    def cudnn(v: Any) -> None:
        need(isinstance(v, dict) and all(k in _CUDNN_DEFAULTS and isinstance(x, bool)
                                         for k, x in v.items()), "unknown cudnn flag")
        for k, x in v.items():
            setattr(torch.backends.cudnn, k, x)

    def tf32(v: Any) -> None:
        need(isinstance(v, bool), "not a flag")
        torch.backends.cuda.matmul.allow_tf32 = v

    def precision(v: Any) -> None:
        need(v in ("highest", "high", "medium"), "unknown precision")
        torch.set_float32_matmul_precision(v)

    def grad(v: Any) -> None:
        need(isinstance(v, bool), "not a flag")
        torch.set_grad_enabled(v)

    return {"default_dtype": dtype, "print": printopts, "deterministic": deterministic,
            "cudnn": cudnn, "cuda_matmul_allow_tf32": tf32, "float32_matmul_precision": precision,
            "grad_enabled": grad}


def _torch_restore(state: Any) -> list[Outcome]:
    items = _settings(state)
    import torch

    setters = _torch_setters(torch)
    kept = []
    threads = items.pop("num_threads", None)
    if threads is not None:
        need(is_int(threads) and 0 < threads <= 4096, "num_threads out of range")
        platform = _platform_threads()
        if platform:
            if torch.get_num_threads() != threads:
                kept.append(f"{torch.get_num_threads()} threads ({', '.join(platform)})")
        else:
            setters["num_threads"] = torch.set_num_threads
            items["num_threads"] = threads
    unknown = [k for k in items if k not in setters]
    need(not unknown, f"unknown setting {str(unknown[:1])[:60]}")
    out = _apply("torch settings", items, lambda k, v: setters[k](v))
    if kept:
        label, status, reason = out[0]
        note = "differs from the new environment: kept " + "; ".join(kept)
        out = [(label, status if items else "skipped", f"{reason}; {note}" if reason else note)]
    return out


# -- pandas -----------------------------------------------------------------------------------------


def _pd_capture() -> Any:
    pd = sys.modules.get("pandas")
    config = sys.modules.get("pandas._config.config")
    if pd is None or config is None:
        return None
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated options warn when read
        for k, opt in sorted(getattr(config, "_registered_options", {}).items()):
            try:
                v = config.get_option(k)
            except Exception:  # noqa: BLE001, S112 - an option this pandas cannot read back
                continue
            if scalar(v) and v != opt.defval:
                out[k] = v
    return out or None


def _pd_restore(state: Any) -> list[Outcome]:
    opts = _settings(state)
    need(all(scalar(v) for v in opts.values()), "a value is not a scalar")
    import pandas as pd

    return _apply("pandas options", opts, pd.set_option)


# -- matplotlib -------------------------------------------------------------------------------------

_MPL_SKIP = ("backend", "backend_fallback", "interactive")  # the backend is IPython's entry


def _mpl_value(v: Any) -> Any:
    if scalar(v):
        return v
    if isinstance(v, (list, tuple)) and all(scalar(x) for x in v):
        return list(v)
    if type(v).__name__ == "Cycler":
        return {"cycler": repr(v)}  # the text rcParams' validator parses back
    raise TypeError(type(v).__name__)


def _mpl_capture() -> Any:
    mpl = sys.modules.get("matplotlib")
    if mpl is None or not hasattr(mpl, "rcParamsOrig"):
        return None
    out, lost = {}, []
    orig = mpl.rcParamsOrig
    for k in sorted(mpl.rcParams):
        if k in _MPL_SKIP or k not in orig:
            continue
        v = mpl.rcParams[k]
        try:
            if v == orig[k]:
                continue
            out[k] = _mpl_value(v)
        except (TypeError, ValueError):
            lost.append(k)
    if lost and not out:
        raise ValueError(f"values not saved: {', '.join(lost[:4])}")
    return out or None


def _mpl_restore(state: Any) -> list[Outcome]:
    items = _settings(state)
    for k, v in items.items():
        need(scalar(v) or (isinstance(v, list) and all(scalar(x) for x in v)) or (
            isinstance(v, dict) and isinstance(v.get("cycler"), str) and len(v) == 1),
            f"bad value of {k[:40]}")
    import matplotlib as mpl

    def put(k: str, v: Any) -> None:
        # matplotlib's stubs take only the literal rc keys; these are saved rcParams' keys
        mpl.rcParams[k] = v["cycler"] if isinstance(v, dict) else v  # type: ignore[index]

    return _apply("matplotlib rcParams", items, put)


register(Entry("settings.numpy", "numpy print options", _np_capture, _np_restore, order=30))
register(Entry("settings.torch", "torch settings", _torch_capture, _torch_restore, order=30))
register(Entry("settings.pandas", "pandas options", _pd_capture, _pd_restore, order=30))
register(Entry("settings.matplotlib", "matplotlib rcParams", _mpl_capture, _mpl_restore,
               order=30))
