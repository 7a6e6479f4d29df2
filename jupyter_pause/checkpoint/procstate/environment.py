"""The working directory, and the user's own changes to ``os.environ`` and ``sys.path``.

Environment variables and path entries are kept as a diff against the process's start, so that
what a new process (a new pod) sets for itself wins: a variable is changed back only where the
new process started with the value the checkpointed one started with; elsewhere this
environment's value is kept and the report says so. Device selection and thread counts are
always the new machine's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from typing import Any

from ... import startenv
from . import Entry, Outcome, need, register

_MAX_ITEMS = 4096
_MAX_TEXT = 1 << 16
# The platform's, whatever the notebook did: restoring them would make the process lie about
# its devices or its share of the CPU.
PLATFORM_VARS = frozenset({
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "TPU_VISIBLE_CHIPS", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
})
# Directories the process started in (the kernel side adds IPython's starting_dir): the entry
# Python puts first in sys.path for ``python -m`` is one of them, not a user's addition.
START_DIRS: list[str] = []
# Variables the runtime sets for itself after the start (the kernel side adds ipykernel's), with
# the value it sets: not the user's change while they still hold that value.
RUNTIME_SET: dict[str, str] = {}


@lru_cache(maxsize=1)
def start_environ() -> dict[str, str]:
    """The environment this process was exec'd with: /proc/self/environ on Linux, whenever this
    is called; elsewhere os.environ as it was when first asked. A kernel forked after its
    exec (the launch package's zygote) started with what the fork recorded (``startenv``)."""
    given = startenv.given()
    if given is not None:
        return given
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return dict(os.environ)
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k:
            out[os.fsdecode(k)] = os.fsdecode(v)
    return out


def _python_flags() -> list[str]:
    f = sys.flags
    if f.isolated:
        return ["-I"]
    out = ["-E"] if f.ignore_environment else []
    out += ["-s"] if f.no_user_site else []
    out += ["-S"] if f.no_site else []
    out += ["-P"] if getattr(f, "safe_path", False) else []
    return out


@lru_cache(maxsize=1)
def start_path() -> frozenset[str]:
    """The sys.path this process started with: what the same interpreter, flags and start
    environment give a fresh process (site-packages, .pth files, PYTHONPATH), plus ``''``
    (IPython's) and the start directories. Asked once per process (one short subprocess)."""
    code = "import sys, json; print(json.dumps(sys.path[1:]))"
    cwd = START_DIRS[0] if START_DIRS and os.path.isdir(START_DIRS[0]) else None
    try:
        done = subprocess.run([sys.executable, *_python_flags(), "-c", code],
                              env=start_environ(), cwd=cwd, capture_output=True, timeout=30,
                              check=True)
        paths = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise RuntimeError(f"cannot tell sys.path at start ({type(e).__name__})") from None
    return frozenset([*paths, "", *START_DIRS, *(os.path.abspath(d) for d in START_DIRS)])


def _texts(v: Any, what: str) -> list[str]:
    need(isinstance(v, list) and len(v) <= _MAX_ITEMS, f"{what} is not a list")
    need(all(isinstance(s, str) and len(s) <= _MAX_TEXT and "\0" not in s for s in v),
         f"{what} holds a non-text entry")
    return list(v)


# -- sys.path ---------------------------------------------------------------------------------------


def _path_capture() -> Any:
    start = start_path()
    front: list[str] = []
    end: list[str] = []
    seen_start = False
    for p in sys.path:
        if not isinstance(p, str):
            continue
        if p in start:
            seen_start = True
        elif p not in front and p not in end:
            (end if seen_start else front).append(p)
    return {"front": front, "end": end} if front or end else None


def _path_restore(state: Any) -> list[Outcome]:
    need(isinstance(state, dict), "not a mapping")
    front, end = _texts(state.get("front"), "front"), _texts(state.get("end"), "end")
    added = []
    for p in reversed(front):
        if p not in sys.path:
            sys.path.insert(0, p)
            added.append(p)
    for p in end:
        if p not in sys.path:
            sys.path.append(p)
            added.append(p)
    return [("sys.path", "restored", f"added {_names(sorted(added, key=(front + end).index))}"
             if added else None)]


def _names(items: list[str], n: int = 6) -> str:
    shown = ", ".join(repr(s)[:80] if s == "" else s[:80] for s in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


# -- cwd --------------------------------------------------------------------------------------------


def _cwd_capture() -> Any:
    try:
        return {"cwd": os.getcwd()}
    except FileNotFoundError:
        raise RuntimeError("the working directory was removed") from None


def _cwd_restore(state: Any) -> list[Outcome]:
    need(isinstance(state, dict) and isinstance(state.get("cwd"), str)
         and 0 < len(state["cwd"]) <= _MAX_TEXT and "\0" not in state["cwd"], "not a directory")
    path = state["cwd"]
    if not os.path.isdir(path):
        return [("working directory", "skipped", f"no directory {path} here")]
    os.chdir(path)
    return [("working directory", "restored", path)]


# -- os.environ -------------------------------------------------------------------------------------


def _env_capture() -> Any:
    start = start_environ()
    changed = {k: v for k, v in os.environ.items()
               if start.get(k) != v and RUNTIME_SET.get(k) != v}
    removed = sorted(k for k in start if k not in os.environ)
    if not changed and not removed:
        return None
    return {"set": changed, "unset": removed,
            "start": {k: start.get(k) for k in [*changed, *removed]}}


def _valid_key(k: Any) -> bool:
    return isinstance(k, str) and 0 < len(k) <= 1024 and "=" not in k and "\0" not in k


def _env_restore(state: Any) -> list[Outcome]:
    need(isinstance(state, dict), "not a mapping")
    to_set, unset, old_start = state.get("set"), state.get("unset"), state.get("start")
    need(isinstance(to_set, dict) and len(to_set) <= _MAX_ITEMS, "set is not a mapping")
    need(all(_valid_key(k) and isinstance(v, str) and len(v) <= _MAX_TEXT and "\0" not in v
             for k, v in to_set.items()), "set holds a bad variable")
    unset = _texts(unset, "unset")
    need(all(_valid_key(k) for k in unset), "unset holds a bad name")
    need(isinstance(old_start, dict), "start is not a mapping")
    here = start_environ()
    done, kept = [], []
    for k, want in [*to_set.items(), *((k, None) for k in unset)]:
        if os.environ.get(k) == want:
            continue
        started = old_start.get(k)
        if k in PLATFORM_VARS or here.get(k) != (started if isinstance(started, str) else None):
            kept.append(k)  # this process started with its own value: the new environment's
            continue
        if want is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = want
        done.append(k)
    # names only: values may be credentials
    why = [f"changed {_names(done)}"] if done else []
    if kept:
        why.append(f"differs from the new environment: kept this environment's {_names(kept)}")
    status = "skipped" if kept and not done else "restored"
    return [("os.environ", status, "; ".join(why) or None)]


register(Entry("env.cwd", "working directory", _cwd_capture, _cwd_restore, order=10))
register(Entry("env.path", "sys.path", _path_capture, _path_restore, order=11,
               warm=start_path))
register(Entry("env.environ", "os.environ", _env_capture, _env_restore, order=12))
