"""Virtualenvs for kernels of their own, as a person registers one with ``python -m ipykernel
install --name other-env``: the kernel-side wheel built from this tree (``kernel-package/``),
installed with ipykernel only, on this Python and on another version; and one with ipykernel
alone.

Building a virtualenv with pip is the slow part (numpy, safetensors, blake3, ... from PyPI), so
the environments with the dependencies are cached in ``~/.cache/jupyter-pause/kernelenv``, each
keyed by the Python version and the requirements (the wheel's own ``Requires-Dist`` included);
the wheel itself, which changes with every edit, is installed per test session into a small
virtualenv of its own whose ``.pth`` adds the cached dependencies. A machine without a network
skips these tests (a missing prerequisite: under ``CI=true`` they fail, see conftest.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jupyter-pause" / \
    "kernelenv"
# ipykernel's first release with what the kernel side needs (as the server distribution pins it).
IPYKERNEL = "ipykernel>=6.29"
# pip's words when it could not reach the index at all (a real resolution error fails the test).
_OFFLINE = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure "
                      r"in name resolution|Network is unreachable|No route to host|ProxyError|"
                      r"Read timed out|ConnectTimeoutError")


@dataclass(frozen=True)
class KernelEnv:
    """A virtualenv a kernel runs in: its interpreter, and the kernelspec that starts it."""

    name: str
    python: Path

    def install_kernelspec(self, data_dir: Path) -> str:
        """Write the kernelspec as ``python -m ipykernel install --name NAME`` would, under a
        Jupyter data directory; its name."""
        spec = data_dir / "kernels" / self.name
        spec.mkdir(parents=True, exist_ok=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [str(self.python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": self.name, "language": "python",
            "metadata": {"debugger": False}}))
        return self.name

    def run(self, code: str) -> subprocess.CompletedProcess[str]:
        # not from this checkout's directory, whose jupyter_pause `-c` would find
        return subprocess.run([str(self.python), "-c", code], capture_output=True, text=True,
                              timeout=120, check=False, env=clean_env(),
                              cwd=self.python.parent)


def clean_env() -> dict[str, str]:
    """This process's environment without what would let another interpreter import this tree
    or this virtualenv's packages."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _pip(python: Path, *args: str, timeout: float = 900) -> None:
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *args], capture_output=True, text=True, timeout=timeout, check=False,
                       env=clean_env())
    if r.returncode == 0:
        return
    out = (r.stdout + r.stderr)[-3000:]
    if _OFFLINE.search(out):
        pytest.skip(f"could not pip install {' '.join(args)} (no network to the package index?):"
                    f" {out.strip().splitlines()[-1]}")
    raise AssertionError(f"pip install {' '.join(args)} failed:\n{out}")


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True, env=clean_env())
    return Path(out.stdout.strip())


def _version(python: str | Path) -> tuple[int, int] | None:
    try:
        code = "import sys, venv, ensurepip; print(*sys.version_info[:2])"
        r = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                           timeout=30, check=False, env=clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = r.stdout.split()
    return (int(parts[0]), int(parts[1])) if r.returncode == 0 and len(parts) == 2 else None


def other_python() -> str | None:
    """A Python 3.10+ of another minor version than this one, with venv and ensurepip: on PATH
    first, then pyenv's versions; None where the machine has none."""
    here = sys.version_info[:2]
    found: list[str] = []
    for minor in (12, 13, 10, 14):
        exe = shutil.which(f"python3.{minor}")
        if exe:
            found.append(exe)
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=10,
                           check=False)
        if r.returncode == 0 and r.stdout.strip():
            pyenv_root = r.stdout.strip()
    found += sorted(str(p) for p in Path(pyenv_root).glob("versions/*/bin/python3.*")
                    if re.fullmatch(r"python3\.\d+", p.name))
    for exe in found:
        v = _version(exe)
        if v is not None and v != here and v >= (3, 10):
            return exe
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # another test run building the same environment
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_env(base_python: str, name: str, requirements: list[str]) -> Path:
    """The interpreter of a cached virtualenv of ``base_python`` with ``requirements``
    (binary wheels only), built once per Python version and requirement list."""
    version = _version(base_python)
    assert version is not None, f"{base_python} cannot create a virtualenv"
    key = hashlib.sha256(json.dumps([version, sorted(requirements)]).encode()).hexdigest()[:16]
    where = CACHE / f"{name}-py{version[0]}.{version[1]}-{key}"
    python = where / "bin" / "python"
    done = where / "complete"
    with _locked(CACHE / f"{where.name}.lock"):
        if not done.exists():
            shutil.rmtree(where, ignore_errors=True)  # a build that was interrupted
            subprocess.run([base_python, "-m", "venv", str(where)], check=True, timeout=300,
                           env=clean_env(), capture_output=True)
            _pip(python, "--only-binary=:all:", *requirements)
            done.write_text(json.dumps(requirements))
    return python


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return sorted(line.split(":", 1)[1].strip() for line in lines
                  if line.startswith("Requires-Dist:") and "extra ==" not in line)


def with_kernel_side(base_python: str, name: str, wheel: Path, tmp: Path) -> KernelEnv:
    """A virtualenv with ipykernel and the kernel-side wheel (and what it requires), nothing
    else: its dependencies from the cache, the wheel installed into it now."""
    deps = cached_env(base_python, f"{name}-deps", sorted({IPYKERNEL, *_requires(wheel)}))
    where = tmp / name
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(where)], check=True,
                   timeout=120, env=clean_env(), capture_output=True)
    python = where / "bin" / "python"
    site = _site_packages(python)
    # The cached environment's packages come after this one's (site.addpackage order).
    (site / "_kernelenv_deps.pth").write_text(f"{_site_packages(deps)}\n")
    _pip(deps, "--no-deps", "--no-index", "--target", str(site), str(wheel), timeout=300)
    return KernelEnv(name, python)
