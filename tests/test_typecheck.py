"""The package type-checks with mypy under pyproject's [tool.mypy] (strict for the checkpoint
library and the kernel side). One run over the whole package; its cache stays in .mypy_cache,
so a rerun only re-checks what changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(600)


def test_mypy_finds_no_errors():
    pytest.importorskip("mypy", reason="mypy is in the test extras")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(ROOT / ".mypy_cache"), "--no-error-summary", "--hide-error-context"],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "MYPY_FORCE_COLOR": "0"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-20000:]
