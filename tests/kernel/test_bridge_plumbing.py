"""The bridge protocol itself: silent, no names left behind, no history, liveness."""

from __future__ import annotations

import pytest

from jupyter_pause.server.protocol import LineSplitter, bridge_code, parse_reply

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
                   "error_kind": None}
    assert k.eval(STATE) == before


def test_liveness_reports_never_pause(kernel):
    kernel.ok("%pause --never")
    assert bridge(kernel, "liveness")["never_pause"] is True


def test_kernel_without_jupyter_pause(kernel_factory):
    k = kernel_factory()
    # As if jupyter_pause were not installed in the kernel's environment.
    k.ok("import sys; sys.modules['jupyter_pause.kernel.bridge'] = None")
    res = bridge(k, "liveness")
    assert res == {
        "ok": False,
        "error": "jupyter_pause is not installed in this kernel's environment",
    }


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
        kc.start_channels()
        try:
            return await call_bridge(kc, "checkpoint", progress=cb, timeout=60, stream="s")
        finally:
            kc.stop_channels()

    res = asyncio.run(go())
    assert res["ok"], res
    assert seen and seen[-1] == (res["bytes_total"], res["bytes_total"])
