"""Real IPython kernels (jupyter_client) that import jupyter_pause from this checkout."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Outputs:
    status: str = ""
    reply: dict = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""
    displays: list[dict] = field(default_factory=list)  # display_data + update_display_data
    results: list[dict] = field(default_factory=list)  # execute_result data
    errors: list[dict] = field(default_factory=list)  # iopub "error" messages

    @property
    def text(self) -> str:
        """Everything a person could see, as text."""
        parts = [self.stdout, self.stderr]
        for d in self.displays + self.results:
            parts.append(d.get("text/plain", ""))
            parts.append(d.get("text/html", ""))
        for e in self.errors:
            parts.extend(e.get("traceback", []))
        return "\n".join(parts)

    def expr(self, name: str) -> Any:
        import ast

        e = self.reply["content"]["user_expressions"][name]
        assert e["status"] == "ok", e
        return ast.literal_eval(e["data"]["text/plain"])


class Kernel:
    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.env = env
        self.cwd = cwd
        self.km.start_kernel(env=env, cwd=cwd)
        self.kc = self._client()

    def _client(self) -> Any:
        kc = self.km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        return kc

    def run(
        self, code: str, timeout: float = 30, user_expressions: dict | None = None, **kw: Any
    ) -> Outputs:
        out = Outputs()

        def hook(msg: dict) -> None:
            t, c = msg["header"]["msg_type"], msg["content"]
            if t == "stream":
                if c["name"] == "stdout":
                    out.stdout += c["text"]
                else:
                    out.stderr += c["text"]
            elif t in ("display_data", "update_display_data"):
                out.displays.append(c["data"])
            elif t == "execute_result":
                out.results.append(c["data"])
            elif t == "error":
                out.errors.append(c)

        reply = self.kc.execute_interactive(
            code,
            timeout=timeout,
            output_hook=hook,
            user_expressions=user_expressions or {},
            allow_stdin=False,
            **kw,
        )
        out.reply = reply
        out.status = reply["content"]["status"]
        return out

    def ok(self, code: str, **kw: Any) -> Outputs:
        out = self.run(code, **kw)
        assert out.status == "ok", (code, out.text)
        assert "Traceback" not in out.text, out.text
        return out

    def eval(self, expr: str) -> Any:
        return self.run("", user_expressions={"v": expr}).expr("v")

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
