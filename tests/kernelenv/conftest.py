"""Session fixtures: the kernel-side wheel built from this tree, and the kernel virtualenvs of
:mod:`tests.kernelenv.envs` (cached between runs, see there)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.kernelenv.envs import (
    IPYKERNEL,
    REPO,
    KernelEnv,
    cached_env,
    other_python,
    with_kernel_side,
)


@pytest.fixture(scope="session")
def kernel_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """jupyter-pause-kernel's wheel, built from this tree as a release would build it."""
    pytest.importorskip("hatchling")
    pytest.importorskip("hatch_nodejs_version")
    out = tmp_path_factory.mktemp("wheels")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(REPO / "kernel-package")],
                       timeout=300, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    [wheel] = out.glob("jupyter_pause_kernel-*.whl")
    return wheel


@pytest.fixture(scope="session")
def server_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server distribution's wheel (jupyter_pause), built from this tree; the frontend
    is the one ``pip install -e .`` built (the build hook skips an existing one)."""
    pytest.importorskip("hatchling")
    pytest.importorskip("hatch_nodejs_version")
    pytest.importorskip("hatch_jupyter_builder")
    out = tmp_path_factory.mktemp("wheels")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(REPO)],
                       timeout=900, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    [wheel] = out.glob("jupyter_pause-*.whl")
    return wheel


@pytest.fixture(scope="session")
def kernel_side_env(kernel_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> KernelEnv:
    """(a) ipykernel and jupyter-pause-kernel on this machine's Python."""
    base = getattr(sys, "_base_executable", sys.executable)
    return with_kernel_side(base, "other-env", kernel_wheel, tmp_path_factory.mktemp("envs"))


@pytest.fixture(scope="session")
def bare_env() -> KernelEnv:
    """(b) ipykernel alone: no jupyter-pause at all."""
    base = getattr(sys, "_base_executable", sys.executable)
    return KernelEnv("bare-env", cached_env(base, "bare-env", [IPYKERNEL]))


@pytest.fixture(scope="session")
def other_version_env(kernel_wheel: Path,
                      tmp_path_factory: pytest.TempPathFactory) -> KernelEnv:
    """(c) ipykernel and jupyter-pause-kernel on another Python version of this machine."""
    exe = other_python()
    if exe is None:
        pytest.skip(f"no Python 3.10+ other than {sysconfig.get_python_version()} on PATH or "
                    "under pyenv's versions: the kernel side is tested on this version only")
    return with_kernel_side(exe, "other-version", kernel_wheel, tmp_path_factory.mktemp("envs"))
