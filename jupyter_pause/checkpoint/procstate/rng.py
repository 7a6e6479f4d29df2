"""Random generators: python's ``random``, numpy's global generator, torch's CPU generator and
each CUDA device's. A restore continues each stream exactly where the checkpoint left it.

CUDA: captured only when CUDA was initialized in the process (reading a generator would
initialize it: seconds and VRAM for a notebook that never used the GPU). A seed set with
``torch.manual_seed`` before CUDA's first use is queued by torch and not captured.
"""

from __future__ import annotations

import base64
import binascii
import struct
import sys
from typing import Any

from . import BadState, Entry, Outcome, need, register
from . import is_int as _int
from . import is_num as _num

_MT_WORDS = 624
_MAX_STATE = 1 << 16  # bytes: torch's CPU generator state is 5056, a CUDA one 16


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(s: Any, what: str) -> bytes:
    need(isinstance(s, str) and len(s) <= _MAX_STATE * 2, f"{what} is not a state")
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise BadState(f"{what} is not base64") from None


def _words(s: Any, n: int, what: str) -> tuple[int, ...]:
    raw = _unb64(s, what)
    need(len(raw) == 4 * n, f"{what} has {len(raw)} bytes, not {4 * n}")
    return struct.unpack(f"<{n}I", raw)


# -- python -----------------------------------------------------------------------------------------


def _py_capture() -> Any:
    mod = sys.modules.get("random")
    if mod is None:
        return None  # never imported: nothing drawn, nothing to continue
    version, internal, gauss = mod.getstate()
    return {"version": version, "mt": _b64(struct.pack(f"<{len(internal)}I", *internal)),
            "gauss": gauss}


def _py_restore(state: Any) -> None:
    need(isinstance(state, dict), "not a mapping")
    need(state.get("version") == 3, f"unknown version {state.get('version')!r}")
    internal = _words(state.get("mt"), _MT_WORDS + 1, "mt")
    need(internal[-1] <= _MT_WORDS, "position out of range")
    gauss = state.get("gauss")
    need(gauss is None or _num(gauss), "gauss is not a number")
    import random

    random.setstate((3, internal, gauss))


# -- numpy ------------------------------------------------------------------------------------------


def _np_capture() -> Any:
    np = sys.modules.get("numpy")
    if np is None or "numpy.random" not in sys.modules:
        return None
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    if name != "MT19937":
        raise ValueError(f"numpy's global generator is {name}, not MT19937")
    return {"bit_generator": name, "key": _b64(keys.astype("<u4").tobytes()), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}


def _np_restore(state: Any) -> None:
    need(isinstance(state, dict), "not a mapping")
    need(state.get("bit_generator") == "MT19937", "not an MT19937 state")
    keys = _words(state.get("key"), _MT_WORDS, "key")
    pos, has_gauss, gauss = state.get("pos"), state.get("has_gauss"), state.get("gauss")
    need(_int(pos) and 0 <= pos <= _MT_WORDS, "pos out of range")
    need(has_gauss in (0, 1) and _num(gauss), "gauss is not a number")
    import numpy as np

    np.random.set_state(("MT19937", np.array(keys, dtype=np.uint32), pos, has_gauss,
                         float(gauss)))


# -- torch ------------------------------------------------------------------------------------------


def _torch_capture() -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "random"):
        return None
    return {"state": _b64(torch.random.get_rng_state().numpy().tobytes())}


def _as_state(torch: Any, raw: bytes) -> Any:
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _torch_restore(state: Any) -> None:
    need(isinstance(state, dict), "not a mapping")
    raw = _unb64(state.get("state"), "state")
    import torch

    n = torch.random.get_rng_state().numel()
    need(len(raw) == n, f"state has {len(raw)} bytes, this torch's has {n}")
    torch.random.set_rng_state(_as_state(torch, raw))


def _cuda_capture() -> Any:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None or not cuda.is_available() or not cuda.is_initialized():
        return None
    devices = []
    for i in range(cuda.device_count()):
        devices.append({"index": i, "name": cuda.get_device_name(i),
                        "state": _b64(cuda.get_rng_state(i).numpy().tobytes())})
    return {"devices": devices}


def cuda_restore(state: Any) -> list[Outcome]:
    """One row per device captured; a device missing here is named, never mapped to another
    (its stream would then be a different device's)."""
    need(isinstance(state, dict) and isinstance(state.get("devices"), list), "not a device list")
    devices = state["devices"]
    need(len(devices) <= 1024, "too many devices")
    parsed = []
    for d in devices:
        need(isinstance(d, dict) and _int(d.get("index")) and 0 <= d["index"] < 1024,
             "a device without an index")
        parsed.append((d["index"], _unb64(d.get("state"), f"state of cuda:{d['index']}"),
                       d.get("name") if isinstance(d.get("name"), str) else None))
    import torch

    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out: list[Outcome] = []
    for index, raw, name in parsed:
        label = f"RNG: cuda:{index}"
        if index >= here:
            plural = "s" if here != 1 else ""
            why = f"CUDA RNG of cuda:{index}: no such device ({here} CUDA device{plural} here)"
            out.append((label, "skipped", why))
            continue
        n = torch.cuda.get_rng_state(index).numel()
        if len(raw) != n:
            out.append((label, "skipped",
                        f"CUDA RNG of cuda:{index}: state has {len(raw)} bytes, not {n}"))
            continue
        torch.cuda.set_rng_state(_as_state(torch, raw), index)
        now = torch.cuda.get_device_name(index)
        note = f"was {name[:60]}, now {now}" if name and name != now else None
        out.append((label, "restored", note))
    return out


register(Entry("rng.python", "RNG: random", _py_capture, _py_restore, order=20))
register(Entry("rng.numpy", "RNG: numpy", _np_capture, _np_restore, order=20))
register(Entry("rng.torch", "RNG: torch", _torch_capture, _torch_restore, order=20))
register(Entry("rng.cuda", "RNG: cuda", _cuda_capture, cuda_restore, order=21))
