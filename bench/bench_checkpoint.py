"""Checkpoint engine benchmark: every figure is printed with its reference and the ratio, all
measured in one run (the machine is shared and noisy: compare ratios, not absolute numbers).

    python bench/bench_checkpoint.py            # the issue's sizes (4 GiB model state, ...)
    python bench/bench_checkpoint.py --quick    # small sizes, a minute or so

Sections: (1) model state: checkpoint+fsync vs the device limit (an O_DIRECT write+fsync of the
same bytes) and vs a buffered write+fsync, peak extra RSS, cold restore
(all pages touched) vs a cold sequential read; (2) mixed notebook namespace vs dill.dump_module;
(3) incremental: nothing changed, one tensor of N changed (in place, and through a numpy view,
which torch's version counter does not see), vs the first checkpoint.
Cold figures drop the page cache (needs root; otherwise they are reported as warm).

Every measurement runs ``--repeat`` times (3 by default), interleaved with its reference (write,
reference write, read, reference read, ... in each round), so a burst of other work on the
machine hits both; the median and the min of each are printed, the ratio is that of the medians
(and of the mins beside it). The load average is printed before and after, and the runnable
tasks of *other* processes are sampled throughout (the load average counts the bench's own
threads too). The run is called quiet only if the load average before it and the others' mean
runnable tasks during it both stay below 1.5; otherwise the summary says the figures are from a
loaded machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jupyter_pause.checkpoint import WriteCache, load_or_create_key, open_store, read, write

GiB = 1 << 30
QUIET_LOAD = 1.5
RESULTS: list[tuple[str, float, str, float, str]] = []


def exit_on_sigterm() -> None:
    """A SIGTERM (``timeout``, a CI job stopped) ends the bench through its ``finally`` blocks,
    so the gigabytes it wrote under /var/tmp and the kernels it started do not stay behind."""

    def stop(signum: int, _frame: object) -> None:
        # a second signal (a CI cancel sends SIGINT, then SIGTERM) must not cut the clean-up
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


class Load:
    """The load average before and after, and the runnable tasks of other processes sampled
    every 0.2 s (``procs_running`` of /proc/stat less this process's running threads)."""

    def __init__(self) -> None:
        self.before = os.getloadavg()
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    @staticmethod
    def _others() -> int:
        with open("/proc/stat") as f:
            running = next(int(x.split()[1]) for x in f if x.startswith("procs_running"))
        mine = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    mine += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except OSError:
                pass
        return max(0, running - mine)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.samples.append(self._others())

    def stop(self) -> tuple[bool, str]:
        self._stop.set()
        self._t.join()
        after = os.getloadavg()
        others = statistics.mean(self.samples) if self.samples else 0.0
        quiet = self.before[0] < QUIET_LOAD and others < QUIET_LOAD
        text = (f"load average before {self.before[0]:.2f} {self.before[1]:.2f} "
                f"{self.before[2]:.2f}, after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f} "
                f"(the bench's own threads included); other processes' runnable tasks: mean "
                f"{others:.2f}, max {max(self.samples, default=0)}")
        return quiet, text


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """Samples VmRSS every 5 ms from a thread."""

    def __enter__(self) -> PeakRSS:
        self.base = rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())

    @property
    def extra(self) -> int:
        return self.peak - self.base


def figure(name: str, values: list[float], ref_name: str, refs: list[float], bar: str,
           unit: str = "s") -> None:
    """One line: median [min] of the measurement and of its reference, the ratio of the medians
    (and of the mins)."""
    v, r = statistics.median(values), statistics.median(refs)
    ratio = v / r if r else float("nan")
    rmin = min(values) / min(refs) if min(refs) else float("nan")
    RESULTS.append((name, v, ref_name, r, bar))
    print(
        f"  {name}: {v:.3f} {unit} [min {min(values):.3f}, n={len(values)}] | reference "
        f"{ref_name}: {r:.3f} {unit} [min {min(refs):.3f}, n={len(refs)}] | ratio {ratio:.3f} "
        f"(mins {rmin:.3f}; bar {bar})",
        flush=True,
    )


def raw_write(path: str, tensors: list) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.writelines(memoryview(t.numpy()).cast("B") for t in tensors)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def direct_write(path: str, tensors: list, bounce: int = 64 << 20) -> float:
    """The device limit: the same bytes written with O_DIRECT through one page-aligned bounce
    buffer by one thread (copy, write, repeat), then fsync; the unaligned tail padded and cut
    back with ftruncate."""
    import mmap

    buf = mmap.mmap(-1, bounce, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mv = memoryview(buf)
    mv[:] = b"\0" * bounce  # fault the buffer in before the clock starts
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    try:
        off = fill = size = 0

        def flush(n: int) -> None:
            nonlocal off
            done = 0
            while done < n:
                done += os.pwrite(fd, mv[done:n], off + done)
            off += n

        for t in tensors:
            src = memoryview(t.numpy()).cast("B")
            pos = 0
            while pos < len(src):
                k = min(len(src) - pos, bounce - fill)
                mv[fill : fill + k] = src[pos : pos + k]
                fill, pos, size = fill + k, pos + k, size + k
                if fill == bounce:
                    flush(fill)
                    fill = 0
        if fill:
            flush(fill + (-fill % 4096))
            os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    took = time.perf_counter() - t0
    mv.release()
    buf.close()
    return took


def cold_read(path: str) -> float:
    buf = bytearray(16 << 20)
    mv = memoryview(buf)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(mv):
            pass
    return time.perf_counter() - t0


def direct_read(path: str, piece: int = 32 << 20, depth: int = 4) -> float:
    """The device's read limit: the file read with O_DIRECT, ``depth`` requests in flight, into
    reused aligned buffers (no page faults, no hashing)."""
    import concurrent.futures as cf
    import mmap
    import queue

    free: queue.Queue = queue.Queue()
    maps = [mmap.mmap(-1, piece, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) for _ in range(depth)]
    for m in maps:
        m.write(b"\0" * piece)  # faulted in before the clock starts
        free.put(memoryview(m))

    def one(fd: int, off: int) -> int:
        mv = free.get()
        try:
            return os.preadv(fd, [mv], off)
        finally:
            free.put(mv)

    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        with cf.ThreadPoolExecutor(depth) as pool:
            t0 = time.perf_counter()
            list(pool.map(lambda off: one(fd, off), range(0, size, piece)))
            took = time.perf_counter() - t0
    finally:
        os.close(fd)
    while not free.empty():
        free.get().release()
    for m in maps:
        m.close()
    return took


def make_state(total_bytes: int, n: int):
    import torch

    per = max(1024, total_bytes // n // 4)
    torch.manual_seed(0)
    return {f"layers.{i}.weight": torch.empty(per).uniform_(-1, 1) for i in range(n)}


def section_model(args, root: str, key: bytes) -> None:
    import torch

    total = int(args.model_gib * GiB)
    print(f"\n(1) model state: {args.tensors} fp32 tensors, {total / GiB:.2f} GiB", flush=True)
    state = make_state(total, args.tensors)
    nbytes = sum(t.numel() * 4 for t in state.values())
    tensors = list(state.values())
    raw_path = os.path.join(root, "raw.bin")
    raws, directs, ckpts, peaks = [], [], [], []
    store = cache = first = None

    def references(tensors: list) -> None:
        for path in (raw_path, raw_path + ".direct"):
            if os.path.exists(path):
                os.unlink(path)
        os.sync()
        directs.append(direct_write(raw_path + ".direct", tensors))
        os.unlink(raw_path + ".direct")
        os.sync()
        if args.buffered:
            raws.append(raw_write(raw_path, tensors))
            os.unlink(raw_path)
            os.sync()

    def checkpoint(r: int, state: dict) -> None:
        nonlocal store, cache, first
        old = store
        store = open_store(os.path.join(root, f"model{r}"))
        cache = WriteCache()
        gc.collect()
        with PeakRSS() as peak:
            t0 = time.perf_counter()
            first = write({"state": state}, store, key=key, cache=cache, keep=None)
            ckpts.append(time.perf_counter() - t0)
        peaks.append(peak.extra)
        if old is not None:  # the previous 4 GiB go after, as the reference's file does
            shutil.rmtree(old.root, ignore_errors=True)
            os.sync()

    # Interleaved, and the order alternates: on the test machine's disk a large write right
    # after another one runs up to 15% slower, whichever it is. Each measured write follows a
    # sync after the previous write's bytes were deleted.
    for r in range(args.repeat):
        if r % 2 == 0:
            references(tensors)
            checkpoint(r, state)
        else:
            checkpoint(r, state)
            references(tensors)
    figure("checkpoint with fsync", ckpts, "O_DIRECT write+fsync of the same bytes (device limit)",
           directs, "<= 1.1x")
    ckpt_s, direct_s = statistics.median(ckpts), statistics.median(directs)
    if raws:
        figure("checkpoint with fsync", ckpts, "buffered write+fsync of the same bytes", raws,
               "<= 1.1x")
    print(f"    ({nbytes / ckpt_s / 1e9:.2f} GB/s vs {nbytes / direct_s / 1e9:.2f} GB/s O_DIRECT, "
          f"medians)")
    peak = max(peaks)
    RESULTS.append(("peak extra RSS", peak, "state size", nbytes, "<= 5%"))
    print(
        f"  peak extra RSS during checkpoint: {peak / 2**20:.1f} MiB | reference state size: "
        f"{nbytes / 2**20:.1f} MiB | ratio {peak / nbytes:.4f} (bar <= 0.05)",
        flush=True,
    )

    # (3) incremental, on the same state and the last store; each change on another tensor
    same, inplace, viewed = [], [], []
    for r in range(args.repeat):
        t0 = time.perf_counter()
        r2 = write({"state": state}, store, key=key, cache=cache, keep=None)
        same.append(time.perf_counter() - t0)
        with torch.no_grad():
            tensors[len(tensors) // 2 + r].add_(1.0)
        t0 = time.perf_counter()
        r3 = write({"state": state}, store, key=key, cache=cache, keep=None)
        inplace.append(time.perf_counter() - t0)
        # a change torch's version counter does not see: found by content all the same
        changed = tensors[len(tensors) // 3 + r]
        changed.numpy()[0] += 1.0
        t0 = time.perf_counter()
        r4 = write({"state": state}, store, key=key, cache=cache, keep=None)
        viewed.append(time.perf_counter() - t0)
        assert r4.bytes_written >= changed.nbytes, "a change was missed"
    print(f"\n(3) incremental ({args.tensors} tensors)")
    figure("2nd checkpoint, nothing changed", same, "first checkpoint", ckpts, "<= 0.05x")
    print(f"    (bytes written {r2.bytes_written} of {r2.bytes_total})")
    figure(f"checkpoint, 1 tensor of {args.tensors} changed", inplace, "first checkpoint", ckpts,
           "<= 0.10x")
    print(f"    (bytes written {r3.bytes_written} of {r3.bytes_total})", flush=True)
    figure(f"checkpoint, 1 tensor of {args.tensors} changed through a numpy view", viewed,
           "first checkpoint", ckpts, "<= 0.10x")
    print(f"    (bytes written {r4.bytes_written} of {r4.bytes_total})", flush=True)

    # restore, cold, all pages touched, interleaved with a cold sequential read of the same
    # bytes (buffered, one stream: what `cat` does) and the device's read limit
    direct_write(raw_path, tensors)
    cold = True
    reads, dreads, restores = [], [], []
    for _ in range(args.repeat):
        cold = drop_caches() and cold
        reads.append(cold_read(raw_path))
        drop_caches()
        dreads.append(direct_read(raw_path))
        drop_caches()
        t0 = time.perf_counter()
        rr = read(store, key=key, checkpoint_id=first.checkpoint_id)
        acc = 0.0
        for t in rr.values["state"].values():
            acc += float(t.view(-1)[::1024].sum())  # one float per 4 KiB page
        restores.append(time.perf_counter() - t0)
        del rr
        gc.collect()
    print(f"\n(1) restore ({'cold' if cold else 'WARM: could not drop caches'})")
    figure("restore, all pages touched", restores, "sequential read of the same bytes", reads,
           "<= 1.1x")
    figure("restore, all pages touched", restores,
           "O_DIRECT read of the same bytes, 4 in flight (device limit)", dreads, "none")
    med = statistics.median(restores)
    print(
        f"    ({nbytes / med / 1e9:.2f} GB/s vs {nbytes / statistics.median(reads) / 1e9:.2f} "
        f"GB/s read, {nbytes / statistics.median(dreads) / 1e9:.2f} GB/s O_DIRECT read; "
        f"restores {', '.join(f'{x:.2f}' for x in restores)} s)",
        flush=True,
    )
    os.unlink(raw_path)
    del state, tensors, cache
    gc.collect()


class Notebook:  # stands in for a class defined in a notebook (__main__)
    def __init__(self, n: int) -> None:
        self.n = n


def section_mixed(args, root: str, key: bytes) -> None:
    import dill
    import numpy as np
    import pandas as pd

    print(
        f"\n(2) mixed namespace: DataFrame {args.df_rows:.0e} rows, ndarray "
        f"{args.array_gib} GiB, {args.dicts:.0e} small dicts, lambda, closure, class",
        flush=True,
    )
    n = int(args.df_rows)
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "i": np.arange(n, dtype=np.int64),
            "f": rng.normal(size=n),
            "g": rng.normal(size=n).astype(np.float32),
            "t": pd.date_range("2020-01-01", periods=n, freq="s"),
            "c": pd.Categorical(rng.choice(["a", "b", "c", "d"], size=n)),
        }
    )
    arr = rng.random(int(args.array_gib * GiB) // 4, dtype=np.float32)
    dicts = {i: {"id": i, "score": i * 0.5, "name": f"n{i}"} for i in range(int(args.dicts))}
    k = 3

    def closure(x):
        return x + k

    ns = {
        "df": df,
        "arr": arr,
        "dicts": dicts,
        "square": lambda x: x * x,
        "closure": closure,
        "obj": Notebook(5),
    }
    main = sys.modules["__main__"]
    saved = dict(main.__dict__)
    bench_names = set(saved)
    main.__dict__.update(ns)
    dills, ourss = [], []
    try:
        for r in range(args.repeat):  # interleaved: dill, then ours, in each round
            path = os.path.join(root, "session.pkl")
            os.sync()
            t0 = time.perf_counter()
            dill.dump_module(path, module=main)
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            dills.append(time.perf_counter() - t0)
            os.unlink(path)
            sdir = os.path.join(root, f"mixed{r}")
            shutil.rmtree(os.path.join(root, f"mixed{r - 1}"), ignore_errors=True)
            store = open_store(sdir)
            os.sync()
            gc.collect()
            t0 = time.perf_counter()
            res = write(main.__dict__, store, key=key, exclude=bench_names, keep=None)
            ourss.append(time.perf_counter() - t0)
    finally:
        for name in ns:
            main.__dict__.pop(name, None)
    bad = [v.name for v in res.variables if v.status != "saved"]
    figure(
        "checkpoint of the mixed namespace (with fsync)",
        ourss,
        "dill.dump_module + fsync",
        dills,
        ">= 10x faster, i.e. ratio <= 0.1",
    )
    worst = max(ourss[i] / dills[i] for i in range(len(ourss)))
    print(f"    ({statistics.median(dills) / statistics.median(ourss):.1f}x faster (medians), "
          f"{1 / worst:.1f}x in the worst round; {res.bytes_total / GiB:.2f} GiB; "
          f"not saved: {bad})")
    drop_caches()
    t0 = time.perf_counter()
    rr = read(store, key=key)
    rt = time.perf_counter() - t0
    ok = rr.values["dicts"][7]["name"] == "n7" and rr.values["square"](3) == 9
    print(f"  restore of the mixed namespace (cold): {rt:.3f} s, values ok: {ok}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--model-gib", type=float, default=None)
    ap.add_argument("--tensors", type=int, default=150)
    ap.add_argument("--df-rows", type=float, default=None)
    ap.add_argument("--array-gib", type=float, default=None)
    ap.add_argument("--dicts", type=float, default=None)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir on disk)")
    ap.add_argument("--sections", default="model,mixed")
    ap.add_argument("--buffered", action="store_true",
                    help="also measure a buffered write+fsync of the same bytes (slow)")
    args = ap.parse_args()
    q = args.quick
    args.model_gib = args.model_gib or (0.25 if q else 4.0)
    args.df_rows = args.df_rows or (1e6 if q else 1e7)
    args.array_gib = args.array_gib or (0.1 if q else 1.0)
    args.dicts = args.dicts or (1e5 if q else 1e6)
    args.repeat = args.repeat or 3
    exit_on_sigterm()
    root = tempfile.mkdtemp(prefix="jp-bench-", dir=args.dir or "/var/tmp")
    key = load_or_create_key(os.path.join(root, "bench.key"))
    print(f"jupyter-pause checkpoint bench in {root} (quick={q}, repeat={args.repeat})")
    load = Load()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load.before)}", flush=True)
    try:
        if "model" in args.sections:
            section_model(args, root, key)
        if "mixed" in args.sections:
            section_mixed(args, root, key)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    quiet, text = load.stop()
    print(f"\nsummary (median value | median reference | ratio | bar), {text}")
    for name, v, ref_name, ref, bar in RESULTS:
        print(f"  {name}: {v:.4g} | {ref_name}: {ref:.4g} | {v / ref:.3f} | {bar}")
    if quiet:
        print(f"machine: quiet (load below {QUIET_LOAD} before and during the run)")
    else:
        print(f"machine: LOADED (load {QUIET_LOAD} or more before or during the run): these "
              "figures are from a loaded machine, not the device's limits")


if __name__ == "__main__":
    main()
