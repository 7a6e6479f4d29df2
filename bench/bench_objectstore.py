"""Object store benchmark: checkpoint and restore of a model state to gs:// (gcp-storage-emulator)
and s3:// (moto's server), each against a plain fsspec transfer of the same bytes in the same
run, and the peak extra memory of the checkpoint process against the configured bound.

    python bench/bench_objectstore.py                 # 0.5 GiB state, bound 256 MiB, both stores
    python bench/bench_objectstore.py --gib 4 --stores gcs --memory 256M

The default state is 0.5 GiB, not 4: both emulators keep every object in RAM, several times
over (moto held 1.3 GiB for one 300 MiB object), and the bench also holds the state and its
restored copy. Pass --gib 4 on a machine with room for it. The emulators run on this machine,
so the figures are about client-side cost (hashing, copies, parts in flight), not a network.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_checkpoint import PeakRSS, make_state

from jupyter_pause.checkpoint import load_or_create_key, open_store, read, write
from jupyter_pause.checkpoint.objectstore import parse_size
from tests.checkpoint import emulators

GiB = 1 << 30


def line(name: str, value: float, ref_name: str, ref: float, bar: str, unit: str = "s") -> None:
    ratio = value / ref if ref else float("nan")
    print(f"  {name}: {value:.3f} {unit} | reference {ref_name}: {ref:.3f} {unit} | "
          f"ratio {ratio:.3f} (bar {bar})", flush=True)


def server_rss(srv: emulators.Server) -> int:
    import psutil

    try:
        p = psutil.Process(srv.proc.pid)
        return sum(c.memory_info().rss for c in [p, *p.children(recursive=True)])
    except psutil.Error:
        return 0


def naming_pass(state: dict) -> float:
    """What naming blobs before their upload costs: one blake3 pass over the bytes in memory."""
    from jupyter_pause.checkpoint.store import blob_hasher

    t0 = time.perf_counter()
    h = blob_hasher()
    for t in state.values():
        h.update(memoryview(t.numpy()).cast("B"))
    h.hexdigest()
    return time.perf_counter() - t0


def bench_store(kind: str, args: argparse.Namespace, key: bytes, state: dict, raw_path: str,
                nbytes: int) -> None:
    bound = parse_size(args.memory)
    print(f"\n[{kind}] {'gcp-storage-emulator' if kind == 'gcs' else 'moto_server'}, "
          f"state {nbytes / GiB:.2f} GiB, bound {bound >> 20} MiB", flush=True)
    srv = emulators.start(kind)
    try:
        fs = srv.fs()
        # reference: fsspec's own upload of a local file holding the same bytes (page cache warm)
        t0 = time.perf_counter()
        fs.put_file(raw_path, f"{srv.bucket}/plain.bin")
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        data = fs.cat_file(f"{srv.bucket}/plain.bin")
        cat_s = time.perf_counter() - t0
        assert len(data) == nbytes
        del data
        fs.rm_file(f"{srv.bucket}/plain.bin")
        gc.collect()

        store = open_store(srv.url(), storage_options=srv.options(), memory=bound)
        write({"warm": 1}, store, key=key, keep=None)  # the HTTP client's one-time set-up
        with PeakRSS() as peak:
            t0 = time.perf_counter()
            res = write({"state": state}, store, key=key, keep=None)
            ckpt_s = time.perf_counter() - t0
        line("checkpoint", ckpt_s, "fsspec put_file of the same bytes", put_s, "<= 1.25x")
        hash_s = naming_pass(state)
        print(f"    (naming pass, blake3 of the bytes in place: {hash_s:.3f} s = "
              f"{100 * hash_s / ckpt_s:.1f}% of the checkpoint)", flush=True)
        print(f"    ({nbytes / ckpt_s / 1e9:.2f} GB/s vs {nbytes / put_s / 1e9:.2f} GB/s; "
              f"emulator RSS {server_rss(srv) / GiB:.2f} GiB)", flush=True)
        line("peak extra RSS, checkpoint", peak.extra / 2**20, "configured bound", bound / 2**20,
             "<= 1.0x", unit="MiB")
        print(f"    (parts charged at most {store.budget.peak / 2**20:.1f} MiB)", flush=True)

        reader = open_store(srv.url(), storage_options=srv.options(), memory=bound)
        read(reader, key=key, checkpoint_id=store.list(key=key)[-1].id)  # client set-up
        gc.collect()
        with PeakRSS() as peak:
            t0 = time.perf_counter()
            rr = read(reader, key=key, checkpoint_id=res.checkpoint_id)
            acc = 0.0
            for t in rr.values["state"].values():
                acc += float(t.view(-1)[::1024].sum())  # one float per 4 KiB page
            rest_s = time.perf_counter() - t0
        line("restore, all pages touched", rest_s, "fsspec cat_file of the same bytes", cat_s,
             "<= 1.25x")
        # the restored state itself is the restore's output, not its overhead
        extra = peak.extra - nbytes
        line("peak extra RSS beyond the restored state", max(0, extra) / 2**20,
             "configured bound", bound / 2**20, "<= 1.0x", unit="MiB")
        del rr
        gc.collect()
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=0.5, help="state size (default 0.5)")
    ap.add_argument("--tensors", type=int, default=150)
    ap.add_argument("--memory", default="256M", help="the store's memory bound")
    ap.add_argument("--stores", default="gcs,s3")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="jp-bench-os-", dir="/var/tmp")
    key = load_or_create_key(os.path.join(root, "bench.key"))
    state = make_state(int(args.gib * GiB), args.tensors)
    nbytes = sum(t.numel() * 4 for t in state.values())
    raw_path = os.path.join(root, "raw.bin")
    with open(raw_path, "wb") as f:
        f.writelines(memoryview(t.numpy()).cast("B") for t in state.values())
    print(f"jupyter-pause object store bench: {args.tensors} fp32 tensors, "
          f"{nbytes / GiB:.2f} GiB, bound {args.memory}; load average {os.getloadavg()[0]:.2f}")
    try:
        for kind in args.stores.split(","):
            bench_store(kind.strip(), args, key, state, raw_path, nbytes)
    finally:
        os.unlink(raw_path)
        os.unlink(os.path.join(root, "bench.key"))
        os.rmdir(root)


if __name__ == "__main__":
    main()
