"""The linters pass: ruff over the Python code, prettier and eslint over the JupyterLab extension.

Run alone with ``pytest -m lint``. The output of a failing linter is the failure message, so
the fix is in the test report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lint, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
LABEXTENSION = ROOT / "labextension"


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=280,
                       check=False)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"


def test_ruff():
    ruff = Path(sys.executable).with_name("ruff")
    cmd = [str(ruff)] if ruff.exists() else [sys.executable, "-m", "ruff"]
    _run([*cmd, "check", "--no-cache", "."], ROOT)


def test_labextension_lint_check():
    # jlpm ships with jupyterlab, in the same environment as this interpreter
    bindir = os.path.dirname(sys.executable)
    jlpm = shutil.which("jlpm", path=os.pathsep.join([bindir, os.environ.get("PATH", "")]))
    if jlpm is None:
        pytest.skip("no jlpm (it comes with jupyterlab)")
    if not (LABEXTENSION / "node_modules" / ".bin" / "eslint").exists():
        pytest.skip("no labextension/node_modules with eslint: run `jlpm install` in labextension")
    env = dict(os.environ, PATH=os.pathsep.join([bindir, os.environ.get("PATH", "")]))
    _run([jlpm, "lint:check"], LABEXTENSION, env)
