"""A forked writer gives back the memory of storages it reuses unchanged, for real (the
inaccessible reservation of kernel.forkwrite), on a namespace that shares memory every way the
engine knows of: a read of given-back memory would end the child with SIGSEGV, so a child that
finishes and a checkpoint that reads back equal show that nothing read it."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

from jupyter_pause.checkpoint import WriteCache, load_or_create_key, open_store, read, write
from jupyter_pause.kernel import forkwrite

torch = pytest.importorskip("torch")


def namespace() -> dict[str, Any]:
    ps = [torch.full((1 << 18,), float(i)) for i in range(8)]  # 1 MiB each, one pack
    base = np.arange(1 << 18, dtype=np.float32)
    base2 = np.arange(1 << 18, dtype=np.float32)
    raw = bytearray(os.urandom(2 << 20))
    return {
        "ps": ps,
        "view": ps[1].numpy()[10:],  # numpy over a tensor's memory
        "head": ps[5][:10],  # a second tensor over one storage
        "base": base, "over": torch.from_numpy(base),  # a tensor over numpy's memory
        # two storages over overlapping memory: one unchanged, one to be written again
        "base2": base2, "lo": torch.from_numpy(base2[: 1 << 17]),
        "hi": torch.from_numpy(base2[1 << 16:]),
        "big": np.random.default_rng(0).random(1 << 18),  # out of band, written early
        "small": np.arange(100),  # in the pickle stream
        # a tensor over a bytearray's memory, which is pickled out of band beside it
        "fb": {"raw": raw, "t": torch.frombuffer(raw, dtype=torch.uint8)},
        "d": {"w": torch.ones(1 << 18)},
        # linked to ps and unpicklable: the group is pickled again without it
        "bundle": {"t": ps[4], "g": (i for i in range(3))},
    }


def test_a_forked_write_that_gives_back_memory_saves_every_value(tmp_path: Any) -> None:
    ns = namespace()
    key = load_or_create_key(str(tmp_path / "key"))
    url = str(tmp_path / "store")
    cache = WriteCache()
    write(ns, open_store(url), key=key, cache=cache, keep=0)
    ns["ps"][2].data[7] = -1.0  # changed behind torch's back: written again
    ns["big"][0] = 5.0
    ns["base2"][-1] = -3.0  # in hi only

    def in_child(guard: Any, done_with: Any) -> Any:
        store = open_store(url)
        store.publish = guard(store.publish)
        return write(ns, store, key=key, cache=cache, keep=0, done_with=done_with)

    pid0 = os.getpid()
    msg = forkwrite.write_in_child(in_child, open_store(url).url, cache,
                                   may_publish=lambda: True, started=lambda pid: None,
                                   lock=threading.Lock(), may_fork=lambda: True,
                                   ended=lambda: None)
    assert os.getpid() == pid0
    assert "done" in msg, msg
    # ps[0], ps[3], ps[6], ps[7] and d["w"] at least (ps[1] and ps[5] share their memory)
    assert msg["done"]["bytes_given_back"] >= 5 * ((1 << 20) - 2 * forkwrite.PAGE), msg
    got = read(open_store(url), key=key, checkpoint_id=msg["done"]["checkpoint_id"]).values
    for i, p in enumerate(ns["ps"]):
        assert torch.equal(got["ps"][i], p), i
    assert np.array_equal(got["view"], ns["view"]) and torch.equal(got["head"], ns["head"])
    assert np.array_equal(got["base"], ns["base"]) and torch.equal(got["over"], ns["over"])
    assert np.array_equal(got["big"], ns["big"]) and np.array_equal(got["small"], ns["small"])
    assert torch.equal(got["d"]["w"], ns["d"]["w"]) and "bundle" not in got
    for name in ("lo", "hi"):
        assert torch.equal(got[name], ns[name]), name
    assert got["fb"]["raw"] == ns["fb"]["raw"] and torch.equal(got["fb"]["t"], ns["fb"]["t"])
    # the parent's own memory is untouched
    assert float(ns["ps"][0][3]) == 0.0 and float(ns["d"]["w"].sum()) == float(1 << 18)
