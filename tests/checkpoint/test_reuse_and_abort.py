"""Reuse and clean-up that must not cost another variable or checkpoint its data: storages with
equal bytes stay apart on reuse, an abort never deletes a blob another writer published, and a
deep pickler is stopped once its variable's time limit has passed."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_pause.checkpoint import goodblobs, reader, writer
from jupyter_pause.checkpoint.cache import WriteCache
from jupyter_pause.checkpoint.store import open_store

KEY = b"k" * 32


def test_equal_storages_stay_apart_on_reuse(tmp_path):
    torch = pytest.importorskip("torch")
    ns = {"a": torch.zeros(100_000), "b": torch.zeros(100_000)}
    c = WriteCache()
    writer.write(ns, str(tmp_path), key=KEY, cache=c)
    r = writer.write(ns, str(tmp_path), key=KEY, cache=c)
    assert r.bytes_written < 40_000  # still reused
    out = reader.read(str(tmp_path), key=KEY).values
    out["a"] += 1
    assert float(out["b"].sum()) == 0.0
    writer.write(out, str(tmp_path), key=KEY, cache=WriteCache())  # after a restore
    out = reader.read(str(tmp_path), key=KEY).values
    assert out["a"].untyped_storage().data_ptr() != out["b"].untyped_storage().data_ptr()


def test_abort_keeps_a_blob_another_writer_published(tmp_path):
    arr = np.arange(1 << 16, dtype=np.float64)
    scratch = open_store(str(tmp_path / "scratch"))
    blobs = writer.write({"x": arr}, scratch, key=KEY, stream="nb").manifest.blobs
    st = open_store(str(tmp_path / "store"))
    a = st.begin(writer.new_checkpoint_id())
    for d in blobs:
        with open(scratch.blob_path(d), "rb") as f:
            st.put_blob(a, [f.read()])
    goodblobs.forget_all()  # another process: knows none of a's blobs
    writer.write({"x": arr}, st, key=KEY, stream="nb")
    a.abort()
    assert (reader.read(st, key=KEY, stream="nb").values["x"] == arr).all()


_DEEP_SLOW = """
import tempfile, threading, time
from jupyter_pause.checkpoint import writer
class Slow:
    def __getstate__(self):
        time.sleep(3)
        return {}
deep = cur = []
for _ in range(50_000):
    cur.append([])
    cur = cur[0]
cur.append(Slow())
r = writer.write({"h": deep, "x": 1}, tempfile.mkdtemp(), key=b"k" * 32, unit_timeout=1.0)
print([v.status for v in r.variables], [t.name for t in threading.enumerate()
                                        if t.name == "jp-deep-pickle"])
"""


def test_deep_pickler_stopped_after_time_limit():
    # a subprocess: pytest-timeout's SIGALRM handler turns the time limit off in here
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _DEEP_SLOW], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "['skipped', 'saved'] []"
