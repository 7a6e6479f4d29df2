"""Object store benchmark: checkpoint and restore of a model state to gs:// (gcp-storage-emulator)
and s3:// (moto's server), each against a plain fsspec transfer of the same bytes in the same
run, and the peak extra memory of the checkpoint process against the configured bound.

    python bench/bench_objectstore.py                 # 4 GiB state, bound 256 MiB, both stores
    python bench/bench_objectstore.py --gib 0.5 --stores gcs --memory 256M   # a quick look

The references move the very objects the checkpoint wrote (the same checkpoint written to a
local store first gives them as files), so both sides pay the emulators' per-object costs alike:
gcp-storage-emulator rewrites a whole object for every chunk of a resumable upload and reads a
whole object for every ranged GET, which makes one 4 GiB object take hours but the checkpoint's
packs (at most 128 MiB each) affordable. The emulators keep objects on disk (gcp-storage-emulator's
``--data-dir``; moto spools every object above 5 MiB to a temporary file), so 4 GiB fits beside
the state and its restored copy. The emulators run on this machine, so the figures are about
client-side cost (hashing, copies, parts in flight), not a network.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_checkpoint import PeakRSS, make_state

from jupyter_pause.checkpoint import load_or_create_key, open_store, read, write
from jupyter_pause.checkpoint.objectstore import PACK_MAX, parse_size, part_size
from jupyter_pause.checkpoint.objectstore import kind as objectstore_kind
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


def blob_sizes(store) -> dict[str, tuple[str, int]]:
    """digest -> (path, size) of every blob in ``store``."""
    return {d: (p, store.size(p)) for d, p in store.blob_files()}


def bench_store(kind: str, args: argparse.Namespace, key: bytes, state: dict,
                local: dict[str, tuple[str, int]], root: str) -> None:
    bound = parse_size(args.memory)
    nbytes = sum(size for _, size in local.values())
    print(f"\n[{kind}] {'gcp-storage-emulator' if kind == 'gcs' else 'moto_server'}, "
          f"{len(local)} blobs, {nbytes / GiB:.2f} GiB, bound {bound >> 20} MiB", flush=True)
    data_dir = tempfile.mkdtemp(prefix=f"{kind}-", dir=root)
    srv = emulators.start(kind, data_dir=data_dir)
    try:
        fs = srv.fs()
        store = open_store(srv.url(), storage_options=srv.options(), memory=bound)
        write({"warm": 1}, store, key=key, keep=None)  # the HTTP client's one-time set-up
        with PeakRSS() as peak:
            t0 = time.perf_counter()
            res = write({"state": state}, store, key=key, keep=None)
            ckpt_s = time.perf_counter() - t0
        remote = blob_sizes(store)
        # content addressing: the checkpoint wrote exactly the objects of the local store
        assert remote.keys() == local.keys(), "the two stores hold different blobs"

        # reference: fsspec's own concurrent upload of the same objects from local files
        # (page cache warm), one object per blob, as the checkpoint wrote them
        digests = sorted(local)
        plain = [f"{srv.bucket}/plain/{d}" for d in digests]
        t0 = time.perf_counter()
        fs.put([local[d][0] for d in digests], plain)
        put_s = time.perf_counter() - t0
        fs.rm(plain)
        # and in parts of the checkpoint's size: the emulators' per-request costs alike
        part = part_size(objectstore_kind(fs), bound)
        t0 = time.perf_counter()
        fs.put([local[d][0] for d in digests], plain, chunksize=part)
        put_part_s = time.perf_counter() - t0
        fs.rm(plain)
        line("checkpoint", ckpt_s, "fsspec put of the same objects", put_s, "<= 1.25x")
        line("checkpoint", ckpt_s, f"the same put in {part >> 20} MiB parts", put_part_s,
             "<= 1.25x")
        hash_s = naming_pass(state)
        print(f"    (naming pass, blake3 of the bytes in place: {hash_s:.3f} s = "
              f"{100 * hash_s / ckpt_s:.1f}% of the checkpoint)", flush=True)
        print(f"    ({nbytes / ckpt_s / 1e9:.2f} GB/s vs {nbytes / put_s / 1e9:.2f} GB/s; "
              f"emulator RSS {server_rss(srv) / GiB:.2f} GiB)", flush=True)
        line("peak extra RSS, checkpoint", peak.extra / 2**20, "configured bound", bound / 2**20,
             "<= 1.0x", unit="MiB")
        print(f"    (parts charged at most {store.budget.peak / 2**20:.1f} MiB)", flush=True)

        # reference: fsspec's concurrent download of the same objects into memory
        gc.collect()
        t0 = time.perf_counter()
        got = fs.cat([remote[d][0] for d in digests])
        cat_s = time.perf_counter() - t0
        total = sum(len(v) for v in got.values())
        assert total == nbytes, (
            f"fsspec cat of the checkpoint's objects gave {total} of {nbytes} bytes: lengths "
            f"{sorted(len(v) for v in got.values())} against "
            f"{sorted(remote[d][1] for d in digests)}, {len(got)} of {len(digests)} objects")
        del got
        gc.collect()
        # and by ranges of the restore's part size (gcp-storage-emulator reads a whole object
        # for every ranged GET, so this is what the emulator charges a bounded-memory reader)
        paths, starts, ends = [], [], []
        for d in digests:
            path, size = remote[d]
            for a in range(0, size, part):
                paths.append(path)
                starts.append(a)
                ends.append(min(size, a + part))
        t0 = time.perf_counter()
        got = fs.cat_ranges(paths, starts, ends)
        ranges_s = time.perf_counter() - t0
        assert sum(len(v) for v in got) == nbytes
        del got
        gc.collect()

        reader = open_store(srv.url(), storage_options=srv.options(), memory=bound)
        warm = next(m.id for m in store.list(key=key) if m.id != res.checkpoint_id)
        read(reader, key=key, checkpoint_id=warm)  # the HTTP client's set-up
        gc.collect()
        with PeakRSS() as peak:
            t0 = time.perf_counter()
            rr = read(reader, key=key, checkpoint_id=res.checkpoint_id)
            acc = 0.0
            for t in rr.values["state"].values():
                acc += float(t.view(-1)[::1024].sum())  # one float per 4 KiB page
            rest_s = time.perf_counter() - t0
        line("restore, all pages touched", rest_s, "fsspec cat of the same objects", cat_s,
             "<= 1.25x")
        line("restore, all pages touched", rest_s, f"the same cat by {part >> 20} MiB ranges",
             ranges_s, "<= 1.25x")
        # the restored state itself is the restore's output, not its overhead
        restored = sum(t.numel() * 4 for t in rr.values["state"].values())
        line("peak extra RSS beyond the restored state", max(0, peak.extra - restored) / 2**20,
             "configured bound", bound / 2**20, "<= 1.0x", unit="MiB")
        del rr
        gc.collect()
    finally:
        srv.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="state size (default 4)")
    ap.add_argument("--tensors", type=int, default=150)
    ap.add_argument("--memory", default="256M", help="the store's memory bound")
    ap.add_argument("--stores", default="gcs,s3")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="jp-bench-os-", dir="/var/tmp")
    try:
        key = load_or_create_key(os.path.join(root, "bench.key"))
        state = make_state(int(args.gib * GiB), args.tensors)
        # the same checkpoint in a local store: its blob files are the references' objects
        local_store = open_store(os.path.join(root, "local"))
        local_store.pack_max = PACK_MAX  # packs cut as an object store's are
        write({"warm": 1}, local_store, key=key, keep=None)
        write({"state": state}, local_store, key=key, keep=None)
        local = blob_sizes(local_store)
        print(f"jupyter-pause object store bench: {args.tensors} fp32 tensors, "
              f"{sum(t.numel() * 4 for t in state.values()) / GiB:.2f} GiB in {len(local)} "
              f"blobs, bound {args.memory}; load average {os.getloadavg()[0]:.2f}", flush=True)
        for kind in args.stores.split(","):
            bench_store(kind.strip(), args, key, state, local, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
