"""The environment recorded in a manifest, and the mismatches worth telling a person about."""

from __future__ import annotations

import os
import platform
import socket
import sys
from functools import lru_cache
from typing import Any

_PACKAGES = (
    "numpy",
    "pandas",
    "torch",
    "dill",
    "safetensors",
    "scikit-learn",
    "scipy",
    "pyarrow",
    "jupyter-pause",
)


@lru_cache(maxsize=1)
def _package_versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as f:
            line = f.readline()
    except OSError:
        return None
    parts = line.split()
    for i, p in enumerate(parts):
        if p == "Module" and i + 1 < len(parts):
            return parts[i + 1]
    return line.strip() or None


def capture() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": f"{platform.system()}-{platform.machine()}",
        "packages": dict(_package_versions()),
        "torch": None,
        "cuda": None,
        "gpus": [],
        "driver": None,
        "host": socket.gethostname(),
        "pod": os.environ.get("POD_NAME") or os.environ.get("HOSTNAME"),
    }
    torch = sys.modules.get("torch")  # never import torch just to describe it
    if torch is not None:
        env["torch"] = torch.__version__
        env["cuda"] = getattr(torch.version, "cuda", None)
        try:
            if torch.cuda.is_available():
                env["gpus"] = [
                    torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
                ]
                env["driver"] = _driver_version()
        except Exception as e:  # noqa: BLE001 - a broken CUDA install must not fail a checkpoint
            env["cuda_error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    return env


def _minor(v: str | None) -> tuple[str, ...] | None:
    if not v:
        return None
    return tuple(v.split("+")[0].split(".")[:2])


def mismatches(recorded: dict[str, Any], needs_torch: bool) -> list[str]:
    """One-line warnings for differences that can change what a restore means."""
    here = capture()
    if needs_torch and here["torch"] is None:
        try:
            import torch  # noqa: F401

            here = capture()
        except ImportError:
            pass
    out = []
    if _minor(recorded.get("python")) != _minor(here["python"]):
        out.append(f"written with Python {recorded.get('python')}, restoring on {here['python']}")
    if needs_torch and recorded.get("torch") and _minor(recorded["torch"]) != _minor(here["torch"]):
        out.append(f"written with torch {recorded['torch']}, restoring on {here['torch']}")
    if recorded.get("gpus") and not here["gpus"]:
        out.append(f"written on {', '.join(recorded['gpus'])}; no CUDA device here")
    elif recorded.get("gpus") and here["gpus"] and recorded["gpus"][0] != here["gpus"][0]:
        out.append(f"written on {recorded['gpus'][0]}, restoring on {here['gpus'][0]}")
    for pkg in ("numpy", "pandas", "scikit-learn"):
        a = (recorded.get("packages") or {}).get(pkg)
        b = here["packages"].get(pkg)
        ma, mb = _minor(a), _minor(b)
        if ma and mb and ma[0] != mb[0]:
            out.append(f"written with {pkg} {a}, restoring on {b}")
    return out
