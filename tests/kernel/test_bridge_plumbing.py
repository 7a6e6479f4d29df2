"""The bridge protocol itself: silent, no names left behind, no history, liveness."""

from __future__ import annotations

from pathlib import Path

import pytest

import jupyter_pause
from jupyter_pause.server.protocol import (
    PROBE,
    PROTOCOL,
    LineSplitter,
    bridge_code,
    install_command,
    parse_reply,
)

from .bridge_util import bridge

pytestmark = pytest.mark.timeout(60)

STATE = (
    "(sorted(get_ipython().user_ns), get_ipython().execution_count, "
    "len(get_ipython().history_manager.input_hist_raw))"
)


def test_liveness_fresh_kernel_no_trace(kernel_factory):
    k = kernel_factory()  # no %load_ext: the server calls any kernel
    k.ok("a = 1")
    before = k.eval(STATE)
    res = bridge(k, "liveness")
    assert res["ok"] is True
    assert res["token"] is None and res["never_pause"] is False and res["restored"] is None
    assert res["pid"] == k.eval("__import__('os').getpid()")
    assert res["cells_run"] == k.eval("get_ipython().execution_count") - 1 >= 1
    bad = bridge(k, "no_such_function")
    assert bad == {"ok": False, "error": "unknown bridge function 'no_such_function'",
                   "error_kind": None, "error_type": "OpError"}
    assert k.eval(STATE) == before


def test_liveness_reports_never_pause(kernel):
    kernel.ok("%pause --never")
    assert bridge(kernel, "liveness")["never_pause"] is True


def test_kernel_without_jupyter_pause(kernel_factory):
    k = kernel_factory()
    # As if jupyter_pause were not installed in the kernel's environment (a real one without
    # it: tests/kernelenv).
    k.ok("import sys; sys.modules['jupyter_pause'] = None")
    python = k.eval("__import__('sys').executable")
    before = k.eval(STATE)
    res = bridge(k, "liveness")
    assert res == {"ok": False, "error_kind": "kernel_side", "error": (
        f"jupyter-pause-kernel is not installed in this kernel's environment ({python}); "
        f"install it there, then restart the kernel: `{install_command(python)}`")}
    assert install_command(python) == (
        f"{python} -m pip install jupyter-pause-kernel=={jupyter_pause.__version__}")
    assert bridge(k, PROBE) == res
    assert k.eval(STATE) == before  # silent: no name, no history, no execution count


def test_kernel_side_of_another_protocol_is_refused(kernel_factory):
    k = kernel_factory()
    assert bridge(k, PROBE) == {"ok": True, "installed": True, "package": "jupyter-pause-kernel",
                                "version": jupyter_pause.__version__, "protocol": PROTOCOL,
                                "python": k.eval("__import__('sys').executable"),
                                "language": "python"}
    # A kernel side one protocol ahead (a newer jupyter-pause-kernel in the kernel's env).
    k.ok("import jupyter_pause.kernel.side as s; s.PROTOCOL += 1; "
         "import jupyter_pause; jupyter_pause.__version__ = '9.9'")
    python = k.eval("__import__('sys').executable")
    data = Path(k.env["JUPYTER_DATA_DIR"])
    files = sorted(data.rglob("*")) if data.exists() else []
    res = bridge(k, "checkpoint", stream="s")
    assert res == {"ok": False, "error_kind": "kernel_side", "error": (
        f"this kernel has jupyter-pause-kernel 9.9 (protocol {PROTOCOL + 1}); the server needs "
        f"protocol {PROTOCOL}: `{install_command(python)}`, then restart the kernel")}
    # It ran nothing: no checkpoint (no key, no store) was written.
    assert (sorted(data.rglob("*")) if data.exists() else []) == files


def test_line_splitter_reassembles_progress():
    seen = []
    s = LineSplitter(lambda d, t: seen.append((d, t)))
    s.feed('hello\nJUPYTER_PAUSE_PROGRESS {"done": 1, "to')
    s.feed('tal": 4}\nJUPYTER_PAUSE_PROGRESS {"done": 4, "total": 4}\n')
    s.feed("JUPYTER_PAUSE_PROGRESS not json\n")
    assert seen == [(1, 4), (4, 4)]


def test_code_and_reply_parsing():
    code = bridge_code("restore", stream="a'b\".ipynb", only=None)
    assert code.startswith("__import__('jupyter_pause.kernel.bridge', fromlist=['_']).call(")
    assert f", {PROTOCOL}) if " in code  # the protocol goes with every call
    compile(code, "<bridge>", "eval")  # one expression: nothing can be bound in user_ns
    ok = {
        "status": "ok",
        "user_expressions": {
            "jupyter_pause": {"status": "ok", "data": {"text/plain": '{"ok": true, "x": 1}'}}
        },
    }
    assert parse_reply({"content": ok}) == {"ok": True, "x": 1}
    err = {"status": "error", "ename": "NameError", "evalue": "x"}
    assert parse_reply(err)["ok"] is False


def test_async_progress_callback(kernel_factory):
    k = kernel_factory()
    k.ok("import numpy as np\ndata = np.zeros(100_000)")
    seen = []

    async def cb(done, total):
        seen.append((done, total))

    import asyncio

    from jupyter_client.asynchronous import AsyncKernelClient

    from jupyter_pause.server.bridge import run_bridge as call_bridge

    async def go():
        kc = AsyncKernelClient()
        kc.load_connection_info(k.km.get_connection_info())
        kc.start_channels(hb=False)
        try:
            return await call_bridge(kc, "checkpoint", progress=cb, timeout=60, stream="s")
        finally:
            kc.stop_channels()

    res = asyncio.run(go())
    assert res["ok"], res
    assert seen and seen[-1] == (res["bytes_total"], res["bytes_total"])


def test_replies_of_kernel_sides_from_before_protocol_versions():
    # An older kernel side's call() takes no protocol: the execution fails as a whole.
    old = {"status": "error", "ename": "TypeError",
           "evalue": "call() takes from 1 to 2 positional arguments but 3 were given"}
    res = parse_reply(old, python="/envs/old/bin/python")
    assert res["ok"] is False and res["error_kind"] == "kernel_side"
    assert "from before protocol versions" in res["error"]
    assert f"`{install_command('/envs/old/bin/python')}`" in res["error"]
    # One without jupyter_pause.kernel.side: the side expression fails, the result is read.
    no_side = {"status": "ok", "user_expressions": {
        "jupyter_pause_kernel_side": {"status": "error", "ename": "ModuleNotFoundError",
                                      "evalue": "No module named 'jupyter_pause.kernel.side'"},
        "jupyter_pause": {"status": "ok", "data": {"text/plain": '{"ok": true}'}}}}
    assert "from before protocol versions" in parse_reply(no_side)["error"]
    # A path with spaces is quoted for the shell.
    assert install_command("/my envs/bin/python").startswith("'/my envs/bin/python' -m pip")
