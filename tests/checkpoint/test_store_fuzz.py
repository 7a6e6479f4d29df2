"""Fuzz the trust boundary: random unsigned and malformed files in every folder of a store, then
checkpoint (with retention), restore, list and gc. Nothing outside the store may change, no
authentic checkpoint may be lost, no planted code may run, and every failure is a clear
CheckpointError, never a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import random
import string

import pytest

from jupyter_pause.checkpoint import CheckpointError, gc, load_or_create_key, open_store, read
from jupyter_pause.checkpoint import write as cp_write
from jupyter_pause.checkpoint.store import stream_slug
from jupyter_pause.policy.gc import GCError, render, run_gc

pytestmark = pytest.mark.timeout(120)

STREAMS = ("a.ipynb", "b.ipynb")
OLD = (1_000_000, 1_000_000)  # 1970: no grace period protects such files


class _Evil:
    """Unpickling this writes the marker: proof that planted data was loaded."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _digest(data: bytes) -> str:
    import blake3

    return blake3.blake3(data).hexdigest()


def _rand_name(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return "".join(rng.choice(string.ascii_letters + "._-") for _ in range(rng.randint(1, 40)))
    if kind == 1:
        return f"{rng.randint(0, 99999999):08d}T{rng.randint(0, 10**12):012d}Z-{rng.randbytes(3).hex()}"
    if kind == 2:
        return rng.randbytes(32).hex()
    if kind == 3:
        return "9999" + rng.randbytes(8).hex()
    if kind == 4:
        return ".hidden" + str(rng.random())
    return "x" * rng.randint(1, 200)


def _rand_json(rng: random.Random, depth: int = 0) -> object:
    r = rng.randrange(9 if depth < 4 else 5)
    if r == 0:
        return rng.choice([None, True, False])
    if r == 1:
        return rng.choice([0, -1, 10**300, -(10**300), 2**63, 1e308, rng.random()])
    if r == 2:
        return "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 30)))
    if r == 3:
        return rng.choice(["/etc/passwd", "../../../x", "..", "/", "", "\x00"])
    if r == 4:
        return "0" * 64
    if r in (5, 6):
        return [_rand_json(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {str(_rand_json(rng, 9)): _rand_json(rng, depth + 1) for _ in range(rng.randint(0, 5))}


class Planter:
    def __init__(self, rng: random.Random, store, outside: str, victim: str, marker: str,
                 evil_digest: str) -> None:
        self.rng, self.store, self.outside, self.victim = rng, store, outside, victim
        self.marker, self.evil = marker, evil_digest

    def manifest_like(self, stream: str) -> dict:
        rng = self.rng
        victim_rel = os.path.relpath(self.victim, os.path.join(self.store.root, "blobs", "xx"))
        blobs = {self.victim: {"size": 1, "kind": "bundle"},
                 victim_rel: {"size": 1, "kind": "bundle"},
                 "../" * 8 + "etc/passwd": {"size": 10**300},
                 self.evil: {"size": 10, "kind": "bundle"}}
        d = {"format": "jupyter-pause/checkpoint@1", "hmac": rng.choice(["0", "é", "ff" * 32]),
             "id": rng.choice(["0", "../x", "9" * 30, _rand_name(rng)]),
             "stream": rng.choice([stream, "other", 5, None, ["x"]]),
             "created": rng.choice(["2999-01-01T00:00:00+00:00", "nan", 1e308, None]),
             "blobs": rng.choice([blobs, list(blobs), "x", None]),
             "groups": [{"names": ["pwn"], "pickler": "pickle", "buffers": [], "tensors": [],
                         "stream": {"blob": self.evil, "offset": 0, "length": 10**6}}],
             "variables": [{"name": "pwn", "status": "saved", "group": 0, "kind": "x", "size": 1}],
             "tensors": rng.choice([[], [{"blob": self.victim, "name": "x"}]]),
             "meta": rng.choice([{}, {"flight": "f"}, "x"])}
        if rng.random() < 0.3:
            d["key_id"] = rng.choice(["", "0" * 16, 5])
        return d

    def content(self, stream: str) -> bytes:
        rng = self.rng
        r = rng.randrange(8)
        if r == 0:
            return json.dumps(self.manifest_like(stream)).encode()
        if r == 1:
            return json.dumps(_rand_json(rng)).encode()
        if r == 2:
            return rng.randbytes(rng.randint(1, 300))  # mostly not UTF-8
        if r == 3:
            return b"[" * rng.choice([1000, 100_000]) + b"]" * rng.randint(0, 10)
        if r == 4:
            return b""
        if r == 5:
            return b'{"format":"jupyter-pause/checkpoint@1","hmac":"0","blobs":' + b"{" * 50_000
        if r == 6:
            return json.dumps({"pid": rng.choice([10**30, -1, "x", 1.5]),
                               "started": rng.choice([1e308, -1e308, "nan", 0]),
                               "host": rng.choice(["x", None])}).encode().replace(
                                   b'"nan"', b"NaN")
        return json.dumps(self.manifest_like(stream)).encode()[: rng.randint(0, 200)]

    def plant(self, folder: str, stream: str, n: int) -> None:
        rng = self.rng
        os.makedirs(folder, exist_ok=True)
        for _ in range(n):
            name = _rand_name(rng) + rng.choice([".json", ".json", "", ".lease", ".tmp", ".part"])
            path = os.path.join(folder, name)
            if os.path.lexists(path):
                continue
            r = rng.random()
            if r < 0.12:
                os.symlink(self.victim, path)  # a link to a file outside the store
            elif r < 0.18:
                os.symlink(self.outside, path)  # a link to a folder outside the store
            elif r < 0.22:
                os.makedirs(path)  # a folder where a file is expected
            elif r < 0.26 and hasattr(os, "mkfifo"):
                os.mkfifo(path)  # opening it for reading would block forever
            else:
                with open(path, "wb") as f:
                    f.write(self.content(stream))
            if not os.path.islink(path):
                os.utime(path, OLD)


def _snapshot(root: str) -> dict[str, tuple[bytes, float]]:
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[p] = (fh.read(), os.stat(p).st_mtime)
    return out


def _allowed(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except (CheckpointError, GCError):
        return None


@pytest.mark.parametrize("seed", range(10))
def test_planted_files_change_nothing_outside_and_lose_nothing(tmp_path, seed):
    rng = random.Random(seed)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.ipynb"
    victim.write_text("precious notebook")
    marker = str(tmp_path / "code-ran.marker")
    evil = pickle.dumps({"pwn": _Evil(marker)})
    evil_digest = _digest(evil)
    # files outside that look like blobs: a linked blobs/<xx> folder must not expose them
    fake_sub = outside / evil_digest[:2]
    fake_sub.mkdir()
    for i in range(3):
        (fake_sub / (evil_digest[:2] + f"{i:062x}")).write_bytes(b"not ours")
    for p in [victim, *fake_sub.iterdir()]:
        os.utime(p, OLD)
    before = _snapshot(str(outside))

    root = tmp_path / "store"
    store = open_store(str(root))
    key_path = str(tmp_path / "checkpoint.key")
    key = load_or_create_key(key_path)
    values: dict[str, dict] = {}
    for s in STREAMS:
        for i in range(2):
            ns = {"s": s, "i": i, "payload": rng.randbytes(rng.choice([10, 5000, 1 << 21]))}
            cid = cp_write(ns, store, key=key, stream=s, keep=None).checkpoint_id
            values[cid] = ns

    planter = Planter(rng, store, str(outside), str(victim), marker, evil_digest)
    # the planted pickle, stored under its true digest: only a trusted reference could load it
    evil_path = os.path.join(root, "blobs", evil_digest[:2], evil_digest)
    if not os.path.exists(os.path.join(root, "blobs", evil_digest[:2])):
        if rng.random() < 0.5:
            os.symlink(fake_sub, os.path.join(root, "blobs", evil_digest[:2]))
        else:
            os.makedirs(os.path.dirname(evil_path))
    if not os.path.islink(os.path.dirname(evil_path)):
        with open(evil_path, "wb") as f:
            f.write(evil)
    folders = [root, root / "tmp", root / "pins", root / "manifests", root / "blobs",
               root / "manifests" / stream_slug("a.ipynb"),
               root / "manifests" / stream_slug("b.ipynb"),
               root / "manifests" / _rand_name(rng)]
    folders += [root / "blobs" / d for d in os.listdir(root / "blobs")
                if not os.path.islink(root / "blobs" / d)]
    for folder in folders:
        planter.plant(str(folder), rng.choice(STREAMS), rng.randint(3, 12))
    # every stream's newest "checkpoint" is a forgery with a name that sorts last
    for s in STREAMS:
        if hasattr(os, "mkfifo"):
            os.mkfifo(root / "manifests" / stream_slug(s) / "99991231T235959999999Z-fffff0.json")
        with open(root / "manifests" / stream_slug(s) / "99991231T235959999999Z-ffffff.json",
                  "w") as f:
            json.dump(planter.manifest_like(s), f)

    # checkpoint with retention: a third checkpoint of a.ipynb drops the oldest authentic one
    res = cp_write({"s": "a.ipynb", "i": 2}, store, key=key, stream="a.ipynb", keep=2)
    values[res.checkpoint_id] = {"s": "a.ipynb", "i": 2}
    a_ids = sorted(c for c, v in values.items() if v["s"] == "a.ipynb")
    expected = set(values) - {a_ids[0]}
    for s in STREAMS:
        rr = read(store, key=key, stream=s)
        assert rr.values == values[rr.manifest.id] and rr.manifest.id == max(
            c for c in expected if values[c]["s"] == s)
        assert any("unverifiable" in w for w in rr.warnings)
    _allowed(read, store, key=key, checkpoint_id="99991231T235959999999Z-ffffff")
    _allowed(read, store, key=key, checkpoint_id="../../outside/victim")
    listed = store.list(key=key)
    assert {m.id for m in listed} == expected
    assert all(m.verified for m in listed)
    _allowed(gc, store)
    result = _allowed(asyncio.run, run_gc(store_url=str(root), state_dir=None, keep=5,
                                          older_than=None, dry_run=False, key_path=key_path))
    assert result is not None and result["checkpoints"]["deleted"] == []
    assert result["unverified"] and render(result)
    # nothing outside changed, nothing planted ran, every authentic checkpoint reads back
    assert _snapshot(str(outside)) == before
    assert not os.path.exists(marker)
    assert {m.id for m in store.list(key=key)} == expected
    for cid in expected:
        assert read(store, key=key, checkpoint_id=cid).values == values[cid]
    assert not os.path.exists(marker)
