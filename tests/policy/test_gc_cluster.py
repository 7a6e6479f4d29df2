"""gc through the GKE backend on the simulated cluster, together with the checkpoint store:
every Kubernetes object and every store byte left afterwards is counted."""

from __future__ import annotations

import asyncio
import os

import pytest

# The Kubernetes API test server, simulated cluster and fixtures of tests/kube.
from kube import conftest as kube_conftest
from kube.conftest import notebook_pod, pause_ctx
from kube.test_gke_backend import backend, objects, start_pod

from jupyter_pause.checkpoint import load_or_create_key, open_store, write
from jupyter_pause.policy.gc import render, run_gc

# Their fixtures, made visible to this module (a conftest cannot be shared across folders).
globals().update({name: getattr(kube_conftest, name) for name in
                  ("apiserver", "admin", "notebook_client", "sim", "recorder")})

pytestmark = pytest.mark.timeout(180)


def walk(root: str) -> tuple[int, int]:
    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    return len(files), sum(os.path.getsize(f) for f in files)


async def test_gc_snapshots_triggers_checkpoints_and_blobs(apiserver, notebook_client, sim,
                                                           recorder, tmp_path):
    # three pauses of the same workspace: three snapshots (+ triggers) and three checkpoints
    root = str(tmp_path / "store")
    store, key = open_store(root), load_or_create_key(str(tmp_path / "key"))
    start_pod(sim, notebook_pod("nb"))
    b = backend(notebook_client, "nb", keep_snapshots=1)
    for i in range(3):
        if i:
            await asyncio.to_thread(sim.delete_pod, "nb")
            await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 5, "pod gone")
            await asyncio.to_thread(start_pod, sim, notebook_pod("nb", image=f"jupyter/lab:{i}"))
        await backend(notebook_client, "nb").snapshot(pause_ctx(recorder, f"f{i}"))
        write({"step": i, "w": bytes([i]) * 4096}, store, key=key, stream="nb.ipynb", keep=None)
        await asyncio.sleep(1.1)  # creationTimestamps have second resolution
    counts = {p: len(objects(apiserver, p)) for p in
              ("podsnapshots", "podsnapshotmanualtriggers", "podsnapshotpolicies")}
    assert counts == {"podsnapshots": 3, "podsnapshotmanualtriggers": 3,
                      "podsnapshotpolicies": 1}
    before = walk(root)

    dry = await run_gc(store_url=root, state_dir=None, keep=1, older_than=None, dry_run=True,
                       backend=b, key=key)
    assert len(dry["backend"]["would_delete"]) == 4 and len(dry["checkpoints"]["deleted"]) == 2
    assert walk(root) == before and len(objects(apiserver, "podsnapshots")) == 3

    res = await run_gc(store_url=root, state_dir=None, keep=1, older_than=None, dry_run=False,
                       backend=b, key=key)
    text = render(res)
    assert "snapshots/triggers (gke): deleted 4" in text
    assert "checkpoints: deleted 2, remaining 1" in text
    # Kubernetes: one snapshot and its trigger left, the policy stays while snapshots exist
    snaps = objects(apiserver, "podsnapshots")
    trigs = objects(apiserver, "podsnapshotmanualtriggers")
    assert len(snaps) == 1 and len(trigs) == 1
    assert len(objects(apiserver, "podsnapshotpolicies")) == 1
    assert {snaps[0]["metadata"]["name"], trigs[0]["metadata"]["name"]} <= \
        set(res["backend"]["remaining"])
    # store: one checkpoint; every file and byte is in the printed numbers
    left = store.list()
    assert [m.stream for m in left] == ["nb.ipynb"]
    n_files, n_bytes = walk(root)
    r = res["remaining"]
    assert r["manifests"] + r["blobs"] + r["temp_files"] == n_files and r["bytes"] == n_bytes
    assert r["blobs"] == len(left[0].blobs)
    assert dry["remaining"] == res["remaining"]
