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
from tests.checkpoint.helpers import flip_a_byte_of_each_storage

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
    pid0 = os.getpid()
    msg = _fork_write(url, key, cache, ns)
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


def _fork_write(url: str, key: bytes, cache: WriteCache, ns: dict[str, Any],
                damage: str | None = None) -> dict[str, Any]:
    """One write in a forked child that gives back memory, as an autosave runs it; ``damage``:
    a blob file whose bytes the child changes in place once the write trusts it."""

    def in_child(guard: Any, done_with: Any) -> Any:
        store = open_store(url)
        store.publish = guard(store.publish)

        def damaging(storages: Any) -> None:
            nonlocal damage
            if damage is not None:  # once, after the write judged the blob good
                flip_a_byte_of_each_storage(damage)
                damage = None
            done_with(storages)

        damaging.before_pickling = getattr(done_with, "before_pickling", True)  # type: ignore[attr-defined]
        return write(ns, store, key=key, cache=cache, keep=0,
                     done_with=done_with if damage is None else damaging)

    return forkwrite.write_in_child(in_child, open_store(url).url, cache,
                                    may_publish=lambda: True, started=lambda pid: None,
                                    lock=threading.Lock(), may_fork=lambda: True,
                                    ended=lambda: None)


def _most_changed(tmp_path: Any) -> tuple[dict[str, Any], str, bytes, WriteCache, str]:
    """Eight 1 MiB tensors in one pack, then six of them changed: the pack falls below half
    in use, so the write rewrites the two unchanged ones. Returns the namespace, the store's
    url, the key, the cache and the old pack's digest."""
    ps = [torch.full((1 << 18,), float(i)) for i in range(8)]
    ns = {"ps": ps}
    key = load_or_create_key(str(tmp_path / "key"))
    url = str(tmp_path / "store")
    cache = WriteCache()
    (pack,) = {e["blob"] for e in write(ns, open_store(url), key=key, cache=cache,
                                         keep=0).manifest.tensors}
    for p in ps[2:]:
        p.add_(100.0)
    return ns, url, key, cache, pack


def test_a_forked_write_rewrites_a_pack_it_gave_memory_of_from_the_store(tmp_path: Any) -> None:
    """The unchanged storages of a pack that falls below half are given back as soon as they
    are hashed, like those of a pack kept (a cell that writes one copies nothing), and the
    rewrite copies them from the old pack: a read of their memory would end the child."""
    ns, url, key, cache, pack = _most_changed(tmp_path)
    msg = _fork_write(url, key, cache, ns)
    assert "done" in msg, msg
    assert msg["done"]["bytes_given_back"] >= 2 * ((1 << 20) - 2 * forkwrite.PAGE), msg
    got = read(open_store(url), key=key, checkpoint_id=msg["done"]["checkpoint_id"])
    assert pack not in {e["blob"] for e in got.manifest.tensors}  # rewritten
    assert all(torch.equal(a, b) for a, b in zip(got.values["ps"], ns["ps"], strict=True))


def test_a_pack_a_forked_write_finds_damaged_is_no_longer_trusted_by_the_kernel(
        tmp_path: Any) -> None:
    """A rewrite from the store checks the old pack as a reference is checked. A pack
    damaged once the write trusted it fails the child's write (nothing published), and the
    kernel hears that it is not good any more: its next write writes it from memory."""
    from jupyter_pause.checkpoint import goodblobs

    ns, url, key, cache, pack = _most_changed(tmp_path)
    store = open_store(url)
    before = set(store.manifest_files())
    msg = _fork_write(url, key, cache, ns, damage=store.blob_path(pack))
    assert "changed since this write checked it" in msg.get("error", ""), msg
    assert set(store.manifest_files()) == before
    assert (store.url, pack) not in goodblobs._good  # forgotten in the kernel too
    res = write(ns, store, key=key, cache=cache, keep=0)
    got = read(open_store(url), key=key, checkpoint_id=res.checkpoint_id).values["ps"]
    assert all(torch.equal(a, b) for a, b in zip(got, ns["ps"], strict=True))
