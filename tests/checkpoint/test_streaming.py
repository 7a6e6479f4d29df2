"""Serialization hands the GIL to the blob writers, and streams large in-band payloads intact.

The checkpoint overlaps its disk writes (writer threads) with pickling and the co-variable walk
(the calling thread). Both are long runs of C code over millions of small objects; if they never
let go of the GIL, the writers stall and the disk idles until pickling is done.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from itertools import pairwise

import numpy as np
import pytest

from jupyter_pause.checkpoint import open_store, read, write
from jupyter_pause.checkpoint.graph import _BATCH, group_variables
from jupyter_pause.checkpoint.pickling import dump_group

from .helpers import fs_type


def _longest_stall(fn) -> tuple[float, float]:
    """Run fn while a pure-Python thread ticks; return (fn's duration, the longest time inside it
    during which that thread could not run)."""
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())

    t = threading.Thread(target=tick, daemon=True)
    t.start()
    while not ticks:
        time.sleep(0.001)
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    stop.set()
    t.join()
    inside = [t0] + [x for x in ticks if t0 < x < t1] + [t1]
    return t1 - t0, max(b - a for a, b in pairwise(inside))


def _many_small_dicts(n: int) -> dict:
    return {i: {"id": i, "score": i * 0.5, "name": f"n{i}"} for i in range(n)}


def test_pickling_many_small_objects_lets_other_threads_run():
    values = {"d": _many_small_dicts(300_000)}
    took, stall = _longest_stall(lambda: dump_group(values))
    assert took > 0.1, "too small to show anything; grow the graph"
    assert stall < took / 3, f"pickling held the GIL for {stall:.3f} s of {took:.3f} s"


def test_grouping_walk_in_slices_still_finds_every_shared_object():
    # the walk looks at referents in slices (so the writers get the GIL between them): sharing
    # must still be found when the shared object sits in a late slice of a level
    n = 3 * _BATCH + 17
    lists = [[i] for i in range(n)]
    dicts = [{"a": i} for i in range(n)]  # untracked leaves
    items = [
        ("lists", lists),
        ("alone", [[i] for i in range(n)]),
        ("dicts", dicts),
        ("tail", {"x": lists[-1]}),
        ("pick", [[dicts[n - 5]]]),
    ]
    walk = group_variables(items)
    assert sorted(map(sorted, walk.groups)) == [["alone"], ["dicts", "pick"], ["lists", "tail"]]


def test_in_band_payloads_larger_than_a_pickle_frame(store, key):
    # below the out-of-band threshold but above pickle's 64 KiB frame: the pickler hands these
    # to the stream's write() as the objects themselves (bytearray, PickleBuffer, bytes)
    rng = np.random.default_rng(1)
    arr = rng.random(40_000)  # 320 KiB, in band
    ro = rng.random(30_000)
    ro.flags.writeable = False
    ns = {
        "arr": arr,
        "ro": ro,
        "ba": bytearray(rng.bytes(300_000)),
        "by": rng.bytes(500_000),
        "mixed": [arr, {"k": bytearray(b"x" * 100_000)}],
    }
    res = write(ns, store, key=key)
    assert all(v.status == "saved" for v in res.variables)
    out = read(store, key=key).values
    np.testing.assert_array_equal(out["arr"], arr)
    np.testing.assert_array_equal(out["ro"], ro)
    assert out["ba"] == ns["ba"] and type(out["ba"]) is bytearray
    assert out["by"] == ns["by"]
    assert out["mixed"][0] is out["arr"]  # one group: the list shares the array
    assert out["mixed"][1]["k"] == bytearray(b"x" * 100_000)


def _resident_fraction(path) -> float:
    """Share of a file's pages in the page cache (mincore on a mapping that touches none)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        try:
            addr = ctypes.c_char.from_buffer(mm)
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(ctypes.addressof(addr), size, vec) == 0, ctypes.get_errno()
            del addr
            return sum(b & 1 for b in vec.raw) / pages
        finally:
            mm.close()



@pytest.fixture
def disk_store(key):
    """A store on a disk-backed file system (/var/tmp; /tmp may be a tmpfs, which has no page
    cache of its own to drop)."""
    root = tempfile.mkdtemp(prefix="jp-test-", dir="/var/tmp")
    if fs_type(root) in ("tmpfs", "ramfs"):
        shutil.rmtree(root)
        pytest.skip("/var/tmp is a tmpfs here")
    yield open_store(os.path.join(root, "store"))
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-cache hints are Linux's")
def test_written_blobs_leave_the_page_cache(disk_store, key):
    # once durable, a checkpoint's pages are dropped: gigabytes of page cache would otherwise stay
    # charged to the notebook's memory (and to a pod snapshot of it)
    store = disk_store
    arr = np.random.default_rng(2).random(4 << 20)  # 32 MiB, out of band into its own blob
    res = write({"arr": arr}, store, key=key)
    big = [d for d, b in res.manifest.blobs.items() if b["size"] >= arr.nbytes]
    assert len(big) == 1
    assert _resident_fraction(store.blob_path(big[0])) < 0.25
    np.testing.assert_array_equal(read(store, key=key).values["arr"], arr)
