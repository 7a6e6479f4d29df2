"""Under CI a test that lacks a prerequisite fails; on a developer machine it is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TESTS = '''
import pytest

@pytest.fixture
def tmpfs():
    pytest.skip("cannot mount a tmpfs here: mount: permission denied")

def test_chromium():
    pytest.skip("no Chromium at /nowhere/chromium")

def test_torch():
    pytest.skip("could not import 'torch': No module named 'torch'")

@pytest.mark.skipif(True, reason="etcd not on PATH (apt-get install etcd-server)")
def test_etcd():
    pass

def test_root(tmpfs):
    pass

def test_no_cuda_is_a_plain_skip():
    pytest.skip("this test forges cuda:0 on a machine without CUDA")

@pytest.mark.xfail(reason="no Chromium at /x", run=False)
def test_xfail_untouched():
    pass

def test_ok():
    pass
'''


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile(test_prereq=TESTS)
    for var in ("CI", "JUPYTER_PAUSE_ALLOW_MISSING"):
        monkeypatch.delenv(var, raising=False)
    return pytester


def test_developer_machine_skips_and_lists_them(project):
    r = project.runpytest_subprocess("-ra")
    r.assert_outcomes(passed=1, skipped=5, xfailed=1)
    line = ("*skipped for missing prerequisites: chromium (1 test), etcd (1 test), "
            "root (1 test), torch (1 test)*")
    r.stdout.fnmatch_lines([line])


def test_ci_turns_missing_prerequisites_into_failures(project, monkeypatch):
    monkeypatch.setenv("CI", "true")
    r = project.runpytest_subprocess("-ra")
    # The fixture's and the skipif's skips happen in setup: they count as errors.
    r.assert_outcomes(passed=1, skipped=1, failed=2, errors=2, xfailed=1)
    r.stdout.fnmatch_lines(["*CI=true: missing prerequisite 'chromium'*",
                            "*CI=true: tests failed for missing prerequisites:*"])
    assert r.ret != 0


def test_ci_can_allow_a_named_prerequisite(project, monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("JUPYTER_PAUSE_ALLOW_MISSING", "chromium, root")
    r = project.runpytest_subprocess("-ra")
    r.assert_outcomes(passed=1, skipped=3, failed=1, errors=1, xfailed=1)
