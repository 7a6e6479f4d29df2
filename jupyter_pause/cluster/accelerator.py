"""Which accelerator this process and its kernels hold, found without importing torch.

The one GPU detection of the package: the server's accelerator type and count (accelerator-
seconds) and the GKE backend's GPU model (does a pod snapshot fit this pod?) both come from here.
The server process must stay light (no CUDA context, no torch import), so it asks the driver:
``nvidia-smi``, else ``/proc/driver/nvidia/gpus``, else ``NVIDIA_VISIBLE_DEVICES``. Kernels
inherit ``CUDA_VISIBLE_DEVICES`` from the server, so a list there narrows the count. The answers
are cached: the GPUs of a process do not change while it runs.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

NONE: dict[str, object] = {"type": "none", "count": 0}
_PROC_GPUS = "/proc/driver/nvidia/gpus"


def gpu_type(name: str) -> str:
    """A GPU's marketing name as a GKE-style accelerator type ("Tesla T4" -> nvidia-tesla-t4)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")
    return slug if slug.startswith("nvidia") else f"nvidia-{slug}"


def gpu_model_key(models: str) -> str:
    """Comparable form of a GPU model string ("NVIDIA L4" and "nvidia-l4" are the same model;
    several models are joined by ",")."""
    return ",".join(sorted({gpu_type(m) for m in models.split(",") if m.strip()}))


def parse_gpu_names(names: list[str]) -> dict[str, object]:
    """{"type", "count"} of GPU names (one per GPU); the most common model names the type."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        return dict(NONE)
    (top, _), = Counter(names).most_common(1)
    return {"type": gpu_type(top), "count": len(names)}


def _nvidia_smi() -> list[str] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()


def _proc_gpus(root: str | None = None) -> list[str] | None:
    try:
        infos = sorted(Path(root or _PROC_GPUS).glob("*/information"))
    except OSError:
        return None
    names = []
    for info in infos:
        try:
            text = info.read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"^Model:\s*(.+)$", text, re.MULTILINE)
        names.append(m.group(1) if m else "nvidia-gpu")
    return names or None


def gpu_names() -> list[str]:
    """The driver's name of each GPU this process sees (nvidia-smi, else /proc); [] if none."""
    return [n.strip() for n in (_nvidia_smi() or _proc_gpus() or []) if n.strip()]


def _visible_list(value: str | None) -> list[str] | None:
    """The devices a *_VISIBLE_DEVICES value lets through; None when it does not restrict."""
    if value is None or value.strip().lower() == "all":
        return None
    if value.strip().lower() in ("", "none", "void", "-1"):
        return []
    return [d for d in value.split(",") if d.strip()]


def detect_accelerator(env: dict[str, str] | None = None) -> dict[str, object]:
    """{"type": "nvidia-l4", "count": 1} for what this process can see; NONE when nothing."""
    env = dict(os.environ) if env is None else env
    nvidia_visible = _visible_list(env.get("NVIDIA_VISIBLE_DEVICES"))
    names = gpu_names()
    found: dict[str, object]
    if names:
        found = parse_gpu_names(names)
    elif nvidia_visible:  # a container runtime said so, but nothing more is known
        found = {"type": "nvidia", "count": len(nvidia_visible)}
    else:
        return dict(NONE)
    cuda_visible = _visible_list(env.get("CUDA_VISIBLE_DEVICES"))
    if cuda_visible is not None:
        count = found["count"]
        found["count"] = min(count if isinstance(count, int) else 0, len(cuda_visible))
    return found if found["count"] else dict(NONE)


@functools.lru_cache(maxsize=1)
def detected_accelerator() -> dict[str, object]:
    """:func:`detect_accelerator` once per process (it may run nvidia-smi)."""
    return detect_accelerator()


def detect_gpu_model() -> str | None:
    """The GPU model(s) this process sees as accelerator types ("nvidia-l4"; several joined by
    ","), None when the driver names none."""
    return gpu_model_key(",".join(gpu_names())) or None


@functools.lru_cache(maxsize=1)
def detected_gpu_model() -> str | None:
    """:func:`detect_gpu_model` once per process (it may run nvidia-smi)."""
    return detect_gpu_model()
