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
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jupyter_pause.checkpoint import WriteCache, load_or_create_key, open_store, read, write

GiB = 1 << 30
RESULTS: list[tuple[str, float, str, float, str]] = []


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

    def __enter__(self) -> PeakRSS:  # noqa: PYI034
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


def figure(name: str, value: float, ref_name: str, ref: float, bar: str, unit: str = "s") -> None:
    ratio = value / ref if ref else float("nan")
    RESULTS.append((name, value, ref_name, ref, bar))
    print(
        f"  {name}: {value:.3f} {unit} | reference {ref_name}: {ref:.3f} {unit} | "
        f"ratio {ratio:.3f} (bar {bar})",
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
    raws, directs, ckpts, peaks, firsts = [], [], [], [], []
    store = None
    for r in range(args.repeat):
        for path in (raw_path, raw_path + ".direct"):
            if os.path.exists(path):
                os.unlink(path)
        os.sync()
        directs.append(direct_write(raw_path + ".direct", tensors))
        os.unlink(raw_path + ".direct")
        os.sync()
        raws.append(raw_write(raw_path, tensors))
        sdir = os.path.join(root, f"model{r}")
        shutil.rmtree(sdir, ignore_errors=True)
        store = open_store(sdir)
        os.sync()
        cache = WriteCache()
        gc.collect()
        with PeakRSS() as peak:
            t0 = time.perf_counter()
            res = write({"state": state}, store, key=key, cache=cache, keep=None)
            ckpts.append(time.perf_counter() - t0)
        peaks.append(peak.extra)
        firsts.append((cache, res))
    raw_s, ckpt_s = statistics.median(raws), statistics.median(ckpts)
    direct_s = statistics.median(directs)
    figure("checkpoint with fsync", ckpt_s, "O_DIRECT write+fsync of the same bytes (device limit)",
           direct_s, "<= 1.25x")
    figure("checkpoint with fsync", ckpt_s, "buffered write+fsync of the same bytes", raw_s,
           "<= 1.1x")
    print(f"    ({nbytes / ckpt_s / 1e9:.2f} GB/s vs {nbytes / direct_s / 1e9:.2f} GB/s O_DIRECT, "
          f"{nbytes / raw_s / 1e9:.2f} GB/s buffered)")
    peak = max(peaks)
    RESULTS.append(("peak extra RSS", peak, "state size", nbytes, "<= 5%"))
    print(
        f"  peak extra RSS during checkpoint: {peak / 2**20:.1f} MiB | reference state size: "
        f"{nbytes / 2**20:.1f} MiB | ratio {peak / nbytes:.4f} (bar <= 0.05)",
        flush=True,
    )

    # (3) incremental, on the same state and the last store
    cache, first = firsts[-1]
    t1 = ckpts[-1]
    t0 = time.perf_counter()
    r2 = write({"state": state}, store, key=key, cache=cache, keep=None)
    t2 = time.perf_counter() - t0
    with torch.no_grad():
        tensors[len(tensors) // 2].add_(1.0)
    t0 = time.perf_counter()
    r3 = write({"state": state}, store, key=key, cache=cache, keep=None)
    t3 = time.perf_counter() - t0
    print(f"\n(3) incremental ({args.tensors} tensors)")
    figure("2nd checkpoint, nothing changed", t2, "first checkpoint", t1, "<= 0.05x")
    print(f"    (bytes written {r2.bytes_written} of {r2.bytes_total})")
    figure(
        f"checkpoint, 1 tensor of {args.tensors} changed", t3, "first checkpoint", t1, "<= 0.10x"
    )
    print(f"    (bytes written {r3.bytes_written} of {r3.bytes_total})", flush=True)
    # a change torch's version counter does not see: found by content all the same
    tensors[len(tensors) // 3].numpy()[0] += 1.0
    t0 = time.perf_counter()
    r4 = write({"state": state}, store, key=key, cache=cache, keep=None)
    t4 = time.perf_counter() - t0
    figure(
        f"checkpoint, 1 tensor of {args.tensors} changed through a numpy view", t4,
        "first checkpoint", t1, "<= 0.10x"
    )
    print(f"    (bytes written {r4.bytes_written} of {r4.bytes_total})", flush=True)
    assert r4.bytes_written >= tensors[len(tensors) // 3].nbytes, "a change was missed"

    # restore, cold, all pages touched, vs a cold sequential read of the same bytes
    cold = drop_caches()
    cr = cold_read(raw_path)
    restores = []
    for _ in range(args.repeat):
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
    figure(
        "restore, all pages touched",
        statistics.median(restores),
        "sequential read of the same bytes",
        cr,
        "<= 1.2x",
    )
    print(
        f"    ({nbytes / statistics.median(restores) / 1e9:.2f} GB/s vs "
        f"{nbytes / cr / 1e9:.2f} GB/s read)",
        flush=True,
    )
    os.unlink(raw_path)
    del state, tensors, firsts, cache
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
    try:
        path = os.path.join(root, "session.pkl")
        os.sync()
        t0 = time.perf_counter()
        dill.dump_module(path, module=main)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        dill_s = time.perf_counter() - t0
        os.unlink(path)
        sdir = os.path.join(root, "mixed")
        shutil.rmtree(sdir, ignore_errors=True)
        store = open_store(sdir)
        os.sync()
        t0 = time.perf_counter()
        res = write(main.__dict__, store, key=key, exclude=bench_names, keep=None)
        ours = time.perf_counter() - t0
    finally:
        for name in ns:
            main.__dict__.pop(name, None)
    bad = [v.name for v in res.variables if v.status != "saved"]
    figure(
        "checkpoint of the mixed namespace (with fsync)",
        ours,
        "dill.dump_module + fsync",
        dill_s,
        ">= 10x faster, i.e. ratio <= 0.1",
    )
    print(f"    ({dill_s / ours:.1f}x faster; {res.bytes_total / GiB:.2f} GiB; not saved: {bad})")
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
    args = ap.parse_args()
    q = args.quick
    args.model_gib = args.model_gib or (0.25 if q else 4.0)
    args.df_rows = args.df_rows or (1e6 if q else 1e7)
    args.array_gib = args.array_gib or (0.1 if q else 1.0)
    args.dicts = args.dicts or (1e5 if q else 1e6)
    args.repeat = args.repeat or (3 if q else 1)
    root = tempfile.mkdtemp(prefix="jp-bench-", dir=args.dir or "/var/tmp")
    key = load_or_create_key(os.path.join(root, "bench.key"))
    print(f"jupyter-pause checkpoint bench in {root} (quick={q}, repeat={args.repeat})")
    try:
        if "model" in args.sections:
            section_model(args, root, key)
        if "mixed" in args.sections:
            section_mixed(args, root, key)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\nsummary (value | reference | ratio | bar)")
    for name, v, ref_name, ref, bar in RESULTS:
        print(f"  {name}: {v:.4g} | {ref_name}: {ref:.4g} | {v / ref:.3f} | {bar}")


if __name__ == "__main__":
    main()
