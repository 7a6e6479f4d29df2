"""Real IPython kernels (jupyter_client) that import jupyter_pause from this checkout."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

from tests.kerneldriver import KernelDriver

REPO = Path(__file__).resolve().parents[2]


class Kernel(KernelDriver):
    """A kernel of its own (KernelManager) driven by :class:`KernelDriver`."""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.env = env
        self.cwd = cwd
        self.km.start_kernel(env=env, cwd=cwd)
        self.kc = self._client()

    def _client(self) -> Any:
        kc = self.km.client()
        kc.start_channels(hb=False)
        kc.wait_for_ready(timeout=60)
        return kc

    def restart(self) -> None:
        self.kc.stop_channels()
        self.km.restart_kernel(now=True)
        self.kc = self._client()

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def kernel_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    # Checkpoints, key and runtime files of this test only.
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "data")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env["JPY_SESSION_NAME"] = "analysis.ipynb"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    # Autosave off unless a test asks for it: the other tests count the store's checkpoints.
    env["JUPYTER_PAUSE_AUTOSAVE"] = '{"enabled": false}'
    for var in (
        "JUPYTER_PAUSE_STORE_URL",
        "JUPYTER_PAUSE_KEY_PATH",
        "JUPYTER_PAUSE_SERVER_URL",
        "JUPYTER_PAUSE_SERVER_TOKEN",
    ):
        env.pop(var, None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


@pytest.fixture
def kernel_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[Kernel] = []

    def make(**extra_env: str) -> Kernel:
        env = kernel_env(tmp_path)
        env.update(extra_env)
        work = tmp_path / "work"
        work.mkdir(exist_ok=True)
        k = Kernel(env, str(work))
        started.append(k)
        return k

    yield make
    for k in started:
        k.stop()


@pytest.fixture(scope="module")
def shared_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """One kernel for a module's tests that only read or fail (bad flags)."""
    tmp = tmp_path_factory.mktemp("shared")
    (tmp / "work").mkdir()
    k = Kernel(kernel_env(tmp), str(tmp / "work"))
    k.ok("%load_ext jupyter_pause")
    yield k
    k.stop()


@pytest.fixture
def kernel(kernel_factory: Any) -> Kernel:
    k = kernel_factory()
    k.ok("%load_ext jupyter_pause")
    return k
