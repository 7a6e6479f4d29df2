"""A kernel or a whole server killed without grace: the autosave is offered, and restored only
when the person asks. Real `jupyter server` processes, real kernels, real SIGKILLs."""

from __future__ import annotations

import contextlib
import json
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_pause.checkpoint import open_keyed_store
from jupyter_pause.checkpoint.retention import is_autosave
from tests.server.server_process import Server

pytestmark = pytest.mark.timeout(300)

ON = {"autosave": True}  # the product's default (the test servers' is off)
STATUS = "__import__('jupyter_pause.kernel.autosave', fromlist=['_']).get(get_ipython())"


def autosave_of(tmp: Path, stream: str, cell: int) -> Any:
    if not (tmp / "key").exists():
        return None
    store = open_keyed_store(str(tmp / "store"), str(tmp / "key"))
    # jupyter_server names the session (the stream) by the notebook's file path
    return next((m for m in store.list() if m.stream.endswith("/" + stream) and is_autosave(m)
                 and m.meta.get("cell") == cell), None)


def silent(srv: Server, kid: str, expr: str) -> Any:
    """``expr`` evaluated in the kernel without a cell (no pre/post_run_cell hook)."""
    with srv.driver(kid) as k:
        return k.silent(expr)


def installed(srv: Server, kid: str) -> bool:
    """The server installed the kernel's autosave."""
    return silent(srv, kid, f"{STATUS} is not None")


def run(srv: Server, kid: str, code: str) -> int:
    """Run a cell; its execution count."""
    with srv.driver(kid) as k:
        return k.ok(code, timeout=60, allow_traceback=True).execution_count


def kernel_process(srv: Server, kid: str) -> psutil.Process | None:
    """The kernel's process (None between a death and the restart)."""
    for p in psutil.Process(srv.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if any(f"kernel-{kid}.json" in a for a in p.cmdline()) and p.is_running() and \
                    p.status() != psutil.STATUS_ZOMBIE:
                return p
    return None


def offer_for(srv: Server, path: str) -> dict[str, Any] | None:
    _, st = srv.call("GET", "jupyter-pause/api/status")
    return next((o for o in st.get("offers") or [] if o["path"] == path), None)


def notebook_with_state(srv: Server, tmp: Path, path: str, code: str) -> tuple[str, Any]:
    """Open ``path``, run ``code`` in it once its autosave is installed; (kernel id, the
    autosave of that cell)."""
    kid = srv.open_notebook(path)["kernel"]["id"]
    srv.wait_for(f"the autosave of {path}'s kernel", lambda: installed(srv, kid), 120)
    run(srv, kid, "import numpy as np\nsteps = 0")
    cell = run(srv, kid, code)
    m = srv.wait_for(f"the autosave of cell [{cell}]", lambda: autosave_of(tmp, path, cell), 60)
    return kid, m


def test_sigkill_of_a_kernel_offers_its_autosave_and_restore_brings_it_back(tmp_path: Path
                                                                           ) -> None:
    srv = Server(tmp_path, ON).start()
    try:
        kid, m = notebook_with_state(srv, tmp_path, "a.ipynb",
                                     "steps = 42\nw = np.arange(10.0) * 2")
        old = kernel_process(srv, kid)
        assert old is not None
        # With autosave on, kernels start with torch's huge-page allocation (a cheaper fork).
        assert silent(srv, kid, "__import__('os').environ.get('THP_MEM_ALLOC_ENABLE')") == "1"
        old.send_signal(signal.SIGKILL)  # the OOM killer's way

        offer = srv.wait_for("the offer", lambda: offer_for(srv, "a.ipynb"), 60)
        assert offer["cause"] == "kernel_died" and offer["kind"] == "autosave"
        assert offer["checkpoint_id"] == m.id and offer["cell"] == m.meta["cell"]
        assert f"cell [{m.meta['cell']}]" in offer["text"] and "can be restored" in offer["text"]
        assert offer["cells_lost"] == 0  # the last cell had finished and was saved
        # The restarter brought a new process under the same id; nothing was restored yet.
        srv.wait_for("the restarted kernel",
                     lambda: (p := kernel_process(srv, kid)) and p.pid != old.pid, 60)
        srv.wait_for("its autosave", lambda: installed(srv, kid), 120)
        assert silent(srv, kid, "'steps' in globals()") is False

        # While the kernel runs something, the restore waits a little for it, then says so
        # (silent: a silent request is not the person's cell, the offer stays unused).
        release = tmp_path / "release"
        with srv.driver(kid) as k:
            k.kc.execute(f"import os, time\nwhile not os.path.exists({str(release)!r}):\n"
                         "    time.sleep(0.05)", silent=True)
            srv.wait_for("the kernel busy", lambda: srv.get(f"api/kernels/{kid}")[
                "execution_state"] == "busy", 30)
            code, body = srv.call("POST", "jupyter-pause/api/offers/restore",
                                  {"path": "a.ipynb"})
            assert code == 409 and "running a cell" in body["message"], body
            release.touch()
            srv.wait_for("the kernel idle", lambda: srv.get(f"api/kernels/{kid}")[
                "execution_state"] == "idle", 30)

        code, body = srv.call("POST", "jupyter-pause/api/offers/restore", {"path": "a.ipynb"})
        assert code == 200, body
        assert body["checkpoint_id"] == m.id
        assert silent(srv, kid, "(steps, float(w[3]))") == (42, 6.0)
        _, st = srv.call("GET", "jupyter-pause/api/status")
        assert st["offers"] == []
        assert st["recoveries"]["deaths"] == 1 and st["recoveries"]["restored"] == 1
        events = [e["event"] for e in srv.journal()]
        assert "kernel_died" in events and "offer_restored" in events
        code, _ = srv.call("POST", "jupyter-pause/api/offers/restore", {"path": "a.ipynb"})
        assert code == 404  # taken once
        # The platform team's report counts the recovery and the work it lost.
        code, out = srv.cli("report", "--json", "--state-dir", str(srv.tmp / "state"),
                            "--period", "all")
        assert code == 0, out
        rc = json.loads(out)["report"]["totals"]["recoveries"]
        assert rc == {"kernel_deaths": 1, "server_kills": 0, "offered": 1, "restored": 1,
                      "dismissed": 0, "cells_lost": 0, "seconds_lost": offer["age_s"]}, rc
        code, out = srv.cli("report", "--state-dir", str(srv.tmp / "state"))
        assert code == 0 and "Recoveries: kernels died 1, servers killed 0; offered 1, " \
            "restored 1, dismissed 0; work lost 0 cells" in out, out
    finally:
        srv.stop()


def test_sigkill_of_the_server_and_its_kernels_offers_each_notebooks_autosave(tmp_path: Path
                                                                             ) -> None:
    srv = Server(tmp_path, ON).start()
    saved = {}
    try:
        for path, n in (("a.ipynb", 1), ("b.ipynb", 2)):
            _, saved[path] = notebook_with_state(srv, tmp_path, path, f"steps = {n}")
    finally:
        srv.kill()  # SIGKILL of the server and every kernel: no shutdown checkpoint

    srv = Server(tmp_path, ON).start()
    try:
        for path, m in saved.items():
            offer = offer_for(srv, path)
            assert offer is not None, path
            assert offer["cause"] == "server_killed" and offer["checkpoint_id"] == m.id
            assert offer["kernel_id"] is None  # nothing restores by itself
        kid = srv.open_notebook("b.ipynb")["kernel"]["id"]
        srv.wait_for("the new kernel's autosave", lambda: installed(srv, kid), 120)
        assert offer_for(srv, "b.ipynb")["kernel_id"] == kid
        code, body = srv.call("POST", "jupyter-pause/api/offers/restore", {"path": "b.ipynb"})
        assert code == 200, body
        assert silent(srv, kid, "steps") == 2
        offer = offer_for(srv, "a.ipynb")
        assert offer is not None  # still offered
        # A page names the offer it shows: another one (from before a restart) is not it.
        code, _ = srv.call("POST", "jupyter-pause/api/offers/dismiss",
                           {"path": "a.ipynb", "id": offer["id"] + "-before"})
        assert code == 404 and offer_for(srv, "a.ipynb") is not None
        code, _ = srv.call("POST", "jupyter-pause/api/offers/dismiss",
                           {"path": "a.ipynb", "id": offer["id"]})
        assert code == 204 and offer_for(srv, "a.ipynb") is None
    finally:
        srv.stop()
    # A clean stop leaves no marker: the next start offers nothing.
    srv = Server(tmp_path, ON).start()
    try:
        _, st = srv.call("GET", "jupyter-pause/api/status")
        assert st["offers"] == []
    finally:
        srv.stop()


def test_autosave_is_not_activity(tmp_path: Path) -> None:
    # The write starts 6 s after the cell: the activity is read before it, then after it.
    srv = Server(tmp_path, {"autosave": {"idle_delay": 6.0}}).start()
    try:
        kid = srv.open_notebook("a.ipynb")["kernel"]["id"]
        srv.wait_for("the autosave of the kernel", lambda: installed(srv, kid), 120)
        run(srv, kid, "import numpy as np")
        with srv.driver(kid) as k:
            out = k.ok("big = np.ones(4_000_000)", timeout=60, allow_traceback=True)
        cell, replied = out.execution_count, out.reply["header"]["date"]

        def idle_after_the_cell() -> bool:
            # The cell's trailing idle is sent after its reply: read as idle with an activity
            # no older than the reply, the server has read that idle, not one from before.
            model = srv.get(f"api/kernels/{kid}")
            return model["execution_state"] == "idle" and \
                datetime.fromisoformat(model["last_activity"]) >= replied

        srv.wait_for("the kernel idle after the cell", idle_after_the_cell, 30)
        before = srv.get(f"api/kernels/{kid}")["last_activity"]
        before_server = srv.get("api/status")["last_activity"]
        assert autosave_of(tmp_path, "a.ipynb", cell) is None  # read before the autosave
        srv.wait_for(f"the autosave of cell [{cell}]", lambda: autosave_of(tmp_path, "a.ipynb",
                                                                           cell), 60)
        # /api/status first: a GET of /api/kernels is API activity of its own
        assert srv.get("api/status")["last_activity"] == before_server
        after = srv.get(f"api/kernels/{kid}")
        assert after["last_activity"] == before and after["execution_state"] == "idle"
    finally:
        srv.stop()


def test_autosave_retention_keeps_the_newest_few_within_bytes_and_no_other_kind() -> None:
    from jupyter_pause.checkpoint.manifest import Manifest
    from jupyter_pause.checkpoint.retention import plan, plan_autosaves

    def m(i: int, kind: str, size: int) -> Manifest:
        return Manifest(id=f"2026{i:04d}", stream="s", created="2026-12-01T17:00:00Z",
                        meta={"kind": kind}, bytes_total=size)

    auto = [m(i, "autosave", 100) for i in range(6)]
    pause = [m(10 + i, "checkpoint", 100) for i in range(2)]
    delete, kept = plan_autosaves(auto + pause, keep=3, max_bytes=250)
    assert [x.id for x in kept] == ["20260005", "20260004"]  # 3 would hold 300 bytes
    assert all(x.meta["kind"] == "autosave" for x in delete) and len(delete) == 4
    delete, kept = plan_autosaves(auto, keep=3, max_bytes=50)
    assert [x.id for x in kept] == ["20260005"]  # the newest is always kept
    # The count rule of pause checkpoints ranks autosaves apart: none of these goes.
    delete, _ = plan(auto[:4] + pause, keep=2)
    assert {x.id for x in delete} == {"20260000", "20260001"}


def test_offers_and_recoveries_come_back_from_the_journal() -> None:
    from jupyter_pause.server.deaths import make_offer, offer_text
    from jupyter_pause.server.state import apply, default_state

    offer = make_offer("kernel_died", "a.ipynb", "/r/a.ipynb", None, "2026-12-01T17:00:00Z",
                       dead_kernel_id="k1", last_cell=4)
    assert offer_text(offer) == "The kernel died; its state is gone (no autosave of it exists)."
    offer.update(checkpoint_id="c1", cell=3, age_s=5.0, cells_lost=1)
    assert offer_text(offer) == "The kernel died; its state as of cell [3], 5 s before, can " \
        "be restored."
    st = default_state()
    for seq, e in enumerate([{"event": "kernel_died", "offer": offer},
                             {"event": "offer_restored", "path": "a.ipynb", "cells_lost": 1,
                              "seconds_lost": 5.0}], start=1):
        apply(st, {"seq": seq, "at": "2026-12-01T17:00:01Z", "flight": None, **e})
    assert st["offers"] == {} and st["state"] == "running"
    assert st["recoveries"] == {"deaths": 1, "server_kills": 0, "offered": 1, "restored": 1,
                                "cells_lost": 1, "seconds_lost": 5.0}
