"""Crash safety (SIGKILL at many points of a write) and a full disk (a small tmpfs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from jupyter_pause.checkpoint import StorageFullError, gc, open_store, procid, read, write
from jupyter_pause.checkpoint.collect import active_leases

from .helpers import ROOT

CHILD = """
import sys, time
import numpy as np
from jupyter_pause.checkpoint import load_or_create_key, open_store, write
use_torch = sys.argv[3] == "1"
store, key = open_store(sys.argv[1]), load_or_create_key(sys.argv[2])
ns = {"gen": 1, "arr": np.full(1000, 1.0)}
write(ns, store, key=key, keep=None)
rng = np.random.default_rng(2)
ns = {"gen": 2, "small": [{"i": i} for i in range(20000)]}
for i in range(6):
    ns[f"a{i}"] = rng.normal(size=1_200_000)  # 9.6 MB each, out of band, written O_DIRECT
if use_torch:
    import torch
    ns["model"] = torch.nn.Linear(1000, 2000)
print("START", flush=True)
write(ns, store, key=key, keep=None)
print("DONE", flush=True)
time.sleep(30)
"""


def _run_and_kill(store_dir, key_path, delay, use_torch):
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(CHILD),
            store_dir,
            key_path,
            "1" if use_torch else "0",
        ],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = p.stdout.readline()
        assert line.strip() == "START", line
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        rest = p.stdout.read()
    finally:
        p.kill()
        p.wait()
    return "DONE" in rest


@pytest.mark.parametrize("use_torch", [False, True])
def test_sigkill_during_write_never_leaves_a_lying_checkpoint(tmp_path, key, use_torch):
    key_path = str(tmp_path / "keys" / "checkpoint.key")
    delays = [0.0, 0.005, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.25, 0.4, 0.7]
    if use_torch:
        delays = [0.0, 0.15, 0.5]
    completed = 0
    for i, delay in enumerate(delays):
        d = str(tmp_path / f"s{i}")
        finished = _run_and_kill(d, key_path, delay, use_torch)
        store = open_store(d)
        ids = store.manifest_ids("default")
        assert 1 <= len(ids) <= 2
        rr = read(store, key=key)  # the newest manifest must be fully valid
        if len(ids) == 2:
            completed += 1
            assert rr.values["gen"] == 2
            rng = np.random.default_rng(2)
            for j in range(6):
                np.testing.assert_array_equal(rr.values[f"a{j}"], rng.normal(size=1_200_000))
        else:
            assert not finished
            assert rr.values["gen"] == 1
        assert read(store, key=key, checkpoint_id=ids[-1]).values["gen"] == 1
        # the killed writer's temp files and orphan blobs are collectable
        gc(store)
        assert [n for n in os.listdir(os.path.join(d, "tmp")) if n.endswith(".part")] == []
        assert read(store, key=key).values["gen"] in (1, 2)
    assert completed < len(delays), "no kill landed inside a write"


def _lease_of(store, pid, proc, cid="20260101T000000000000Z-abcdef"):
    """The lease and a temp file of a write under way in ``store``, as if written by ``pid``
    (``proc``: its identity in the lease; None: a lease from before leases had one)."""
    txn = store.begin(cid)
    info = json.loads(Path(txn.lease).read_text())
    info.update(pid=pid, proc=proc)
    if proc is None:
        del info["proc"]
    with open(txn.lease, "w") as f:
        json.dump(info, f)
    part = os.path.join(store.root, "tmp", f"{cid}-0123456789ab.part")
    with open(part, "wb") as f:
        f.write(b"half a blob")
    return txn.lease, part


def _kept(store, lease, part):
    alive = [cid for cid, _ in active_leases(store)] == ["20260101T000000000000Z-abcdef"]
    gc(store)
    assert os.path.exists(part) == alive and os.path.exists(lease) == alive
    return alive


@pytest.mark.skipif(procid.identity() is None, reason="needs Linux's /proc")
def test_a_lease_keeps_temp_files_only_while_its_writer_runs(tmp_path):
    me = procid.identity()
    # The writer killed but not yet reaped (a zombie: a server's SIGKILLed kernels stay so until
    # init reaps them, 1-2 s on some hosts): its write is dead, gc takes its temp files.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ident = procid.identity(child.pid)
        store = open_store(str(tmp_path / "zombie"))
        lease, part = _lease_of(store, child.pid, ident)
        assert [cid for cid, _ in active_leases(store)] == ["20260101T000000000000Z-abcdef"]
        old_store = open_store(str(tmp_path / "zombie-old-lease"))
        old = _lease_of(old_store, child.pid, None)
        child.kill()
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.01)
        assert not _kept(store, lease, part)
        assert not _kept(old_store, *old)
    finally:
        child.kill()
        child.wait()
    # The same pid given to a later process (a container restarted under the same host name
    # numbers its processes anew): the start time tells them apart.
    store = open_store(str(tmp_path / "reused"))
    assert not _kept(store, *_lease_of(store, os.getpid(), dict(me, start=me["start"] - 100)))
    # The writer itself, running: kept, with or without its identity in the lease.
    for name, ident in (("live", me), ("old-lease", None)):
        store = open_store(str(tmp_path / name))
        assert _kept(store, *_lease_of(store, os.getpid(), ident))
    # A writer in another pid namespace or boot (another container under the same host name):
    # its pid means nothing here, so the lease is kept until it is too old to be a live write.
    for name, other in (("pidns", {"pidns": "pid:[1]"}), ("boot", {"boot": "another"})):
        store = open_store(str(tmp_path / name))
        assert _kept(store, *_lease_of(store, 2**22 + 1, dict(me, **other)))


def _files(root):
    return sorted(f for _, _, fs in os.walk(root) for f in fs)


@pytest.fixture
def tiny_fs(mount_tmpfs):
    return str(mount_tmpfs("2m"))


def test_full_disk_is_a_clear_error_and_loses_nothing(tiny_fs, key):
    store = open_store(os.path.join(tiny_fs, "store"))
    first = write({"a": np.arange(50_000), "n": 1}, store, key=key)
    blobs_before = _files(os.path.join(store.root, "blobs"))
    torch = pytest.importorskip("torch")
    big = {
        "a": np.arange(50_000),
        "n": 2,
        "b": np.ones(300_000),
        "t": torch.ones(200_000),
        "s": list(range(100)),
    }
    with pytest.raises(StorageFullError) as ei:
        write(big, store, key=key)
    msg = str(ei.value)
    assert "no space left" in msg and "\n" not in msg
    assert store.manifest_ids("default") == [first.checkpoint_id]
    assert list(os.listdir(os.path.join(store.root, "tmp"))) == []
    assert _files(os.path.join(store.root, "blobs")) == blobs_before
    rr = read(store, key=key)
    assert rr.values["n"] == 1 and rr.values["a"].sum() == np.arange(50_000).sum()
