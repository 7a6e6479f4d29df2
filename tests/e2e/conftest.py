"""Fixtures for the real-browser tests: a real `jupyter lab` subprocess and Debian's Chromium.

Python Playwright drives the system Chromium (never `playwright install`).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .labserver import CHROMIUM, CHROMIUM_ARGS, REPO, LabServer, shot, start_lab


@pytest.fixture
def lab_factory(tmp_path_factory, request) -> Iterator[Callable[..., LabServer]]:
    """Start `jupyter lab` servers (extra CLI args allowed); all are stopped at teardown."""
    started: list[LabServer] = []

    def start(*extra: str, settings: dict[str, dict] | None = None) -> LabServer:
        server = start_lab(tmp_path_factory.mktemp("lab"), list(extra), settings)
        started.append(server)
        # CI keeps only the test report: a failure shows what the server logged meanwhile.
        diagnostics(request.node).append((f"lab server {len(started) - 1}, its log's end",
                                          lambda: _tail(server.log_path, 80)))
        return server

    yield start
    rep = getattr(request.node, "rep_call", None)
    for i, server in enumerate(started):
        server.stop()
        if rep is not None and rep.failed:  # keep the server log next to the screenshots
            out = REPO / "test-output" / "e2e-logs"
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(server.log_path, out / f"{request.node.name}-{i}.log")


@pytest.fixture
def lab(lab_factory) -> LabServer:
    return lab_factory()


# Module scope, not session: Playwright's sync API runs an event loop in this thread for as long
# as it is open, which would break the asyncio fixtures of the test modules that run after.
@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, request):
    """A fresh page; JavaScript errors on the page fail the test (but IGNORED_PAGE_ERRORS)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    said: list[str] = []  # the page's own warnings and errors, printed when the test fails
    pg.on("console", lambda m: said.append(f"{m.type}: {m.text}")
          if m.type in ("warning", "error") else None)
    pg.on("requestfailed", lambda r: said.append(f"request failed: {r.method} {r.url} "
                                                 f"({r.failure})"))
    pg.on("response", lambda r: said.append(f"HTTP {r.status}: {r.request.method} {r.url}")
          if r.status >= 500 else None)
    diagnostics(request.node).append(("the page's warnings, errors and failed requests",
                                      lambda: "\n".join(said[-60:])))
    pg.set_default_timeout(30_000)
    yield pg
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        shot(pg, f"FAILED-{request.node.name}")
    context.close()
    # A test module may name an upstream error that every page load throws (IGNORED_PAGE_ERRORS).
    errors = [e for e in errors if e not in getattr(request.module, "IGNORED_PAGE_ERRORS", ())]
    assert not errors, f"JavaScript errors on the page: {errors}"


def diagnostics(node) -> list[tuple[str, Callable[[], str]]]:
    """What a failed test's report shows besides the assertion: (title, how to read it)."""
    if not hasattr(node, "jp_diagnostics"):
        node.jp_diagnostics = []
    return node.jp_diagnostics


def _tail(path: str | Path, lines: int) -> str:
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
    if rep.failed and not getattr(item, "jp_diagnosed", False):  # once, in any phase
        item.jp_diagnosed = True
        for title, read in getattr(item, "jp_diagnostics", ()):
            try:
                text = read() or "(nothing)"
            except Exception as e:  # noqa: BLE001 - never hide the failure being reported
                text = f"(could not be read: {e!r})"
            rep.sections.append((title, text))


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "e2e: real-browser test (Chromium + jupyter lab)")


# pytest-jupyter's autouse loop fixtures would close the event loop that Playwright's sync API
# runs in this thread. The browser tests run their server in a subprocess and need neither.
@pytest.fixture
def jp_asyncio_loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def jp_server_cleanup():
    return
