"""gc end to end on a real local checkpoint store: every object and byte left is accounted for."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import ClassVar

import pytest

from jupyter_pause.checkpoint import (
    default_key_path,
    load_or_create_key,
    open_store,
    read,
    write,
)
from jupyter_pause.cli import main as cli_main
from jupyter_pause.cluster.base import Backend
from jupyter_pause.policy.gc import GCError, run_gc


def walk(root: str) -> tuple[int, int]:
    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    return len(files), sum(os.path.getsize(f) for f in files)


def blob_files(root: str) -> set[str]:
    out = set()
    for _d, _, fs in os.walk(os.path.join(root, "blobs")):
        out.update(fs)
    return out


@pytest.fixture()
def populated(tmp_path, monkeypatch):
    root = str(tmp_path / "store")
    store = open_store(root)
    # gc authenticates what it deletes: it loads the key from where the configuration says
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    key = load_or_create_key(default_key_path())
    shared = b"s" * 5000  # the same blob in every checkpoint of a.ipynb
    ids: dict[str, list[str]] = {"a.ipynb": [], "b.ipynb": []}
    for i in range(4):
        res = write({"shared": shared, "step": i, "data": bytes([i]) * (3000 + i)}, store,
                    key=key, stream="a.ipynb", keep=None)
        ids["a.ipynb"].append(res.checkpoint_id)
        time.sleep(0.01)
    for i in range(2):
        res = write({"other": bytes([100 + i]) * 2000}, store, key=key, stream="b.ipynb",
                    keep=None)
        ids["b.ipynb"].append(res.checkpoint_id)
        time.sleep(0.01)
    # a stray blob left by a crashed write long ago: nothing references it
    stray_dir = os.path.join(root, "blobs", "ff")
    os.makedirs(stray_dir, exist_ok=True)
    stray = os.path.join(stray_dir, "ff" + "0" * 62)
    with open(stray, "wb") as fh:
        fh.write(b"x" * 777)
    os.utime(stray, (time.time() - 86400, time.time() - 86400))
    # the workspace is paused on the OLDEST checkpoint of a.ipynb: it must survive any policy
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json").write_text(json.dumps(
        {"state": "paused", "pause": {"checkpoints": [ids["a.ipynb"][0]],
                                      "kernels": [{"checkpoint_id": ids["a.ipynb"][0]}]}}))
    return {"root": root, "store": store, "key": key, "ids": ids, "state_dir": str(state_dir)}


def run(**kw):
    return asyncio.run(run_gc(**kw))


def test_dry_run_changes_nothing_and_predicts_the_real_run(populated):
    p = populated
    before = walk(p["root"])
    dry = run(store_url=p["root"], state_dir=p["state_dir"], keep=1, older_than=None,
              dry_run=True)
    assert walk(p["root"]) == before
    real = run(store_url=p["root"], state_dir=p["state_dir"], keep=1, older_than=None,
               dry_run=False)
    assert [c["id"] for c in dry["checkpoints"]["deleted"]] == \
        [c["id"] for c in real["checkpoints"]["deleted"]]
    assert dry["blobs"] == real["blobs"]
    assert dry["remaining"] == real["remaining"]


def test_keep_one_counts_every_byte_and_object(populated):
    p = populated
    a, b = p["ids"]["a.ipynb"], p["ids"]["b.ipynb"]
    res = run(store_url=p["root"], state_dir=p["state_dir"], keep=1, older_than=None,
              dry_run=False)
    deleted = {c["id"] for c in res["checkpoints"]["deleted"]}
    assert deleted == {a[1], a[2], b[0]}  # a[0] is the way back of the pause; a[3], b[1] newest
    assert res["protected"] == [a[0]]
    left = {m.id for m in p["store"].list()}
    assert left == {a[0], a[3], b[1]}
    # nothing dangling: every blob a remaining manifest names exists, and is readable
    for cid, stream in ((a[0], "a.ipynb"), (a[3], "a.ipynb"), (b[1], "b.ipynb")):
        rr = read(p["store"], key=p["key"], stream=stream, checkpoint_id=cid)
        assert rr.values
    assert read(p["store"], key=p["key"], stream="a.ipynb", checkpoint_id=a[3]).values["step"] == 3
    # nothing orphaned: the blob files are exactly the referenced ones
    referenced = {d for m in p["store"].list() for d in m.blobs}
    assert blob_files(p["root"]) == referenced
    # the numbers printed are the numbers on disk
    n_files, n_bytes = walk(p["root"])
    r = res["remaining"]
    assert r["manifests"] + r["blobs"] + r["temp_files"] == n_files
    assert r["bytes"] == n_bytes
    assert (r["checkpoints"], r["streams"]) == (3, 2)
    assert res["blobs"]["bytes_freed"] >= 777 + 3001 + 3002  # stray + a1/a2 data blobs


def test_second_run_is_a_no_op(populated):
    p = populated
    run(store_url=p["root"], state_dir=p["state_dir"], keep=1, older_than=None, dry_run=False)
    before = walk(p["root"])
    res = run(store_url=p["root"], state_dir=p["state_dir"], keep=1, older_than=None,
              dry_run=False)
    assert res["checkpoints"]["deleted"] == [] and res["blobs"]["deleted"] == 0
    assert walk(p["root"]) == before


def test_older_than_only_narrows_what_keep_would_delete(populated):
    p = populated
    a, b = p["ids"]["a.ipynb"], p["ids"]["b.ipynb"]
    later = time.time() + 10 * 86400
    res = run(store_url=p["root"], state_dir=p["state_dir"], keep=1, older_than=86400,
              dry_run=True)
    assert res["checkpoints"]["deleted"] == []  # all younger than a day
    res = run(store_url=p["root"], state_dir=p["state_dir"], keep=10, older_than=86400,
              dry_run=False, now=later)
    assert res["checkpoints"]["deleted"] == []  # all within the newest 10
    res = run(store_url=p["root"], state_dir=p["state_dir"], keep=1, older_than=86400,
              dry_run=False, now=later)
    assert {c["id"] for c in res["checkpoints"]["deleted"]} == {a[1], a[2], b[0]}
    # keep 0 + older-than removes whole old notebooks, but never the pause's way back
    res = run(store_url=p["root"], state_dir=p["state_dir"], keep=0, older_than=86400,
              dry_run=False, now=later)
    assert {c["id"] for c in res["checkpoints"]["deleted"]} == {a[3], b[1]}
    assert {m.id for m in p["store"].list()} == {a[0]}
    assert p["store"].usage()["blobs"] == len(next(iter(p["store"].list())).blobs)


def test_keep_zero_is_no_count_limit(populated):
    p = populated
    before = {m.id for m in p["store"].list()}
    res = run(store_url=p["root"], state_dir=p["state_dir"], keep=0, older_than=None,
              dry_run=False)
    assert res["checkpoints"]["deleted"] == [] and res["checkpoints"]["remaining"] == 6
    assert {m.id for m in p["store"].list()} == before
    assert res["blobs"]["bytes_freed"] == 777  # only the stray blob


def test_refusals(populated):
    p = populated
    with pytest.raises(GCError, match="0 or more"):
        run(store_url=p["root"], state_dir=p["state_dir"], keep=-1, older_than=None,
            dry_run=False)


class OrderBackend(Backend):
    """Records how many checkpoints existed when the backend was asked to clean up."""

    name = "order-test"
    root = ""
    seen: ClassVar[list[int]] = []

    async def gc(self, *, keep, older_than, dry_run):
        self.seen.append(len(open_store(self.root).list()))
        return {"deleted": [{"name": "ps-old"}], "remaining": [{"name": "ps-new"}]}


def test_backend_first_so_no_snapshot_outlives_its_fallback(populated):
    p = populated
    OrderBackend.root, OrderBackend.seen = p["root"], []
    res = run(store_url=p["root"], state_dir=p["state_dir"], keep=1, older_than=None,
              dry_run=False, backend=OrderBackend())
    assert OrderBackend.seen == [6]  # called before any checkpoint was deleted
    assert res["backend"]["deleted"] == [{"name": "ps-old"}]
    assert res["order"][0].startswith("backend")


def test_cli_offline(populated, capsys):
    p = populated
    rc = cli_main(["gc", "--offline", "--store", p["root"], "--state-dir", p["state_dir"],
                   "--keep", "1", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "checkpoints: would delete 3, remaining 3" in out
    assert f"kept for resume: {p['ids']['a.ipynb'][0]}" in out
    rc = cli_main(["gc", "--offline", "--store", p["root"], "--state-dir", p["state_dir"],
                   "--keep", "1", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["via"] == "offline" and len(data["checkpoints"]["deleted"]) == 3
    assert data["remaining"]["bytes"] == walk(p["root"])[1]
    rc = cli_main(["gc", "--offline", "--store", p["root"], "--keep", "0"])
    assert rc == 0 and "checkpoints: deleted 0, remaining 3" in capsys.readouterr().out
