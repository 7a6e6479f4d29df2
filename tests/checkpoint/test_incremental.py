"""Incremental checkpoints, retention and garbage collection."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jupyter_pause.checkpoint import WriteCache, gc, read, write
from jupyter_pause.checkpoint.tensors import storage_xxh3

from .helpers import flip_a_byte_of_each_storage


def _blobs_on_disk(store):
    root = os.path.join(store.root, "blobs")
    return {f for _, _, fs in os.walk(root) for f in fs}


def test_unchanged_writes_nothing_and_one_changed_tensor_writes_only_it(store, key):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    state = {f"w{i}": torch.randn(4096) for i in range(150)}  # 150 x 16 KiB
    model = torch.nn.Linear(64, 64)
    ns = {"state": state, "model": model, "arr": np.arange(300_000), "meta": {"step": 1}}
    cache = WriteCache()
    r1 = write(ns, store, key=key, cache=cache)
    assert r1.bytes_written >= 150 * 16384
    r2 = write(ns, store, key=key, cache=cache)
    assert r2.bytes_written == 0, r2.bytes_written
    assert r2.bytes_total == r1.bytes_total
    with torch.no_grad():
        state["w7"].add_(1.0)
    r3 = write(ns, store, key=key, cache=cache)
    assert 16384 <= r3.bytes_written <= 16384 + 4096, r3.bytes_written
    # each checkpoint reads back its own values; the old pack was never modified
    v1 = read(store, key=key, checkpoint_id=r1.checkpoint_id).values
    v3 = read(store, key=key, checkpoint_id=r3.checkpoint_id).values
    torch.testing.assert_close(v3["state"]["w7"], state["w7"])
    torch.testing.assert_close(v1["state"]["w7"], state["w7"] - 1.0)
    torch.testing.assert_close(v3["state"]["w8"], state["w8"])
    # a python-level change rewrites only the small stream
    ns["meta"]["step"] = 2
    r4 = write(ns, store, key=key, cache=cache)
    assert 0 < r4.bytes_written < 16384  # the small-stream bundle only, no tensor data
    assert read(store, key=key).values["meta"] == {"step": 2}
    # replacing a tensor object (new storage) is detected
    state["w9"] = torch.zeros(4096)
    r5 = write(ns, store, key=key, cache=cache)
    assert r5.bytes_written >= 16384
    assert read(store, key=key).values["state"]["w9"].sum().item() == 0


def test_changed_numpy_buffer_is_rewritten(store, key):
    arr = np.zeros(500_000)
    ns = {"arr": arr}
    cache = WriteCache()
    write(ns, store, key=key, cache=cache)
    assert write(ns, store, key=key, cache=cache).bytes_written == 0
    arr[123] = 5
    r = write(ns, store, key=key, cache=cache)
    assert r.bytes_written >= arr.nbytes
    assert read(store, key=key).values["arr"][123] == 5


def test_cache_survives_blob_loss(store, key):
    """A cached blob removed behind the cache's back is written again, never referenced dead."""
    ns = {"arr": np.ones(300_000)}
    cache = WriteCache()
    r1 = write(ns, store, key=key, cache=cache, keep=1)
    store.delete(r1.checkpoint_id)
    gc(store)
    assert _blobs_on_disk(store) == set()
    r2 = write(ns, store, key=key, cache=cache)
    assert r2.bytes_written >= 2_400_000
    assert read(store, key=key).values["arr"].sum() == 300_000


def test_retention_and_gc_remove_exactly_unreferenced(store, key):
    refs = []
    for i in range(4):
        r = write({"a": np.full(200_000, i), "i": i}, store, key=key, keep=2)
        refs.append(set(r.manifest.blobs))
    ids = store.manifest_ids("default")
    assert len(ids) == 2
    assert _blobs_on_disk(store) == refs[2] | refs[3]
    other = write({"b": np.full(200_000, 9)}, store, key=key, stream="other", keep=None)
    store.delete(ids[1])  # the older of the two kept
    dry = gc(store, dry_run=True)
    assert set(dry["removed"]) == refs[2] - refs[3]
    assert _blobs_on_disk(store) == refs[2] | refs[3] | set(other.manifest.blobs)
    out = gc(store)
    assert set(out["removed"]) == refs[2] - refs[3] and out["bytes_freed"] > 0
    assert _blobs_on_disk(store) == refs[3] | set(other.manifest.blobs)
    assert read(store, key=key).values["i"] == 3
    assert read(store, key=key, stream="other").values["b"][0] == 9


def test_checkpoint_after_restore_reuses_entries_but_sees_changes(store, key):
    torch = pytest.importorskip("torch")
    ns = {"a": torch.randn(100_000), "b": torch.randn(100_000), "c": torch.randn(100_000)}
    write(ns, store, key=key)
    v = read(store, key=key).values
    with torch.no_grad():
        v["b"].mul_(2)  # modified after the restore: must be written again
    r = write(v, store, key=key, cache=WriteCache())
    # b only (plus small streams): a and c are 2/3 of the old pack, still referenced there
    assert 400_000 <= r.bytes_written < 500_000, r.bytes_written
    v2 = read(store, key=key).values
    torch.testing.assert_close(v2["a"], ns["a"])
    torch.testing.assert_close(v2["b"], ns["b"] * 2)


def test_gc_spares_blobs_a_running_write_is_about_to_reference(store, key):
    r = write({"arr": np.ones(300_000)}, store, key=key)
    blob = next(d for d, b in r.manifest.blobs.items() if b["kind"] == "buffer")
    old = os.path.getmtime(store.blob_path(blob)) - 3600
    os.utime(store.blob_path(blob), (old, old))
    # the aged file is no longer the one this process wrote: a write vouches for it again only
    # once it has read it back (goodblobs)
    assert not store.claim_blob(blob)
    read(store, key=key, checkpoint_id=r.checkpoint_id)
    txn = store.begin("20991231T000000000000Z-abcdef")  # another writer, in flight
    store.delete(r.checkpoint_id)
    assert store.claim_blob(blob)  # it found the blob and will reference it
    assert blob not in gc(store)["removed"]
    txn.release()
    assert blob in gc(store)["removed"]


def test_prewritten_array_of_a_skipped_variable_leaves_no_orphan(store, key, monkeypatch):
    from jupyter_pause.checkpoint import writer

    real = writer.dump_group_frames

    def failing(values, **kw):
        if "a" in values:
            raise TypeError("cannot pickle this one")
        return real(values, **kw)

    monkeypatch.setattr(writer, "dump_group_frames", failing)
    r = write({"a": np.arange(1_000_000.0), "b": np.ones(500_000)}, store, key=key)
    assert {v.name: v.status for v in r.variables} == {"a": "skipped", "b": "saved"}
    assert _blobs_on_disk(store) == set(r.manifest.blobs)
    assert read(store, key=key).values["b"].sum() == 500_000


def test_xxh3_tensor_check_sees_changes_behind_torchs_back(store, key):
    torch = pytest.importorskip("torch")
    ns = {f"t{i}": torch.zeros(50_000) for i in range(3)}
    cache = WriteCache(tensor_check="xxh3")
    write(ns, store, key=key, cache=cache)
    assert write(ns, store, key=key, cache=cache).bytes_written < 4096
    ns["t1"].numpy()[7] = 3.0  # no _version bump
    r = write(ns, store, key=key, cache=cache)
    assert 200_000 <= r.bytes_written < 210_000, r.bytes_written
    assert read(store, key=key).values["t1"][7].item() == 3.0


# -- change detection never misses a change -----------------------------------------------
# torch's _version counter is not bumped by writes through `.data`, `.numpy()` views or a
# parameter's `.data`: a check that trusted it reported "saved" and kept the old bytes.
def _writes_behind_torchs_back(torch, ns):
    ns["t"].data[3] = 7.0
    ns["t"].numpy()[5] = 9.0
    ns["lin"].bias.data[0] = 11.0
    ns["lin"].weight.detach().numpy()[0, 0] = 13.0


def _assert_behind_torchs_back(torch, got):
    assert got["t"][3].item() == 7.0 and got["t"][5].item() == 9.0
    assert got["lin"].bias[0].item() == 11.0 and got["lin"].weight[0, 0].item() == 13.0


def test_writes_behind_torchs_back_are_saved_with_the_same_cache(store, key):
    torch = pytest.importorskip("torch")
    ns = {"t": torch.zeros(50_000), "lin": torch.nn.Linear(200, 100)}
    cache = WriteCache()
    write(ns, store, key=key, cache=cache)
    assert write(ns, store, key=key, cache=cache).bytes_written < 4096  # unchanged: nothing
    _writes_behind_torchs_back(torch, ns)
    write(ns, store, key=key, cache=cache)
    _assert_behind_torchs_back(torch, read(store, key=key).values)


def test_writes_behind_torchs_back_after_a_restore_are_saved(store, key):
    """As after a resume: the values come from read(), then change in place, then a fresh
    kernel's cache checkpoints them."""
    torch = pytest.importorskip("torch")
    write({"t": torch.zeros(50_000), "lin": torch.nn.Linear(200, 100)}, store, key=key,
          cache=WriteCache())
    v = read(store, key=key).values
    _writes_behind_torchs_back(torch, v)
    r = write(v, store, key=key, cache=WriteCache())
    assert r.bytes_written >= 50_000 * 4  # the changed storages were written, not referenced
    _assert_behind_torchs_back(torch, read(store, key=key).values)
    # and a checkpoint of the unchanged values after that restore writes (almost) nothing
    v2 = read(store, key=key).values
    assert write(v2, store, key=key, cache=WriteCache()).bytes_written < 4096


def test_inference_mode_and_bare_storages_are_checked_by_content(store, key):
    torch = pytest.importorskip("torch")
    with torch.inference_mode():
        inf = torch.zeros(40_000)
    ns = {"inf": inf, "st": torch.zeros(30_000).untyped_storage()}
    cache = WriteCache()
    write(ns, store, key=key, cache=cache)
    with torch.inference_mode():
        inf[1] = 2.0
    torch.empty(0, dtype=torch.uint8).set_(ns["st"])[0] = 5
    write(ns, store, key=key, cache=cache)
    got = read(store, key=key).values
    assert got["inf"][1].item() == 2.0
    assert torch.empty(0, dtype=torch.uint8).set_(got["st"])[0].item() == 5


# -- a blob damaged in place is never reused -----------------------------------------------
def _damage(store, digest):
    path = store.blob_path(digest)
    with open(path, "r+b") as f:  # same size, other bytes
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("fresh_cache", [False, True], ids=["same-process", "fresh-cache"])
def test_a_damaged_blob_is_written_again_by_the_next_checkpoint(store, key, fresh_cache):
    from jupyter_pause.checkpoint import IntegrityError

    torch = pytest.importorskip("torch")
    ns = {"arr": np.arange(400_000.0), "t": torch.arange(100_000.0), "small": {"x": 1}}
    cache = WriteCache()
    r1 = write(ns, store, key=key, cache=cache)
    for digest, info in r1.manifest.blobs.items():
        if info["kind"] in ("buffer", "tensors"):
            _damage(store, digest)
    with pytest.raises(IntegrityError):
        read(store, key=key)
    r2 = write(ns, store, key=key, cache=WriteCache() if fresh_cache else cache)
    assert r2.bytes_written >= 400_000 * 8 + 100_000 * 4  # both rewritten, not referenced
    got = read(store, key=key, checkpoint_id=r2.checkpoint_id).values
    assert np.array_equal(got["arr"], ns["arr"])
    assert torch.equal(got["t"], ns["t"]) and got["small"] == {"x": 1}
    # the rewrite repaired the shared blob in place: the old checkpoint reads again too
    assert np.array_equal(read(store, key=key, checkpoint_id=r1.checkpoint_id).values["arr"],
                          ns["arr"])


def test_a_blob_replaced_by_another_file_is_not_vouched_for(store, key):
    """Same bytes, another file (copied back from a backup, say): not hashed by this process, so
    not reused until it is read back; the write replaces it with the bytes it hashed."""
    import shutil

    ns = {"arr": np.arange(300_000.0)}
    cache = WriteCache()
    r1 = write(ns, store, key=key, cache=cache)
    blob = next(d for d, b in r1.manifest.blobs.items() if b["kind"] == "buffer")
    path = store.blob_path(blob)
    shutil.copy(path, path + ".copy")
    os.replace(path + ".copy", path)
    assert not store.claim_blob(blob)
    assert write(ns, store, key=key, cache=cache).bytes_written >= 300_000 * 8
    assert store.claim_blob(blob)  # now the file this process wrote
    assert write(ns, store, key=key, cache=cache).bytes_written < 4096


def test_done_with_names_only_storages_the_write_will_not_read_again(store, key):
    """The hook a forked autosave uses to unmap memory early: after every storage is hashed it
    gets the unchanged storages reused by reference, never one the write still reads (a
    changed storage being written, memory another array or storage shares)."""
    torch = pytest.importorskip("torch")
    ps = [torch.full((1 << 18,), float(i)) for i in range(10)]  # 1 MiB each
    shared = np.zeros(1 << 18, dtype=np.float32)
    ns = {"ps": ps, "view": ps[3].numpy(), "a": torch.from_numpy(shared),
          "b": torch.from_numpy(shared[1:])}  # two storages over the same bytes
    cache = WriteCache()
    calls: list[list[int]] = []

    def done_with(storages):
        calls.extend(us.data_ptr() for us in storages)

    write(ns, store, key=key, cache=cache, done_with=done_with)
    assert calls == []  # a first write reuses nothing
    ps[5].data[7] = -1.0  # changed behind torch's back: written again
    shared[100] = 2.0  # both storages over it changed
    r = write(ns, store, key=key, cache=cache, done_with=done_with)
    index = {p.untyped_storage().data_ptr(): i for i, p in enumerate(ps)}
    # ps[3] is left out: `view` shares its bytes (pickled as a view of it, but memory two
    # objects share is never given back)
    assert sorted(index.get(a, a) for a in calls) == [0, 1, 2, 4, 6, 7, 8, 9]
    assert len(set(calls)) == len(calls)  # each once
    got = read(store, key=key, checkpoint_id=r.checkpoint_id).values
    assert [float(p[7]) for p in got["ps"]] == [float(p[7]) for p in ps]
    assert float(got["a"][100]) == 2.0 and float(got["b"][99]) == 2.0
    got["view"][0] = 5.0
    assert float(got["ps"][3][0]) == 5.0
    # Most storages of a pack changed: the few unchanged ones are written again (a checkpoint
    # never pins an old pack for a handful of bytes). Their memory was given back before that
    # was known, so they are copied from the old pack in the store, not from memory.
    for i in range(10):
        if i not in (0, 1):
            ps[i].data[9] += 1.0
    expected = [float(p[9]) for p in ps]
    prev = {e["xxh3"]: e["blob"] for e in r.manifest.tensors}
    same = [storage_xxh3(ps[i].untyped_storage()) for i in (0, 1)]
    calls.clear()

    def gone(storages):
        done_with(storages)
        for us in storages:  # as a forked writer's memory is gone: a read from memory sees this
            torch.empty(0, dtype=torch.uint8).set_(us).fill_(0xFF)

    r = write(ns, store, key=key, cache=cache, done_with=gone)
    now = {e["xxh3"]: e["blob"] for e in r.manifest.tensors}
    assert all(now[x] != prev[x] for x in same)
    assert sorted(index[a] for a in calls) == [0, 1]
    got = read(store, key=key, checkpoint_id=r.checkpoint_id).values
    assert [float(p[9]) for p in got["ps"]] == expected

_EVENTS: list[str] = []


class _Marks:
    """Pickled as itself; says when the pickling reached it."""

    def __reduce__(self):
        _EVENTS.append("pickled")
        return (_Marks, ())


def test_done_with_gets_reused_storages_before_the_pickling_starts(store, key, monkeypatch):
    """A forked autosave gives memory back as early as it can (packs.TensorPacks.prehash): the
    storages torch allocated that the walk found unchanged are named before any unit is pickled,
    each storage is hashed once, and one over other memory (``from_numpy`` here: such memory may
    be a buffer the pickling reads) only after the pickling met it."""
    torch = pytest.importorskip("torch")
    from jupyter_pause.checkpoint import tensors

    ps = [torch.full((1 << 18,), float(i)) for i in range(8)]  # 1 MiB each, one pack
    foreign = torch.from_numpy(np.ones(1 << 18, dtype=np.float32))  # its array is not ours
    ns = {"ps": [_Marks(), foreign, *ps]}  # the marker is pickled first of the unit
    cache = WriteCache()
    write(ns, store, key=key, cache=cache)
    ps[6].data[7] = -1.0  # changed behind torch's back: written again
    events = _EVENTS
    events.clear()
    hashed: list[int] = []
    real = tensors.storage_xxh3

    def counting(us):
        hashed.append(us.data_ptr())
        return real(us)

    monkeypatch.setattr(tensors, "storage_xxh3", counting)
    name = {p.untyped_storage().data_ptr(): f"ps{i}" for i, p in enumerate(ps)}
    name[foreign.untyped_storage().data_ptr()] = "foreign"
    expected = [foreign.clone(), *(p.clone() for p in ps)]

    def done_with(storages):
        events.extend(name[us.data_ptr()] for us in storages)
        for us in storages:  # as a forked writer's memory is gone: a later read would see this
            torch.empty(0, dtype=torch.uint8).set_(us).fill_(0xFF)

    r = write(ns, store, key=key, cache=cache, done_with=done_with)
    first = events.index("pickled")
    assert sorted(events[:first]) == [f"ps{i}" for i in range(8) if i != 6], events
    assert events[first + 1:] == ["foreign"], events
    assert sorted(hashed) == sorted(name), "each storage hashed once"
    got = read(store, key=key, checkpoint_id=r.checkpoint_id).values["ps"]
    assert all(torch.equal(a, b) for a, b in zip(got[1:], expected, strict=True))
    assert float(got[8][7]) == -1.0
    # the next write after this one hashes pack by pack, as this one laid them out
    assert set(cache.pack_of) == set(name)
    assert cache.pack_of[ps[6].untyped_storage().data_ptr()] != cache.pack_of[
        ps[0].untyped_storage().data_ptr()]


def _skipped_half(store, key, torch):
    """Two variables in one 8 MiB pack, written; then ``b`` (5 of the 8 MiB) can no longer be
    pickled. Returns the namespace, its cache, the pack's digest and clones of ``a``."""
    a = [torch.full((1 << 18,), float(i)) for i in range(3)]
    b = [torch.full((1 << 18,), float(10 + i)) for i in range(5)]
    ns = {"a": a, "b": {"ts": b}}
    cache = WriteCache()
    r1 = write(ns, store, key=key, cache=cache)
    (pack,) = {e["blob"] for e in r1.manifest.tensors}  # one pack
    ns["b"]["g"] = (i for i in range(3))  # b can no longer be pickled: skipped
    return ns, cache, pack, [t.clone() for t in a]


def test_a_pack_whose_memory_was_given_back_is_rewritten_from_the_store(store, key):
    """prehash gives back every unchanged storage the walk found before the pickling decides
    whether its old pack is kept. When the pickling saves too little of the pack (a variable
    skipped), the storages it does save are copied from the old pack in the store, never from
    memory a forked writer has given back (it would read a hole)."""
    torch = pytest.importorskip("torch")
    ns, cache, pack, expected = _skipped_half(store, key, torch)
    given: list[int] = []

    def done_with(storages):
        given.extend(us.data_ptr() for us in storages)
        for us in storages:  # as a forked writer's memory is gone: a read from memory sees this
            torch.empty(0, dtype=torch.uint8).set_(us).fill_(0xFF)

    r2 = write(ns, store, key=key, cache=cache, done_with=done_with)
    assert len(given) == 8  # all of them, before the pickling found b unpicklable
    assert {v.name: v.status for v in r2.variables}["b"] == "skipped"
    # 3 of 8 MiB used: rewritten (the old pack is not pinned), from the store
    assert pack not in {e["blob"] for e in r2.manifest.tensors}
    assert 3 << 20 <= r2.bytes_written < 4 << 20, r2.bytes_written
    got = read(store, key=key, checkpoint_id=r2.checkpoint_id).values["a"]
    assert all(torch.equal(x, y) for x, y in zip(got, expected, strict=True))


@pytest.mark.parametrize("how", ["in place", "in place, stamp trusted", "replaced by a link"])
def test_an_old_pack_damaged_under_a_rewrite_from_the_store_fails_the_write(store, key, how,
                                                                           tmp_path):
    """The old pack is store input, trusted only as a reference is. Damaged after the write
    judged it good: in place (its stamp changes: no longer known good); in place with its
    new stamp trusted as if it were unchanged (what a forged file would need: then the bytes
    do not hash as the storage's memory did); or replaced by a link to a copy outside the
    store. Each fails the write before it publishes anything, and the pack is no longer
    trusted: the next write (with the memory still there) writes everything from memory."""
    torch = pytest.importorskip("torch")
    from jupyter_pause.checkpoint import IntegrityError, goodblobs

    ns, cache, pack, expected = _skipped_half(store, key, torch)
    path = store.blob_path(pack)
    damaged: list[bool] = []

    def done_with(storages):  # memory kept; the pack is damaged once the write trusts it
        if damaged:
            return
        damaged.append(True)
        if how == "replaced by a link":
            outside = str(tmp_path / "outside")
            os.rename(path, outside)
            os.symlink(outside, path)
            return
        flip_a_byte_of_each_storage(path)
        if how == "in place, stamp trusted":
            goodblobs.remember(store.url, pack, store.blob_stamp(pack))

    before = set(store.manifest_files())
    why = {"in place": "changed since this write checked it",
           "in place, stamp trusted": "no longer holds t",
           "replaced by a link": "is not a regular file"}[how]
    with pytest.raises(IntegrityError, match=why):
        write(ns, store, key=key, cache=cache, done_with=done_with)
    assert set(store.manifest_files()) == before  # nothing published
    assert (store.url, pack) not in goodblobs._good  # forgotten, whatever its stamp says
    r = write(ns, store, key=key, cache=cache)
    assert pack not in {e["blob"] for e in r.manifest.tensors}
    got = read(store, key=key, checkpoint_id=r.checkpoint_id).values["a"]
    assert all(torch.equal(x, y) for x, y in zip(got, expected, strict=True))


def test_done_with_leaves_out_storages_under_memory_still_read():
    """Memory a buffer in flight, a storage to be written or another array or storage shares
    (all registered with read_later) is never named, by a byte; unknown memory names nothing."""
    torch = pytest.importorskip("torch")
    from jupyter_pause.checkpoint.packs import GIVE_BACK_MIN, TensorPacks

    st = [torch.zeros(GIVE_BACK_MIN, dtype=torch.uint8).untyped_storage() for _ in range(4)]
    a = [s.data_ptr() for s in st]

    def unread(*reads):
        packs = TensorPacks(None, None)  # type: ignore[arg-type]
        for at, n in [(a[1], GIVE_BACK_MIN), *reads]:  # st[1] is being written
            packs.read_later(at, n)
        return [i for i in range(4) if packs._unread(st[i])]

    assert unread() == [0, 2, 3]
    assert unread((a[2] + GIVE_BACK_MIN - 1, 1)) == [0, 3]  # its last byte
    assert unread((a[3] - 10, 10)) == [0, 2, 3]  # ends just before it
    assert unread((a[0] + 5, 1)) == [2, 3]
    assert unread((min(a) - 100, 1 << 40), (a[2], 1)) == []  # one long range over all
    assert unread((id(a), -1)) == []
    small = torch.zeros(GIVE_BACK_MIN - 1, dtype=torch.uint8).untyped_storage()
    assert not TensorPacks(None, None)._unread(small)  # type: ignore[arg-type]


def test_done_with_range_check_agrees_with_a_plain_scan():
    """The merged intervals behind read_later answer as a scan of every read would, for
    touching, nested, equal, empty (no byte: no cover) and far-reaching ranges."""
    import random

    from jupyter_pause.checkpoint.packs import GIVE_BACK_MIN, TensorPacks

    class Storage:
        class device:  # the shape of torch's attribute
            type = "cpu"

        def __init__(self, a: int, n: int) -> None:
            self.a, self.n = a, n

        def data_ptr(self) -> int:
            return self.a

        def nbytes(self) -> int:
            return self.n

    rng = random.Random(7)
    half = GIVE_BACK_MIN // 2
    for _ in range(2000):
        packs, reads = TensorPacks(None, None), []  # type: ignore[arg-type]
        for _ in range(rng.randint(0, 12)):
            a = rng.randint(0, 10) * half + rng.randint(-3, 3)
            n = rng.choice([0, 1, GIVE_BACK_MIN, 3 * GIVE_BACK_MIN, rng.randint(1, 8 * half)])
            packs.read_later(a, n)
            reads.append((a, n))
        for _ in range(10):
            a = rng.randint(0, 12) * half + rng.randint(-3, 3)
            n = GIVE_BACK_MIN * rng.randint(1, 3)
            scan = not any(b < a + n and a < b + m for b, m in reads if m > 0)
            assert packs._unread(Storage(a, n)) == scan, (reads, a, n)
