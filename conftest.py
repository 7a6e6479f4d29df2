"""Shared pytest configuration: a real Jupyter server per test through pytest-jupyter.

Some tests need what only a prepared machine has: Chromium, etcd, a kube-apiserver binary, root
(to mount a tmpfs), torch and the test extras. On a developer machine such a test is skipped and
listed at the end; under CI (``CI=true``) the same skip is a failure, because there the install
(``tests/run.sh``) is supposed to have provided everything, and a silent skip would hide that it
did not. The skip sites keep their plain ``pytest.skip``/``skipif``/``importorskip``; the reasons
they give are classified once, here (:data:`PREREQUISITES`).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ("pytest_jupyter.jupyter_server", "pytester")

# A skip reason matching one of these means "this machine lacks a prerequisite". Anything else
# (no CUDA to forge, /var/tmp being a tmpfs, another OS) is a property of the machine that CI
# may legitimately have, and stays a skip everywhere.
PREREQUISITES: dict[str, re.Pattern[str]] = {
    "chromium": re.compile(r"no Chromium at"),
    "etcd": re.compile(r"etcd not on PATH"),
    "kube-apiserver": re.compile(r"no kube-apiserver binary at"),
    "root": re.compile(r"cannot mount a tmpfs here"),
    "torch": re.compile(r"could not import 'torch'"),
    "configurable-http-proxy": re.compile(r"no configurable-http-proxy"),
    "labextension node_modules": re.compile(r"no labextension/node_modules"),
    # pip installing a kernel's own virtualenv (tests/kernelenv) needs the package index
    "network": re.compile(r"could not pip install .* \(no network to the package index\?\)"),
    "test extras": re.compile(
        r"could not import '(transformers|tokenizers|jupyterhub|jupyterhub_idle_culler|"
        r"kubespawner|hatchling|hatch_nodejs_version|hatch_jupyter_builder)'|"
        r"real-model test needs"),
}


def ci_strict() -> bool:
    """True under CI: a missing prerequisite fails the test instead of skipping it."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _allowed() -> set[str]:
    # An escape hatch for a CI job that knowingly runs without something (names as above).
    raw = os.environ.get("JUPYTER_PAUSE_ALLOW_MISSING", "")
    return {p.strip() for p in raw.split(",") if p.strip()}


def _prerequisite(reason: str) -> str | None:
    return next((name for name, pat in PREREQUISITES.items() if pat.search(reason)), None)


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


_missing: Counter[str] = Counter()


def _judge(report: Any) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    name = _prerequisite(_skip_reason(report))
    if name is None:
        return
    _missing[name] += 1
    if ci_strict() and name not in _allowed():
        report.outcome = "failed"
        report.longrepr = (f"CI=true: missing prerequisite {name!r} ({_skip_reason(report)}); "
                           "tests/run.sh installs it, and under CI a test never skips for it")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _judge(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield  # a module-level pytest.skip(allow_module_level=True) lands here
    _judge(outcome.get_result())


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _missing:
        return
    what = ", ".join(f"{n} ({c} test{'s' * (c != 1)})" for n, c in sorted(_missing.items()))
    if ci_strict():
        terminalreporter.write_line(f"CI=true: tests failed for missing prerequisites: {what}",
                                    red=True)
    else:
        terminalreporter.write_line(
            f"skipped for missing prerequisites: {what}; `bash tests/run.sh` installs them "
            "(under CI=true these skips are failures)", yellow=True)




@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``mount_tmpfs("2m")`` mounts a tmpfs of that size (a disk that fills up on demand) and
    skips the test where mounting is not allowed (it needs root)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                           capture_output=True, check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
