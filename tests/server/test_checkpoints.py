"""GET/DELETE checkpoints and POST gc: listing, protection of the way back, retention."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_pause.server import kernelguard

pytestmark = pytest.mark.timeout(180)


def _deleted(body):
    """Ids deleted by POST gc (the retention module's answer nests them under checkpoints)."""
    items = body["checkpoints"]["deleted"] if "checkpoints" in body else body["deleted"]
    return [c["id"] for c in items]


def _blobs_freed(body):
    blobs = body["blobs"]
    return blobs["deleted"], blobs.get("bytes_freed", blobs.get("bytes"))


async def _code(coro):
    try:
        r = await coro
        return r.code, json.loads(r.body) if r.body else None
    except HTTPClientError as e:
        return e.code, json.loads(e.response.body)


async def test_list_delete_and_gc(ws):
    nb = await ws.open_notebook("cp.ipynb")
    await ws.run(nb["kernel"]["id"], "n = 1")
    _, st = await ws.flight("pause")
    old = st["last_checkpoint"]["id"]
    _, st = await ws.flight("resume")
    await ws.run(st["last_report"]["kernels"][0]["kernel_id"], "n = 2")
    _, st = await ws.flight("pause")
    current = st["last_checkpoint"]["id"]
    assert current != old

    listing = (await ws.api("GET", "checkpoints"))["checkpoints"]
    assert [c["id"] for c in listing] == [current, old]  # newest first
    assert all(c["stream"].endswith("cp.ipynb") and c["bytes_total"] > 0 and c["variables"] >= 1
               for c in listing)

    # The checkpoint the paused workspace needs is never deleted.
    code, body = await _code(ws.fetch("jupyter-pause", "api", "checkpoints", current,
                                      method="DELETE"))
    assert code == 409 and "resume first" in body["message"]
    code, body = await _code(ws.fetch("jupyter-pause", "api", "gc", method="POST",
                                      body=json.dumps({"keep": 0, "older_than": 0, "dry_run": True})))
    assert code == 200 and _deleted(body) == [old], body
    assert any(current in p for p in body["protected"])
    assert len((await ws.api("GET", "checkpoints"))["checkpoints"]) == 2  # dry run

    code, _ = await _code(ws.fetch("jupyter-pause", "api", "checkpoints", old, method="DELETE"))
    assert code == 204
    code, body = await _code(ws.fetch("jupyter-pause", "api", "checkpoints", old,
                                      method="DELETE"))
    assert code == 404 and body["message"]

    _, st = await ws.flight("resume")
    assert st["state"] == "ready"
    body = await ws.api("POST", "gc", {"keep": 0, "older_than": 0})
    assert _deleted(body) == [current]
    deleted, freed = _blobs_freed(body)
    assert deleted >= 1 and freed > 0
    assert (await ws.api("GET", "checkpoints"))["checkpoints"] == []
    code, body = await _code(ws.fetch("jupyter-pause", "api", "gc", method="POST",
                                      body=json.dumps({"keep": -1})))
    assert code == 400


async def test_checkpoints_in_a_new_session_never_delete_what_the_pause_needs(ws):
    """%checkpoint's retention runs in the kernel, not the server: it must still keep the
    checkpoint a pause depends on, or Resume would find nothing to restore."""
    nb = await ws.open_notebook("keep.ipynb")
    await ws.run(nb["kernel"]["id"], "x = 41")
    _, st = await ws.flight("pause")
    assert st["state"] == "paused", st
    needed = st["last_checkpoint"]["id"]

    # No session can start a kernel while paused (kernelguard); a kernel that exists anyway
    # (another extension's, one a backend kept) checkpoints the notebook's stream over and over.
    with kernelguard.own_starts():
        kid = await ws.serverapp.kernel_manager.start_kernel(kernel_name="python3")
    await ws.run(kid, "%load_ext jupyter_pause\nx = 0")
    for _ in range(7):
        await ws.run(kid, "%checkpoint --stream keep.ipynb --keep 2")
    listing = [c["id"] for c in (await ws.api("GET", "checkpoints"))["checkpoints"]]
    assert needed in listing, listing
    assert len(listing) <= 3, listing  # retention still works for everything else

    _, st = await ws.flight("resume")
    assert st["state"] == "ready", st
    restored = [k for k in st["last_report"]["kernels"] if k["path"] == "keep.ipynb"]
    assert restored and restored[0]["checkpoint_id"] == needed, st["last_report"]
    assert (await ws.run(restored[0]["kernel_id"], "print(x)")).strip() == "41"
