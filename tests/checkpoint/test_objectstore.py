"""gs:// and s3:// checkpoints against real servers over HTTP (gcp-storage-emulator through
gcsfs, moto's server through s3fs): round trip, tampering, memory bound, failed and vanished
uploads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import numpy as np
import pytest

from jupyter_pause.checkpoint import (
    CheckpointError,
    IntegrityError,
    credentials,
    gc,
    objectstore,
    open_store,
    read,
    uploads,
    write,
)

from . import emulators  # sets GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT before gcsfs is imported
from .helpers import ROOT, SideEffect

BOUND = "16M"


def _store(srv, port: int | None = None, **kw):
    return open_store(srv.url(kw.pop("path", "ckpt")), storage_options=srv.options(port),
                      memory=kw.pop("memory", BOUND), **kw)


def _objects(srv, path: str = "ckpt") -> list[str]:
    fs = srv.fs()
    return sorted(p.split(f"{srv.bucket}/{path}/", 1)[1] for p in fs.find(f"{srv.bucket}/{path}"))


def _pending_uploads(srv) -> list[str]:
    """S3 multipart uploads not completed nor aborted (GCS has no listing of those)."""
    if srv.kind != "s3":
        return []
    fs = srv.fs()
    out = fs.call_s3("list_multipart_uploads", Bucket=srv.bucket)
    return [u["Key"] for u in out.get("Uploads", [])]


def test_round_trip_numpy_torch_and_objects(object_server, key):
    torch = pytest.importorskip("torch")
    srv = object_server
    model = torch.nn.Linear(64, 32)
    rng = np.random.default_rng(0)
    ns = {
        "arr": rng.random(2_000_000),  # 16 MB out-of-band buffer: several parts
        "w": torch.randn(3_000_000),  # 12 MB in a tensor pack
        "model": model,
        "view": model.weight[1:3],
        "plain": {"k": [1, 2, 3], "s": "text"},
        "f": lambda x: x + 1,
    }
    res = write(ns, _store(srv, path="rt"), key=key)
    assert all(v.status == "saved" for v in res.variables), res.variables
    rr = read(_store(srv, path="rt"), key=key)
    out = rr.values
    np.testing.assert_array_equal(out["arr"], ns["arr"])
    torch.testing.assert_close(out["w"], ns["w"])
    torch.testing.assert_close(out["model"].weight, model.weight)
    assert out["view"].untyped_storage().data_ptr() == out["model"].weight.untyped_storage().data_ptr()
    assert out["plain"] == ns["plain"] and out["f"](1) == 2
    assert out["arr"].flags.writeable
    files = _objects(srv, "rt")
    assert not [f for f in files if f.startswith("tmp/")], files
    assert _pending_uploads(srv) == []
    # incremental: nothing changed, nothing uploaded
    again = write(ns, _store(srv, path="rt"), key=key)
    assert again.bytes_written < 1 << 20
    # retention + gc leave exactly the blobs of the newest checkpoint
    last = write({"y": 1}, _store(srv, path="rt"), key=key, keep=1)
    gc(_store(srv, path="rt"))
    blobs = {f.rsplit("/", 1)[1] for f in _objects(srv, "rt") if f.startswith("blobs/")}
    assert blobs == set(last.manifest.blobs)
    assert read(_store(srv, path="rt"), key=key).values == {"y": 1}


def test_tampered_blob_is_refused_before_anything_is_unpickled(object_server, key, tmp_path):
    srv = object_server
    marker = str(tmp_path / "unpickled")
    arr = np.random.default_rng(1).random(1_500_000)
    res = write({"arr": arr, "probe": SideEffect(marker)}, _store(srv, path="tamper"), key=key)
    big = next(d for d, b in res.manifest.blobs.items() if b["size"] >= arr.nbytes)
    store = _store(srv, path="tamper")
    path = store.blob_path(big)
    data = bytearray(store.fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed
    store.fs.pipe_file(path, bytes(data))
    with pytest.raises(IntegrityError, match="corrupt"):
        read(_store(srv, path="tamper"), key=key)
    store.fs.pipe_file(path, bytes(data[:-10]))
    with pytest.raises(IntegrityError, match="wrong size"):
        read(_store(srv, path="tamper"), key=key)
    assert not os.path.exists(marker)


class _PeakRSS:
    """Resident memory of this process, sampled from a thread until stopped."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.002):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> _PeakRSS:
        self.t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.t.join()

    @property
    def extra(self) -> int:
        return self.peak - self.base


def test_a_checkpoint_six_times_the_bound_stays_within_it(object_server, key):
    torch = pytest.importorskip("torch")
    srv = object_server
    bound = objectstore.parse_size(BOUND)
    rng = np.random.default_rng(2)
    ns = {"arr": rng.random(6 << 20), "w": torch.randn(12 << 20)}  # 48 MiB + 48 MiB
    state = ns["arr"].nbytes + ns["w"].numel() * 4
    store = _store(srv, path="mem")
    # The HTTP client's one-time set-up is not the upload's: a smaller state of other values goes
    # first, through the same multipart path.
    write({"arr": rng.random(3 << 20), "w": torch.randn(6 << 20)}, store, key=key)
    # Resident memory, with tracemalloc off (its own tables are native memory too: 8-13 MB over
    # an upload like this one). The parts are given back to the system after each request
    # (objectstore.give_back_freed_memory), so they count again here: what the upload adds is
    # the bound plus the client's own buffers and the heap's slack (0-19 MB measured).
    with _PeakRSS() as rss:
        res = write(ns, store, key=key)
    assert all(v.status == "saved" for v in res.variables)
    assert store.budget.peak <= bound
    assert rss.extra < bound + (8 << 20) < state / 3, (rss.extra, bound, state)
    # every Python allocation of an upload of changed values (parts, request bodies, pickles)
    # together: the parts are the bound, the rest (HTTP clients, the manifest) is small
    ns = {"arr": ns["arr"] + 1, "w": ns["w"] + 1}
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        res = write(ns, store, key=key)
        py_peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert all(v.status == "saved" for v in res.variables)
    assert res.bytes_written >= state
    assert store.budget.peak <= bound
    assert py_peak <= bound + (4 << 20), (py_peak, bound)

    reader = _store(srv, path="mem")
    read(reader, key=key, checkpoint_id=store.list(key=key)[-1].id)  # the client's set-up
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        rr = read(reader, key=key)
        py_peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    # the restored data lands in private mappings (the state itself); ranges in flight are
    # what the bound limits
    assert py_peak <= bound + (4 << 20), (py_peak, bound)
    assert reader.budget.peak <= bound
    np.testing.assert_array_equal(rr.values["arr"], ns["arr"])
    torch.testing.assert_close(rr.values["w"], ns["w"])


def test_tensor_packs_are_cut_to_the_stores_pack_size(object_server, key):
    """An object is one upload stream: new tensors go into packs of at most ``pack_max`` (a
    larger tensor alone in its own), and they all come back."""
    torch = pytest.importorskip("torch")
    srv = object_server
    store = _store(srv, path="packs")
    store.pack_max = 3 << 20
    gen = torch.Generator().manual_seed(5)
    ns = {"small": [torch.randn(1 << 18, generator=gen) for _ in range(10)],  # 1 MiB each
          "big": torch.randn(1 << 20, generator=gen)}  # 4 MiB: over pack_max, alone
    res = write(ns, store, key=key)
    m = store.load_manifest(key, checkpoint_id=res.checkpoint_id)
    packs = {b: meta["size"] for b, meta in m.blobs.items() if meta["kind"] == "tensors"}
    big = {e["blob"] for e in m.tensors if e["nbytes"] == 4 << 20}
    assert len(packs) >= 5, packs  # 14 MiB in packs of 3 MiB or a lone larger tensor
    assert all(size <= store.pack_max + (64 << 10) for b, size in packs.items() if b not in big)
    assert len(big) == 1 and sum(e["blob"] in big for e in m.tensors) == 1
    rr = read(_store(srv, path="packs"), key=key)
    for a, b in zip(rr.values["small"], ns["small"], strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(rr.values["big"], ns["big"])


def test_a_forked_writer_gives_back_an_object_stores_storages_only_from_packs_it_keeps(
        object_server, key):
    """On an object store a pack is not read back to be rewritten (it would be a download): a
    forked writer (``done_with``) gives back a storage only once its old pack is sure to be kept,
    and keeps such a pack even when the pickling then saves less than half of it (a variable
    skipped), rather than rewrite bytes it no longer has in memory. Locally the same write
    copies them from the old pack (test_incremental)."""
    torch = pytest.importorskip("torch")
    from jupyter_pause.checkpoint import WriteCache

    store = _store(object_server, path="giveback")
    a = [torch.full((1 << 18,), float(i)) for i in range(3)]  # 1 MiB each, one pack of 8
    b = [torch.full((1 << 18,), float(10 + i)) for i in range(5)]
    ns = {"a": a, "b": {"ts": b}}
    cache = WriteCache()
    r1 = write(ns, store, key=key, cache=cache)
    (pack,) = {e["blob"] for e in r1.manifest.tensors}
    given: list[int] = []

    def done_with(storages):
        given.extend(us.data_ptr() for us in storages)
        for us in storages:  # as a forked writer's memory is gone: a rewrite would save this
            torch.empty(0, dtype=torch.uint8).set_(us).fill_(0xFF)

    # 6 of the 8 changed: the pack falls below half and its 2 unchanged storages are rewritten,
    # from memory, so neither is given back
    for t in (*a[2:], *b):
        t.add_(100.0)  # to bytes no pack holds
    r2 = write(ns, store, key=key, cache=cache, done_with=done_with)
    assert given == [] and pack not in {e["blob"] for e in r2.manifest.tensors}
    expected = [t.clone() for t in a]
    # now b cannot be pickled: prehash gave back all 8 (half of each pack reused), the pickling
    # saves 3: the packs are kept as they are
    ns["b"]["g"] = (i for i in range(3))
    r3 = write(ns, store, key=key, cache=cache, done_with=done_with)
    assert len(given) == 8, len(given)
    assert {v.name: v.status for v in r3.variables}["b"] == "skipped"
    assert {e["blob"] for e in r3.manifest.tensors} <= {e["blob"] for e in r2.manifest.tensors}
    assert r3.bytes_written < 1 << 20, r3.bytes_written
    got = read(_store(object_server, path="giveback"), key=key,
               checkpoint_id=r3.checkpoint_id).values["a"]
    assert all(torch.equal(x, y) for x, y in zip(got, expected, strict=True))


def test_a_failed_upload_is_aborted_and_the_previous_checkpoint_stays(object_server, key,
                                                                      monkeypatch):
    srv = object_server
    first = write({"gen": 1}, _store(srv, path="fail"), key=key)
    before = _objects(srv, "fail")
    cls = uploads._S3Upload if srv.kind == "s3" else uploads._GcsUpload
    real = cls.send
    sent = {"n": 0}
    big = np.random.default_rng(3).random(3_000_000)  # 24 MB: several parts

    def flaky(self, buf, held):
        if self.size < big.nbytes:
            # the write's other blob (its small pickle bundle) runs on the pool's other
            # thread and may send before or after the break: counted apart
            return real(self, buf, held)
        sent["n"] += 1
        if sent["n"] == 3:  # two parts are on the server, then the connection breaks
            self.budget.release(held)
            raise ConnectionResetError(104, "Connection reset by peer")
        return real(self, buf, held)

    monkeypatch.setattr(cls, "send", flaky)
    with pytest.raises(CheckpointError) as ei:
        write({"gen": 2, "big": big}, _store(srv, path="fail"), key=key)
    msg = str(ei.value)
    assert "failed after" in msg and "ConnectionResetError" in msg, msg
    assert "earlier checkpoints are intact" in msg
    if srv.kind == "s3":
        assert "the partial upload was aborted" in msg, msg
    else:  # the emulator does not implement cancelling (HTTP 501); GCS itself answers 499
        assert ("the partial upload was aborted" in msg
                or "GCS drops an unfinished resumable upload after a week" in msg), msg
    assert "\n" not in msg
    assert sent["n"] == 3
    assert _pending_uploads(srv) == []
    assert _objects(srv, "fail") == before
    assert read(_store(srv, path="fail"), key=key).values == {"gen": 1}
    assert read(_store(srv, path="fail"), key=key).manifest.id == first.checkpoint_id


@pytest.mark.parametrize("parts", ["one", "many"])
def test_upload_commits_only_what_hashes_to_the_name(object_server, parts):
    from jupyter_pause.checkpoint.store import blob_hasher

    srv = object_server
    fs = srv.fs()
    data = np.random.default_rng(5).bytes(20 << 20 if parts == "many" else 1000)
    h = blob_hasher()
    h.update(data)
    digest = h.hexdigest()
    budget = objectstore.Budget(objectstore.parse_size(BOUND))
    path = f"{srv.bucket}/direct/{digest}"
    pieces = [data[:333], data[333:]]
    uploads.upload(fs, path, lambda: pieces, len(data), digest, blob_hasher(), budget)
    assert fs.cat_file(path) == data
    assert budget.held == 0
    got = bytearray(len(data))
    h2 = blob_hasher()
    assert objectstore.download(fs, path, len(data), h2, got, budget) == len(data)
    assert bytes(got) == data and h2.hexdigest() == digest and budget.held == 0
    # the bytes changed between naming and sending: nothing is stored under the name
    flipped = [pieces[0], bytes([pieces[1][0] ^ 1]) + pieces[1][1:]]
    other = f"{srv.bucket}/direct/other-{parts}"
    with pytest.raises(CheckpointError, match="changed while it was being uploaded"):
        uploads.upload(fs, other, lambda: flipped, len(data), digest, blob_hasher(), budget)
    assert not fs.exists(other)
    assert _pending_uploads(srv) == [] and budget.held == 0


def test_each_parts_memory_is_given_back_when_its_request_ends(object_server, monkeypatch):
    """glibc keeps freed parts in its heaps once it has raised its mmap threshold to their
    size; the upload hands them back after every request (bench_objectstore: 293 MiB of RSS
    for a 256 MiB bound over 4 GiB to S3 without it, 195 MiB with it)."""
    import platform

    from jupyter_pause.checkpoint.store import blob_hasher

    if platform.libc_ver()[0] == "glibc":
        assert objectstore._TRIM is not None  # the binding to malloc_trim resolved
    srv = object_server
    fs = srv.fs()
    data = np.random.default_rng(6).bytes(12 << 20)
    h = blob_hasher()
    h.update(data)
    budget = objectstore.Budget(objectstore.parse_size(BOUND))
    calls = []
    monkeypatch.setattr(uploads, "give_back_freed_memory", lambda: calls.append(1))
    path = f"{srv.bucket}/trim/{h.hexdigest()}"
    uploads.upload(fs, path, lambda: [data], len(data), h.hexdigest(), blob_hasher(), budget)
    part = objectstore.part_size(objectstore.kind(fs), budget.limit)
    assert len(calls) == -(-len(data) // part) > 1  # once per part sent
    assert fs.cat_file(path) == data and budget.held == 0


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.checkpoint import emulators
import numpy as np
from jupyter_pause.checkpoint import CheckpointError, load_or_create_key, open_store, write
from jupyter_pause.checkpoint import uploads

kind, url, opts, key_path = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
if kind == "gcs":
    # gcsfs retries a lost server for ~60 s (fixed backoff); keep the test short
    import asyncio, types, gcsfs.retry
    fast = lambda s: asyncio.sleep(0.01)
    gcsfs.retry.asyncio = types.SimpleNamespace(sleep=fast)
else:
    opts["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 2}
store = open_store(url, storage_options=opts, memory="16M")
if kind == "s3":
    store.fs.retries = 2
key = load_or_create_key(key_path)
write({"gen": 1}, store, key=key, keep=None)
print("FIRST", flush=True)
cls = uploads._S3Upload if kind == "s3" else uploads._GcsUpload
real, paused = cls.send, []
def send(self, buf, held):
    if self.began and not paused:  # a multipart/resumable upload is open: now the server goes
        paused.append(1)
        print("UPLOADING", flush=True)
        sys.stdin.readline()
    return real(self, buf, held)
cls.send = send
try:
    write({"gen": 2, "big": np.random.default_rng(4).random(3_000_000)}, store, key=key,
          keep=None)
    print("RESULT " + json.dumps({"ok": True}), flush=True)
except CheckpointError as e:
    print("RESULT " + json.dumps({"ok": False, "error": str(e)}), flush=True)
"""


def test_server_vanishing_mid_upload_leaves_the_previous_checkpoint(object_server, key,
                                                                   tmp_path):
    srv = object_server
    relay = emulators.Relay(srv.port)
    key_path = str(tmp_path / "keys" / "checkpoint.key")  # the fixture's key file
    url = srv.url("vanish")
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), ROOT, srv.kind, url,
         json.dumps(srv.options(relay.port)), key_path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    try:
        assert p.stdout.readline().strip() == "FIRST"
        assert p.stdout.readline().strip() == "UPLOADING"
        relay.kill()
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=240)  # the writer must give up and exit, not hang
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        relay.kill()
    assert p.returncode == 0, err[:3000]
    result = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
    assert result["ok"] is False
    msg = result["error"]
    assert "earlier checkpoints are intact" in msg and "\n" not in msg, msg
    # Which request meets the dead server first is a race: the paused upload (it says how far
    # it got and what it left) or another blob's request (nothing of that one was published).
    if "failed after" in msg:
        assert "could not be aborted" in msg or "nothing of it reached the store" in msg, msg
    else:
        assert "writing a blob failed" in msg and "was not published" in msg, msg
    store = _store(srv, path="vanish")
    assert read(store, key=key).values == {"gen": 1}
    if srv.kind == "s3":  # the upload opened before the server went away is still there
        assert len(_pending_uploads(srv)) == 1
    # what the dead writer left (its lease; on S3 the invisible parts) goes at the next gc
    gc(store)
    assert _pending_uploads(srv) == []
    assert not [f for f in _objects(srv, "vanish") if f.startswith("tmp/")]
    assert read(store, key=key).values == {"gen": 1}


def test_describe_credentials_names_each_ecosystems_source(tmp_path, monkeypatch):
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "AWS_PROFILE",
                "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_ENDPOINT_URL", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    d = credentials.describe_credentials
    assert "Workload Identity" in d("gs://b/x") and "not probed" in d("gs://b/x")
    key = tmp_path / "sa.json"
    key.write_text(json.dumps({"type": "service_account"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    assert "GOOGLE_APPLICATION_CREDENTIALS" in d("gs://b/x") and "service account key" in d(
        "gs://b/x")
    assert "anonymous" in d("gs://b/x", {"token": "anon", "endpoint_url": "http://h:1"})
    assert "no credentials found" in d("s3://b/x")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    assert "environment variables" in d("s3://b/x")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "aws-credentials").write_text("[default]\naws_access_key_id = A\n"
                                              "aws_secret_access_key = B\n")
    assert "shared credentials file" in d("s3://b/x")
    assert "storage_options" in d("s3://b/x", {"key": "k", "secret": "s"})
    assert "no credentials" in d(str(tmp_path))
