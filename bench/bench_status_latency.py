"""Latency of ``GET jupyter-pause/api/status`` while a large checkpoint runs, against idle.

Starts a real ``jupyter server`` (temporary dirs), opens a notebook session whose kernel holds
``--size-mib`` of random float64 data, then measures status requests back to back:
  1. reference: nothing running;
  2. during the pause's checkpoint (state "checkpointing").
Prints p50 / p99 / max of both and the p99 ratio. The server's event loop must never wait on the
checkpoint (it runs in the kernel process; the journal is written from a thread).

    python bench/bench_status_latency.py --size-mib 1024
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run as a script: the repository root makes the test harness importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.harness import JupyterProcess, pause_server_config

TOKEN = "bench-token"


class Api:
    """The REST API over one kept-alive connection, as a browser tab holds one."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"token {TOKEN}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body)
        self.conn.request(method, "/" + path, body=data, headers=self.headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw else {})


def start_server(tmp: Path) -> JupyterProcess:
    """A real `jupyter server` with jupyter_pause, its directories under ``tmp``."""
    server = JupyterProcess(
        tmp,
        pause_server_config(tmp / "state", tmp / "store", tmp / "key", bridge_timeout=1800),
        token=TOKEN,
        start_timeout=120,
    )
    return server.start()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def summary(name: str, values: list[float]) -> str:
    return (
        f"{name:<28} n={len(values):>5}  p50={pct(values, 0.5) * 1e3:7.2f} ms  "
        f"p99={pct(values, 0.99) * 1e3:7.2f} ms  max={max(values) * 1e3:7.2f} ms  "
        f"mean={statistics.fmean(values) * 1e3:7.2f} ms"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024, help="kernel data to checkpoint")
    ap.add_argument("--reference-samples", type=int, default=500)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench-status-")
    server = None
    try:
        server = start_server(Path(tmp))
        api = Api(server.port)
        _, session = api.call(
            "POST",
            "api/sessions",
            {
                "path": "bench.ipynb",
                "name": "bench.ipynb",
                "type": "notebook",
                "kernel": {"name": "python3"},
            },
        )
        kid = session["kernel"]["id"]
        n = args.size_mib * 2**20 // 8
        print(f"kernel {kid[:8]}: allocating {args.size_mib} MiB of random float64 ...", flush=True)
        server.output(kid, f"import numpy as np; big = np.random.default_rng(0).random({n})",
                      timeout=600)

        ref = []
        for _ in range(args.reference_samples):
            t0 = time.perf_counter()
            api.call("GET", "jupyter-pause/api/status")
            ref.append(time.perf_counter() - t0)

        code, body = api.call("POST", "jupyter-pause/api/pause", {"trigger": "api"})
        assert code == 202, body
        t_pause = time.perf_counter()
        during, progress_seen, states = [], 0, []
        while True:
            t0 = time.perf_counter()
            _, st = api.call("GET", "jupyter-pause/api/status")
            dt = time.perf_counter() - t0
            if st["state"] == "checkpointing":
                during.append(dt)
                if (st.get("step") or {}).get("done"):
                    progress_seen += 1
            if not states or states[-1] != st["state"]:
                states.append(st["state"])
            if st["flight"] is None:
                break
        elapsed = time.perf_counter() - t_pause
        cp = st.get("last_checkpoint") or {}
        print(
            f"pause: {' -> '.join(states)} in {elapsed:.1f} s; checkpoint "
            f"{(cp.get('bytes_total') or 0) / 2**20:.0f} MiB "
            f"({(cp.get('bytes_written') or 0) / 2**20:.0f} MiB written); "
            f"{progress_seen} status answers carried byte progress"
        )
        if st["state"] != "paused" or not during:
            print(f"unexpected end state {st['state']}: {st.get('reason')}")
            return 1
        print(summary("GET status, idle", ref))
        print(summary("GET status, checkpointing", during))
        print(
            f"ratio p50 {pct(during, 0.5) / pct(ref, 0.5):.2f}x, "
            f"p99 {pct(during, 0.99) / pct(ref, 0.99):.2f}x (checkpointing / idle)"
        )
        return 0
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
