"""Device mapping (a checkpoint recorded on cuda:0 restores on this CPU-only machine) and
fsspec stores."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_pause.checkpoint import CheckpointError, open_store, read, write
from jupyter_pause.checkpoint import tensors as tensors_mod


def test_cuda_checkpoint_restores_on_cpu(store, key, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this test forges cuda:0 on a machine without CUDA")
    model = torch.nn.Linear(8, 4)
    monkeypatch.setattr(tensors_mod, "record_device", lambda us: "cuda:0")
    res = write({"model": model}, store, key=key)
    monkeypatch.undo()
    assert {t["device"] for t in res.manifest.tensors} == {"cuda:0"}
    rr = read(store, key=key, device="auto")
    assert rr.values["model"].weight.device.type == "cpu"
    torch.testing.assert_close(rr.values["model"].weight, model.weight)
    assert any("cuda:0" in w and "cpu" in w and "no CUDA" in w for w in rr.warnings), rr.warnings
    rr = read(store, key=key, device="cpu")
    assert rr.values["model"].bias.device.type == "cpu"
    with pytest.raises(CheckpointError, match="CUDA is not available"):
        read(store, key=key, device="cuda:0")


def test_env_mismatch_is_reported(store, key):
    import json
    import os

    from jupyter_pause.checkpoint.manifest import Manifest, sign

    res = write({"a": 1}, store, key=key)
    m = res.manifest
    d = m.to_dict()
    d["env"]["python"] = "2.7.18"
    d["env"]["gpus"] = ["NVIDIA L4"]
    forged = Manifest.from_dict(d)
    path = store.manifest_path("default", m.id)
    with open(path, "wb") as f:
        f.write(sign(forged, key))
    rr = read(store, key=key)
    assert any("Python 2.7.18" in w for w in rr.warnings)
    assert any("NVIDIA L4" in w for w in rr.warnings)
    with open(path) as f:
        assert json.load(f)["hmac"] and os.path.exists(path)


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_fsspec_store_round_trip(tmp_path, key, kind):
    torch = pytest.importorskip("torch")
    url = f"memory://jp-test-{tmp_path.name}/ckpt" if kind == "memory" else f"file://{tmp_path}/s"
    store = open_store(url)
    model = torch.nn.Linear(4, 2)
    ns = {"arr": np.arange(400_000), "model": model, "x": {"k": [1, 2]}, "f": lambda: 3}
    res = write(ns, store, key=key)
    assert all(v.status == "saved" for v in res.variables)
    rr = read(open_store(url), key=key)
    np.testing.assert_array_equal(rr.values["arr"], ns["arr"])
    torch.testing.assert_close(rr.values["model"].weight, model.weight)
    assert rr.values["x"] == {"k": [1, 2]}
    assert [m.id for m in store.list(key=key)] == [res.checkpoint_id]
    write({"y": 1}, store, key=key, keep=1)
    from jupyter_pause.checkpoint import gc

    gc(store)
    assert read(store, key=key).values == {"y": 1}


def test_device_storages_come_to_host_in_pieces_that_own_their_memory():
    # an object store upload keeps views of earlier pieces until a part is full: each must stay
    # valid after the generator has moved on (a view of a freed host copy would upload garbage)
    import gc as _gc

    torch = pytest.importorskip("torch")
    us = torch.randn(1_000_003).untyped_storage()
    pieces = list(tensors_mod.host_pieces(us, piece=1 << 20))
    _gc.collect()
    junk = [torch.ones(1 << 18) for _ in range(8)]  # reuse any memory that was freed
    assert [len(p) for p in pieces[:-1]] == [1 << 20] * (len(pieces) - 1)
    assert b"".join(pieces) == bytes(tensors_mod.storage_bytes(us))
    del junk
