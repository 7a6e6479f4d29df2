"""Soak test of the lifecycle: many pause/resume cycles on a real server, every resume checked.

Starts a real ``jupyter server`` (temporary root, state, store and key; token auth; the default
local backend), opens ``--notebooks`` notebook sessions through ``/api/sessions`` and gives each
kernel real state: numpy arrays, a pandas DataFrame, a dict and, when torch is importable, a small
torch model and tensors. Then ``--cycles`` times: change every kind of state in every kernel
(tensors also through ``.data`` and numpy views, which torch's version counter does not see; some
values never change, so their blobs are reused), every 5th cycle damage every blob in the store in
place, ``POST pause``, wait for ``paused``, ``POST resume``, wait for ``ready``, and check in each
notebook's (new) kernel that every variable came back with the fingerprint it had at the pause
(a stale or partial checkpoint fails). While paused, starting a kernel (a new notebook, a paused
one, a bare kernel) must be refused. Every 4th cycle, after the resume, the state changes again
and the server is stopped with SIGTERM and started anew: reopening each notebook must bring back
that newer state (the shutdown checkpoint).

A failed cycle is counted, reported with the server's reason, and the workspace is brought back
(Resume again) so the soak goes on. Prints failures (must be 0) and p50/p99/max of
  pause    POST pause  -> state "paused" (checkpoints written, kernels shut down)
  resume   POST resume -> state "ready"
  to cell  POST resume -> a cell has run in every notebook's kernel (the README's time to resume)
``--load`` runs 2 CPU-burning processes beside it. Time-bounded by ``--max-minutes``.
Exit code: 0 all cycles passed, 1 a failure, 2 stopped by the time bound before ``--cycles``.
Kernels use the IPC transport (``--transport tcp`` for TCP ports).

``--scaling 1,4,8`` runs a short soak (``--cycles``, 3 by default) for each notebook count, one
after another, and prints the resume times of each with the load average before and after, and
how the largest count compares with the smallest (a resume starts the kernels together and
restores them together: it should grow with what the cores allow, not with the count).

    python bench/soak_lifecycle.py --cycles 200 --notebooks 3 [--load]
    python bench/soak_lifecycle.py --scaling 1,4,8
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import multiprocessing
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

TOKEN = "soak-token"
API = "jupyter-pause/api"
SETUP = """
import numpy as np, pandas as pd
arr = np.random.default_rng({seed}).random((256, 1024))
df = pd.DataFrame({{"i": np.arange(20_000), "x": np.random.default_rng({seed} + 1).random(20_000),
                    "s": [f"row{{k}}" for k in range(20_000)]}})
try:
    if not {torch}:
        raise ImportError("--without-torch")
    import torch
    torch.manual_seed({seed})
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    t = torch.zeros(1000)
    frozen_t = torch.randn(300_000)  # never changed: its blob is reused across checkpoints
except ImportError:
    model = t = frozen_t = None
frozen = np.random.default_rng({seed} + 2).random(300_000)  # never changed either
notes = {{"log": []}}
cycle = -1
"""
# Each cycle changes every kind of state, tensors among them through the writes torch's version
# counter does not see (.data, numpy views): a checkpoint that misses one brings back old values.
MUTATE = """
cycle = {n}
arr[{n} % 256, {n} % 1024] = {n}
df.loc[{n} % 20_000, "x"] = float({n})
notes["log"].append({n})
if model is not None:
    model[0].bias.data[{n} % 128] = float({n})
    model[2].weight.detach().numpy()[0, {n} % 128] = float({n})
    t.numpy()[{n} % 1000] = float({n})
    t.data[({n} + 1) % 1000] += 1.0
"""
# Evaluated as user_expressions: answered on the shell channel alone (no IOPub to miss).
FINGERPRINT = {
    "arr": "repr((arr.shape, float(arr.sum())))",
    "df": "repr((df.shape, float(df['x'].sum()), df['s'].iloc[-1]))",
    "model": "repr(None if model is None else "
             "round(float(sum(p.double().sum() for p in model.parameters())), 9))",
    "t": "repr(None if t is None else (float(t.double().sum()), float(frozen_t.double().sum())))",
    "frozen": "repr(float(frozen.sum()))",
    "notes": "repr(notes)",
    "cycle": "cycle",  # text/plain is the repr: "3"
}
DAMAGE_EVERY = 5  # cycles: flip a byte in every blob of the store before the pause
STOP_EVERY = 4  # cycles: after the resume, change state again, stop the server, start it anew


def damage_store(tmp: str) -> int:
    """Flip one byte in the middle of every blob (same size), as a disk or a tool might. The
    next pause must write a whole checkpoint anyway (blobs it cannot vouch for are rewritten),
    so the resume after it still brings everything back."""
    n = 0
    for dirpath, _, files in os.walk(os.path.join(tmp, "store", "blobs")):
        for name in files:
            path = os.path.join(dirpath, name)
            size = os.path.getsize(path)
            if not size:
                continue
            with open(path, "r+b") as f:
                f.seek(size // 2)
                b = f.read(1)
                f.seek(size // 2)
                f.write(bytes([b[0] ^ 0xFF]))
            n += 1
    return n


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process, the children it reaped and the descendants alive now: what a
    resume costs the machine, whatever the overlap (its kernels live on after it)."""
    import psutil

    total = 0.0
    try:
        top = psutil.Process(pid)
        t = top.cpu_times()
        total += t.user + t.system + t.children_user + t.children_system
        kids = top.children(recursive=True)
    except psutil.Error:
        return total
    for k in kids:
        try:
            t = k.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass  # ended meanwhile: counted in its parent's children times once reaped
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    """The server's REST API with token auth (token requests need no XSRF cookie)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.headers = {"Authorization": f"token {TOKEN}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             timeout: float = 60) -> tuple[int, Any]:
        # A connection per call: a server-side hiccup never poisons the next request.
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, "/" + path, body=None if body is None else json.dumps(body),
                         headers=self.headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw) if raw else {}
        except ValueError:
            return resp.status, {"message": raw[:200].decode(errors="replace")}


def start_server(tmp: str, port: int, transport: str = "ipc") -> subprocess.Popen[bytes]:
    config = os.path.join(tmp, "config")
    os.makedirs(config, exist_ok=True)
    os.makedirs(os.path.join(tmp, "root"), exist_ok=True)
    with open(os.path.join(config, "jupyter_server_config.json"), "w") as f:
        json.dump({
            "ServerApp": {"jpserver_extensions": {"jupyter_pause": True}, "allow_root": True,
                          "open_browser": False, "port_retries": 0,
                          "root_dir": os.path.join(tmp, "root")},
            "IdentityProvider": {"token": TOKEN},
            "KernelManager": {"transport": transport},
            "PauseApp": {"state_dir": os.path.join(tmp, "state"),
                         "store_url": os.path.join(tmp, "store"),
                         "key_path": os.path.join(tmp, "key", "checkpoint.key")},
        }, f)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": config,
           "JUPYTER_RUNTIME_DIR": os.path.join(tmp, "runtime"),
           "JUPYTER_DATA_DIR": os.path.join(tmp, "data")}
    log = open(os.path.join(tmp, "server.log"), "ab")  # noqa: SIM115 - lives with the process
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_up(api: Api, proc: subprocess.Popen[bytes], deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the server exited at start; see server.log")
        try:
            if api.call("GET", f"{API}/status", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit("the server did not start within 120 s")


class CellError(Exception):
    pass


def run_cell(tmp: str, kernel_id: str, code: str, expressions: dict[str, str] | None = None,
             timeout: float = 120) -> dict[str, str]:
    """Run ``code`` in the kernel over its shell channel; return the user expressions' values.

    Only the shell reply is awaited: it carries the outcome and the expressions, so this check
    does not depend on IOPub subscriptions (what the soak is probing on the server side).
    """
    from jupyter_client.blocking import BlockingKernelClient

    path = os.path.join(tmp, "runtime", f"kernel-{kernel_id}.json")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise CellError(f"no connection file for kernel {kernel_id}")
        time.sleep(0.1)
    kc = BlockingKernelClient()
    kc.load_connection_file(path)
    kc.start_channels(iopub=False, stdin=False, hb=False, control=False)
    try:
        msg_id = kc.execute(code, silent=False, store_history=False,
                            user_expressions=expressions or {})
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CellError(f"kernel {kernel_id[:8]} gave no reply within {timeout:.0f} s")
            try:
                reply = kc.get_shell_msg(timeout=left)
            except queue.Empty:
                continue  # the loop re-checks the deadline
            if reply["parent_header"].get("msg_id") == msg_id:
                break
    finally:
        kc.stop_channels()
    content = reply["content"]
    if content["status"] != "ok":
        raise CellError(f"{content.get('ename')}: {content.get('evalue')}")
    out = {}
    for name, res in (content.get("user_expressions") or {}).items():
        if res.get("status") != "ok":
            raise CellError(f"{name}: {res.get('ename')}: {res.get('evalue')}")
        out[name] = res["data"]["text/plain"]
    return out


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """SIGTERM, as a spawner or ``kubectl delete pod`` does; the exit code."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise CellError(f"the server did not stop within {timeout:.0f} s of SIGTERM") from None


def refused_while_paused(api: Api, paths: list[str]) -> None:
    """No kernel starts while paused, whoever asks: a new notebook, a paused one, a bare kernel
    (it would hold the accelerator the pause gave back, and be merged over at resume)."""
    for body in ({"path": "soak-new.ipynb", "name": "soak-new.ipynb", "type": "notebook",
                  "kernel": {"name": "python3"}},
                 {"path": paths[0], "name": paths[0], "type": "notebook",
                  "kernel": {"name": "python3"}}):
        code, _ = api.call("POST", "api/sessions", body)
        if code != 409:
            raise CellError(f"POST api/sessions for {body['path']} while paused answered {code}")
    code, _ = api.call("POST", "api/kernels", {"name": "python3"})
    if code != 409:
        raise CellError(f"POST api/kernels while paused answered {code}")
    code, kernels = api.call("GET", "api/kernels")
    if code != 200 or kernels:
        raise CellError(f"kernels running while paused: {kernels}")


def kernels_by_path(api: Api) -> dict[str, str]:
    code, sessions = api.call("GET", "api/sessions")
    if code != 200:
        raise CellError(f"GET api/sessions answered {code}")
    return {s["path"]: s["kernel"]["id"] for s in sessions if s.get("kernel")}


def wait_flight(api: Api, ends: tuple[str, ...], timeout: float) -> dict[str, Any]:
    """Poll status until no flight runs and the state is one of ``ends``."""
    deadline = time.monotonic() + timeout
    while True:
        code, st = api.call("GET", f"{API}/status")
        if code == 200 and st.get("flight") is None and st.get("state") in ends:
            return st
        if time.monotonic() > deadline:
            raise CellError(f"still {st.get('state')!r} after {timeout:.0f} s")
        time.sleep(0.05)


def burn() -> None:  # pragma: no cover - runs in a child process
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        pass


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def summary(name: str, values: list[float]) -> str:
    if not values:
        return f"{name:<9} n=    0"
    return (f"{name:<9} n={len(values):>5}  p50={pct(values, 0.5):7.2f} s  "
            f"p99={pct(values, 0.99):7.2f} s  max={max(values):7.2f} s")


def reason(st: dict[str, Any]) -> str:
    return f"state {st.get('state')}: {st.get('reason') or ''} {st.get('hint') or ''}".strip()


def recover(api: Api) -> str:
    """After a failed cycle, bring the workspace back to running (Resume again if paused)."""
    code, st = api.call("GET", f"{API}/status")
    if st.get("flight") is not None:
        st = wait_flight(api, ("paused", "ready", "running", "failed"), 600)
    if st.get("state") in ("paused", "failed"):
        code, _ = api.call("POST", f"{API}/resume", {})
        if code == 202:
            st = wait_flight(api, ("ready", "failed", "running", "paused"), 600)
    return str(st.get("state"))


def scaling(args: argparse.Namespace) -> int:
    """One short soak per notebook count (a fresh server each), run one after another."""
    counts = [int(x) for x in args.scaling.split(",")]
    cycles = args.cycles or 3
    rows = []
    for n in counts:
        before = os.getloadavg()[0]
        cmd = [sys.executable, os.path.abspath(__file__), "--notebooks", str(n), "--cycles",
               str(cycles), "--transport", args.transport, "--step-timeout",
               str(args.step_timeout), *(["--load"] if args.load else []),
               *(["--without-torch"] if args.without_torch else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        after = os.getloadavg()[0]
        out = proc.stdout + proc.stderr
        resumes = [float(x) for x in re.findall(r"resume\s+([0-9.]+) s", out)]
        cells = [float(x) for x in re.findall(r"to cell\s+([0-9.]+) s", out)]
        cpus = [float(x) for x in re.findall(r"\(cpu\s+([0-9.]+) s\)", out)]
        if proc.returncode != 0 or not resumes:
            print(out[-3000:])
            print(f"{n} notebooks: the soak failed (exit code {proc.returncode})")
            return 1
        rows.append((n, resumes, cells, cpus))
        cores = os.cpu_count() or 1
        print(f"resume, {n:>2} notebooks: p50 {pct(resumes, 0.5):5.2f} s  min "
              f"{min(resumes):5.2f} s  max {max(resumes):5.2f} s  (to cell p50 "
              f"{pct(cells, 0.5):5.2f} s; CPU p50 {pct(cpus, 0.5):5.2f} s, i.e. at least "
              f"{pct(cpus, 0.5) / cores:5.2f} s on {cores} cores; n={len(resumes)}; "
              f"load average before {before:.2f}, after {after:.2f})", flush=True)
    (n0, r0, _, _), (n1, r1, _, c1) = rows[0], rows[-1]
    ratio = pct(r1, 0.5) / pct(r0, 0.5)
    floor = pct(c1, 0.5) / (os.cpu_count() or 1)
    print(f"resume of {n1} notebooks / {n0} notebook(s): {ratio:.2f}x (p50; "
          f"{os.cpu_count()} cores; transport {args.transport}; "
          f"{'no torch' if args.without_torch else 'torch'} in the notebooks); "
          f"{n1} notebooks took {pct(r1, 0.5) / floor:.2f}x the time their CPU needs on these "
          f"cores (1.0: every core busy throughout)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=None, help="200 (3 per count with --scaling)")
    ap.add_argument("--notebooks", type=int, default=3)
    ap.add_argument("--load", action="store_true", help="run 2 CPU-burning processes beside it")
    ap.add_argument("--max-minutes", type=float, default=120.0,
                    help="start no new cycle after this long (exit code 2 if cut short)")
    ap.add_argument("--step-timeout", type=float, default=300.0,
                    help="seconds a pause or a resume may take before the cycle fails")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--transport", choices=("ipc", "tcp"), default="ipc",
                    help="the kernels' transport (KernelManager.transport)")
    ap.add_argument("--without-torch", action="store_true",
                    help="no torch state in the notebooks (a restore then imports no torch)")
    ap.add_argument("--scaling", default=None, metavar="N,N,...",
                    help="resume times for each of these notebook counts (short soaks)")
    args = ap.parse_args()
    if args.scaling:
        return scaling(args)
    if args.cycles is None:
        args.cycles = 200

    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="soak-lifecycle-")
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(2 * args.load)]
    for b in burners:
        b.start()
    port = free_port()
    proc = start_server(tmp, port, args.transport)
    api = Api(port)
    failures: list[str] = []
    t_pause: list[float] = []
    t_resume: list[float] = []
    cpu_resume: list[float] = []  # CPU seconds the server and its kernels spent on it
    t_cell: list[float] = []
    done = stops = 0
    try:
        wait_up(api, proc)
        paths = [f"soak-{i}.ipynb" for i in range(args.notebooks)]
        expected: dict[str, dict[str, str]] = {}
        for i, path in enumerate(paths):
            code, s = api.call("POST", "api/sessions", {
                "path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})
            if code not in (200, 201):
                raise SystemExit(f"cannot open {path}: {code} {s}")
            expected[path] = run_cell(tmp, s["kernel"]["id"],
                                      SETUP.format(seed=i, torch=not args.without_torch),
                                      FINGERPRINT)
        torch_on = all(v["model"] != "None" for v in expected.values())
        print(f"server on port {port}, {args.notebooks} notebooks (numpy, pandas"
              f"{', torch' if torch_on else '; torch not importable'}), {args.cycles} cycles"
              f"{', 2 CPU burners' if args.load else ''}; dir {tmp}", flush=True)

        for n in range(args.cycles):
            if time.monotonic() - started > args.max_minutes * 60:
                print(f"time bound of {args.max_minutes:g} min reached after {done} cycles")
                break
            try:
                kernels = kernels_by_path(api)
                for path in paths:
                    expected[path] = run_cell(tmp, kernels[path], MUTATE.format(n=n), FINGERPRINT)
                if n % DAMAGE_EVERY == DAMAGE_EVERY - 1:
                    damage_store(tmp)
                t0 = time.perf_counter()
                code, body = api.call("POST", f"{API}/pause", {})
                if code != 202:
                    raise CellError(f"POST pause answered {code}: {body.get('message')}")
                st = wait_flight(api, ("paused", "failed", "running"), args.step_timeout)
                if st["state"] != "paused":
                    raise CellError(f"pause failed: {reason(st)}")
                t_pause.append(time.perf_counter() - t0)
                refused_while_paused(api, paths)
                t0 = time.perf_counter()
                cpu0 = tree_cpu(proc.pid)
                code, body = api.call("POST", f"{API}/resume", {})
                if code != 202:
                    raise CellError(f"POST resume answered {code}: {body.get('message')}")
                st = wait_flight(api, ("ready", "failed", "paused", "running"), args.step_timeout)
                if st["state"] != "ready":
                    raise CellError(f"resume failed: {reason(st)}")
                t_resume.append(time.perf_counter() - t0)
                cpu_resume.append(tree_cpu(proc.pid) - cpu0)
                kernels = kernels_by_path(api)
                for path in paths:
                    if path not in kernels:
                        raise CellError(f"{path} has no kernel after resume")
                    got = run_cell(tmp, kernels[path], "", FINGERPRINT)
                    wrong = {k: (got.get(k), v) for k, v in expected[path].items()
                             if got.get(k) != v}
                    if wrong:
                        raise CellError(f"{path} came back different: {wrong}")
                t_cell.append(time.perf_counter() - t0)
                if n % STOP_EVERY == STOP_EVERY - 1:
                    # work done since the resume, then a stop: saved, and back at the next start
                    for path in paths:
                        expected[path] = run_cell(tmp, kernels[path],
                                                  MUTATE.format(n=n + 1000), FINGERPRINT)
                    stop_server(proc)
                    proc = start_server(tmp, port, args.transport)
                    wait_up(api, proc)
                    for path in paths:
                        code, sess = api.call("POST", "api/sessions", {
                            "path": path, "name": path, "type": "notebook",
                            "kernel": {"name": "python3"}}, timeout=300)
                        if code not in (200, 201):
                            raise CellError(f"reopening {path} after the stop: {code} {sess}")
                        got = run_cell(tmp, sess["kernel"]["id"], "", FINGERPRINT)
                        wrong = {k: (got.get(k), v) for k, v in expected[path].items()
                                 if got.get(k) != v}
                        if wrong:
                            raise CellError(f"{path} came back different after the stop: {wrong}")
                    stops += 1
                print(f"cycle {n + 1:>4}/{args.cycles}: pause {t_pause[-1]:6.2f} s  "
                      f"resume {t_resume[-1]:6.2f} s  (cpu {cpu_resume[-1]:6.2f} s)  "
                      f"to cell {t_cell[-1]:6.2f} s  "
                      f"({st.get('outcome')})", flush=True)
            except (CellError, OSError, KeyError) as e:
                msg = f"cycle {n + 1}: {type(e).__name__}: {e}"
                failures.append(msg)
                print("FAIL " + msg, flush=True)
                try:
                    print(f"     recovered to {recover(api)!r}", flush=True)
                except (CellError, OSError) as e2:
                    print(f"     could not recover: {e2}", flush=True)
                    done += 1
                    break
            done += 1
            if proc.poll() is not None:
                failures.append(f"the server exited (code {proc.returncode})")
                break
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        for b in burners:
            b.terminate()
    print(f"\n{done} cycles x {args.notebooks} notebooks, failures: {len(failures)}"
          f"{' (with 2 CPU burners)' if args.load else ''}; {stops} server stops and restarts")
    for f in failures:
        print("  " + f)
    print(summary("pause", t_pause))
    print(summary("resume", t_resume))
    print(summary("to cell", t_cell))
    if args.keep or failures:
        print(f"kept {tmp} (server.log, state/journal.jsonl)")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        return 1
    return 0 if done >= args.cycles else 2


if __name__ == "__main__":
    if importlib.util.find_spec("jupyter_pause") is None:
        raise SystemExit("jupyter_pause is not importable: run this with the project's venv")
    sys.exit(main())
