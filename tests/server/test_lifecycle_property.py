"""Property test on a real server: random sequences of changes in notebooks, pauses, resumes,
kernel deaths (SIGKILL; jupyter_server restarts the kernel, empty) and server stops (SIGTERM, then
a new start), against a model of what each notebook must hold.

The model: after a pause and its resume, each notebook holds what it held at the pause; after a
stop and a new start, reopening a notebook brings back what it held at the stop; a killed kernel
holds nothing (no autosave yet: what was not saved is gone, and is never invented). The values
include tensors changed through ``.data`` and numpy views, which torch's version counter misses.
While paused no kernel may start. Each step is slow (seconds), so few examples run; the
checkpoint-level property test (tests/checkpoint/test_property_lifecycle.py) runs many.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import psutil
import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("torch")

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
)
from server_process import Server

pytestmark = pytest.mark.timeout(900)

NOTEBOOKS = ("p.ipynb", "q.ipynb")
SETUP = "import torch\nt = torch.zeros(64)\nlog = []\n"
# the next value in the notebook: a python list and a tensor written behind torch's back
CHANGE = "log.append({v})\nt.data[{i}] = {v}\nt.numpy()[{j}] += 1\n"
SHOW = "print(repr((log, t.tolist())) if 'log' in dir() else 'empty')"


def _value(log: list[int], tensor: list[float]) -> str:
    return repr((log, tensor))


class ServerLifecycle(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="jp-prop-server-"))
        self.server = Server(self.tmp)
        self.server.start()
        self.kernels: dict[str, str] = {}
        # the model: per notebook (log, tensor values), or None for an empty kernel
        self.live: dict[str, tuple[list[int], list[float]] | None] = {}
        self.paused = False
        for nb in NOTEBOOKS:
            kid = self.server.open_notebook(nb)["kernel"]["id"]
            self.server.output(kid, SETUP)
            self.kernels[nb] = kid
            self.live[nb] = ([], [0.0] * 64)

    def teardown(self) -> None:
        import shutil

        if getattr(self, "server", None) is not None:
            self.server.stop()
        if getattr(self, "tmp", None) is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------------
    def _check(self, nb: str) -> None:
        out = self.server.output(self.kernels[nb], SHOW).strip()
        want = self.live[nb]
        assert out == ("empty" if want is None else _value(*want)), (nb, out, want)

    def _kernel_of(self, nb: str) -> str | None:
        ks = [s["kernel"]["id"] for s in self.server.get("api/sessions")
              if s["path"] == nb and s.get("kernel")]
        return ks[0] if ks else None

    # -- rules -------------------------------------------------------------------------------
    @precondition(lambda self: not self.paused)
    @rule(nb=st.sampled_from(NOTEBOOKS), v=st.integers(1, 999), i=st.integers(0, 63),
          j=st.integers(0, 63))
    def change(self, nb: str, v: int, i: int, j: int) -> None:
        if self.live[nb] is None:  # a restarted, empty kernel: set it up again
            self.server.output(self.kernels[nb], SETUP)
            self.live[nb] = ([], [0.0] * 64)
        self.server.output(self.kernels[nb], CHANGE.format(v=v, i=i, j=j))
        log, tensor = self.live[nb]
        tensor = list(tensor)
        tensor[i] = float(v)
        tensor[j] += 1.0
        self.live[nb] = ([*log, v], tensor)

    @precondition(lambda self: not self.paused)
    @rule()
    def pause(self) -> None:
        self.server.request("POST", "jupyter-pause/api/pause", {"trigger": "manual"})
        st_ = self.server.state("paused", "failed", "running")
        assert st_["state"] == "paused", st_
        self.paused = True
        code, _ = self.server.call("POST", "api/sessions", {
            "path": NOTEBOOKS[0], "name": NOTEBOOKS[0], "type": "notebook",
            "kernel": {"name": "python3"}})
        assert code == 409, code  # no kernel starts while paused
        assert self.server.get("api/kernels") == []

    @precondition(lambda self: self.paused)
    @rule()
    def resume(self) -> None:
        self.server.request("POST", "jupyter-pause/api/resume", {})
        st_ = self.server.state("ready", "failed", "paused")
        assert st_["state"] == "ready", st_
        self.paused = False
        for nb in NOTEBOOKS:
            kid = self._kernel_of(nb)
            assert kid is not None, nb
            self.kernels[nb] = kid
            self._check(nb)

    @precondition(lambda self: not self.paused)
    @rule(nb=st.sampled_from(NOTEBOOKS))
    def kernel_dies(self, nb: str) -> None:
        """SIGKILL of the kernel process (the OOM killer's way): jupyter_server restarts it."""
        kid = self.kernels[nb]
        procs = [p for p in psutil.process_iter(["cmdline"])
                 if any(f"kernel-{kid}.json" in a for a in (p.info["cmdline"] or []))]
        assert procs, f"no process for kernel {kid}"
        old = procs[0].pid
        os.kill(old, signal.SIGKILL)

        def restarted():
            ps = [p for p in psutil.process_iter(["cmdline"])
                  if any(f"kernel-{kid}.json" in a for a in (p.info["cmdline"] or []))
                  and p.pid != old]
            return bool(ps) and self.server.get(f"api/kernels/{kid}")["execution_state"] \
                in ("idle", "starting")

        self.server.wait_for("the killed kernel restarted", restarted, 60)
        self.live[nb] = None

    @rule()
    def server_stops(self) -> None:
        """SIGTERM (a spawner's stop, kubectl delete pod), then a new start on the same disk."""
        self.server.signal(signal.SIGTERM)
        assert self.server.wait_exit(90) is not None, self.server.log_tail()
        self.server.start()
        if self.paused:
            st_ = self.server.state("paused")
            assert st_["state"] == "paused"
            return
        for nb in NOTEBOOKS:
            self.kernels[nb] = self.server.open_notebook(nb)["kernel"]["id"]
            self._check(nb)


ServerLifecycle.TestCase.settings = settings(
    max_examples=int(os.environ.get("JP_SERVER_PROPERTY_EXAMPLES", "3")),
    stateful_step_count=8,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=bool(os.environ.get("CI")),
)
test_server_lifecycle = ServerLifecycle.TestCase
