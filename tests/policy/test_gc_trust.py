"""gc trusts only manifests it can authenticate where they are found (issue 10, case 2)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from jupyter_pause.checkpoint import load_or_create_key, open_store, write
from jupyter_pause.checkpoint.store import stream_slug
from jupyter_pause.cli import main as cli_main
from jupyter_pause.policy.gc import GCError, render, run_gc


def _forge(root: str, folder: str, name: str, stream: str, blobs: dict | None = None) -> str:
    d = os.path.join(root, "manifests", folder)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, name)
    with open(path, "w") as f:
        json.dump({"format": "jupyter-pause/checkpoint@1", "hmac": "0", "id": name[:-5],
                   "stream": stream, "created": "2999-01-01T00:00:00+00:00",
                   "blobs": blobs or {}}, f)
    return path


@pytest.fixture()
def five(tmp_path):
    root = str(tmp_path / "store")
    key_path = str(tmp_path / "checkpoint.key")
    key = load_or_create_key(key_path)
    store = open_store(root)
    ids = [write({"i": i, "data": bytes([i]) * 3000}, store, key=key, stream="victim.ipynb",
                 keep=None).checkpoint_id for i in range(5)]
    return {"root": root, "key_path": key_path, "key": key, "store": store, "ids": ids,
            "tmp": tmp_path}


def test_forged_newest_manifests_never_push_out_real_ones(five):
    p = five
    victim = p["tmp"] / "outside.txt"
    victim.write_text("x")
    os.utime(victim, (1, 1))
    forged = [_forge(p["root"], "new-folder", f"2999010{i}T000000000000Z-00000{i}.json",
                     "victim.ipynb", {str(victim): {"size": 1, "kind": "bundle"}})
              for i in range(5)]
    forged += [_forge(p["root"], stream_slug("victim.ipynb"),
                      f"2999020{i}T000000000000Z-00000{i}.json", "victim.ipynb")
               for i in range(3)]
    res = asyncio.run(run_gc(store_url=p["root"], state_dir=None, keep=5, older_than=None,
                             dry_run=False, key_path=p["key_path"]))
    assert res["checkpoints"]["deleted"] == []
    assert {m.id for m in p["store"].list(key=p["key"])} == set(p["ids"])
    assert all(os.path.exists(f) for f in forged) and victim.exists()
    assert len(res["unverified"]) == 8
    assert all(u["action"] == "unverified, left alone" for u in res["unverified"])
    assert "unverified, left alone: 8 file(s)" in render(res)
    # keep=2: exactly the 3 oldest authentic ones go, forgeries are not counted
    res = asyncio.run(run_gc(store_url=p["root"], state_dir=None, keep=2, older_than=None,
                             dry_run=False, key_path=p["key_path"]))
    assert [d["id"] for d in res["checkpoints"]["deleted"]] == sorted(p["ids"])[2::-1]
    assert {m.id for m in p["store"].list(key=p["key"])} == set(sorted(p["ids"])[3:])


def test_gc_without_the_key_deletes_nothing(five, tmp_path):
    p = five
    with pytest.raises(GCError, match="no checkpoint key"):
        asyncio.run(run_gc(store_url=p["root"], state_dir=None, keep=1, older_than=None,
                           dry_run=False, key_path=str(tmp_path / "missing.key")))
    assert len(p["store"].list(key=p["key"])) == 5
    # a foreign key authenticates nothing: everything is "unverified, left alone"
    other = str(tmp_path / "other.key")
    load_or_create_key(other)
    res = asyncio.run(run_gc(store_url=p["root"], state_dir=None, keep=1, older_than=None,
                             dry_run=False, key_path=other))
    assert res["checkpoints"]["deleted"] == [] and len(res["unverified"]) == 5
    assert len(p["store"].list(key=p["key"])) == 5


def test_cli_offline_gc_uses_the_key(five, capsys):
    p = five
    _forge(p["root"], stream_slug("victim.ipynb"), "29990101T000000000000Z-000000.json",
           "victim.ipynb")
    rc = cli_main(["gc", "--offline", "--store", p["root"], "--key", p["key_path"],
                   "--keep", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "checkpoints: deleted 1, remaining 4" in out
    assert "unverified, left alone: 1 file(s)" in out


def test_pins_protect_from_gc(five):
    p = five
    p["store"].pin(p["ids"][0])
    res = asyncio.run(run_gc(store_url=p["root"], state_dir=None, keep=1, older_than=None,
                             dry_run=False, key_path=p["key_path"]))
    left = {m.id for m in p["store"].list(key=p["key"])}
    assert left == {p["ids"][0], p["ids"][-1]} and res["pinned"] == [p["ids"][0]]


def test_gc_of_a_store_without_checkpoints_needs_no_key(tmp_path):
    root = tmp_path / "store"
    stray = root / "blobs" / "ab" / ("ab" + "0" * 62)
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"x")
    os.utime(stray, (1, 1))
    res = asyncio.run(run_gc(store_url=str(root), state_dir=None, keep=1, older_than=None,
                             dry_run=False, key_path=str(tmp_path / "none.key")))
    assert res["checkpoints"]["deleted"] == [] and res["blobs"]["deleted"] == 1
    assert not (tmp_path / "none.key").exists()  # gc never makes a key
