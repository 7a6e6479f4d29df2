"""jupyter_pause/checkpoint/FORMAT.md against real checkpoints.

The specification's field tables are parsed and compared with what a real write produces, both
ways: every field a manifest holds is documented, and every field documented as required is
written. The layout, encoding and signature rules are re-implemented here from the text, so a
change to the format that the document does not follow fails.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import itertools
import json
import os
import re
import struct
import threading
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest

from jupyter_pause import checkpoint as cp
from jupyter_pause.checkpoint import procstate
from jupyter_pause.checkpoint.manifest import FORMAT

pytestmark = pytest.mark.timeout(120)

SPEC = Path(cp.__file__).with_name("FORMAT.md")
_MARKER = re.compile(r"<!-- (fields|names): ([\w.]+) -->")


def spec_tables() -> dict[str, list[dict[str, str]]]:
    """Each marked table of the specification: rows as {column (lower case): cell text}."""
    lines = SPEC.read_text(encoding="utf-8").splitlines()
    out: dict[str, list[dict[str, str]]] = {}
    for i, line in enumerate(lines):
        m = _MARKER.fullmatch(line.strip())
        if not m:
            continue
        rows = []
        j = i + 1
        while j < len(lines) and lines[j].startswith("|"):
            rows.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
            j += 1
        assert len(rows) > 2, f"marker {m.group(2)} in {SPEC.name} is not followed by a table"
        head = [h.lower() for h in rows[0]]
        out[m.group(2)] = [dict(zip(head, r, strict=True)) for r in rows[2:]]
    return out


def names(table: list[dict[str, str]]) -> dict[str, bool]:
    """The first column's names (backticks stripped) -> whether the row says it is required."""
    out = {}
    for row in table:
        first = next(iter(row.values()))
        assert first.startswith("`") and first.endswith("`"), first
        out[first.strip("`")] = row.get("required", "yes") == "yes"
    return out


def check_fields(table: str, objects: list[dict[str, Any]]) -> None:
    """Both ways: no undocumented field in any object, every required field in each one."""
    documented = names(TABLES[table])
    assert objects, f"no {table} object to compare"
    for obj in objects:
        extra = set(obj) - set(documented)
        missing = {n for n, req in documented.items() if req} - set(obj)
        assert not extra, f"{table}: fields written but not in {SPEC.name}: {sorted(extra)}"
        assert not missing, f"{table}: required in {SPEC.name} but not written: {sorted(missing)}"


TABLES = spec_tables()


def slug_as_specified(stream: str) -> str:
    """Section 2's rule for a stream's folder name."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", stream).strip("._")[-60:] or "stream"
    return f"{readable}-{hashlib.sha256(stream.encode()).hexdigest()[:8]}"


def canonical_as_specified(d: dict[str, Any]) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class Unpicklable:
    """Refused by both picklers: recorded as skipped, with the reason."""

    def __reduce__(self) -> Any:
        raise TypeError("this object refuses to be pickled")


def _published(store_root: Path) -> tuple[Path, dict[str, Any], bytes]:
    files = list((store_root / "manifests").glob("*/*.json"))
    assert len(files) == 1, files
    raw = files[0].read_bytes()
    return files[0], json.loads(raw), raw


def test_tables_are_all_there():
    assert set(TABLES) == {"manifest", "variable", "group", "group.stream", "blob", "tensor",
                           "env", "liveness", "meta", "process", "process.entries", "blob.kind"}
    assert f"`{FORMAT}`" in SPEC.read_text(encoding="utf-8")


def test_a_written_checkpoint_is_what_the_spec_says(tmp_path, key):
    store_root = tmp_path / "store"
    stream = "work/Analysis (v2).ipynb"
    held = threading.Lock()
    held.acquire()
    namespace = {
        "small": [1, 2, 3],  # bundle, standard pickler
        "blob": os.urandom((1 << 20) + 10),  # a stream of 1 MiB or more: its own blob
        "arr": np.arange(1 << 18, dtype="float64"),  # 2 MiB: an out-of-band buffer
        "square": lambda v: v * v,  # dill
        "lock": held,  # a held lock: stale
        "bad": Unpicklable(),  # skipped
    }
    res = cp.write(namespace, str(store_root), key=key, stream=stream,
                   provenance={"small": {"execution_count": 3, "source": "small = [1, 2, 3]"}},
                   liveness={"token": "t", "pid": os.getpid()}, meta={"kind": "checkpoint"},
                   process_state=True)
    held.release()
    path, m, raw = _published(store_root)

    # encoding and signature (section 5)
    assert raw == canonical_as_specified(m)
    body = {k: v for k, v in m.items() if k != "hmac"}
    assert m["hmac"] == hmac.new(key, canonical_as_specified(body), hashlib.sha256).hexdigest()
    assert m["key_id"] == hmac.new(key, b"jupyter-pause key id", hashlib.sha256).hexdigest()[:16]

    # layout and names (section 2)
    assert m["format"] == FORMAT
    assert m["id"] == res.checkpoint_id == path.stem
    assert re.fullmatch(r"\d{8}T\d{12}Z-[0-9a-f]{6}", m["id"])
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", m["id"])
    assert path.parent.name == slug_as_specified(stream) and m["stream"] == stream
    for d, info in m["blobs"].items():
        f = store_root / "blobs" / d[:2] / d
        data = f.read_bytes()
        assert re.fullmatch(r"[0-9a-f]{64}", d)
        assert len(data) == info["size"] and blake3.blake3(data).hexdigest() == d
    assert m["bytes_total"] == sum(b["size"] for b in m["blobs"].values())
    assert list(m["blobs"]) == sorted(m["blobs"])
    if os.name != "nt":
        for folder in ("manifests", "blobs", "tmp", path.parent.relative_to(store_root)):
            assert (store_root / folder).stat().st_mode & 0o777 == 0o700, folder
        assert path.stat().st_mode & 0o777 == 0o600

    # every field table, both ways (section 6)
    check_fields("manifest", [m])
    check_fields("variable", m["variables"])
    check_fields("group", m["groups"])
    check_fields("group.stream", [g["stream"] for g in m["groups"]])
    check_fields("blob", list(m["blobs"].values()))
    check_fields("env", [m["env"]])
    check_fields("process", [m["process"]])

    # the values the tables name
    status = {v["name"]: v["status"] for v in m["variables"]}
    assert status == {"small": "saved", "blob": "saved", "arr": "saved", "square": "saved",
                      "lock": "stale", "bad": "skipped"}
    for v in m["variables"]:
        saved = v["status"] == "saved"
        assert (v["reason"] is None) == saved and (v["group"] is not None) == saved
        assert v["kind"] == type(namespace[v["name"]]).__name__
    assert next(v for v in m["variables"] if v["name"] == "small")["cell"] == {
        "execution_count": 3, "source": "small = [1, 2, 3]"}
    kinds = {b["kind"] for b in m["blobs"].values()}
    assert kinds == {"bundle", "pickle", "buffer"}
    assert kinds <= set(names(TABLES["blob.kind"]))
    assert {g["pickler"] for g in m["groups"]} == {"pickle", "dill"}
    for g in m["groups"]:
        s = g["stream"]
        assert m["blobs"][s["blob"]]["kind"] in ("bundle", "pickle")
        assert s["offset"] >= 0 and s["offset"] + s["length"] <= m["blobs"][s["blob"]]["size"]
        assert all(m["blobs"][b]["kind"] == "buffer" for b in g["buffers"])
    assert m["process"]["format"] == procstate.FORMAT
    assert set(m["process"]["entries"]) <= set(names(TABLES["process.entries"]))


PKG = Path(cp.__file__).parents[1]  # the jupyter_pause package
CLASS_HOME = {"Store": "store", "Txn": "store", "Scan": "store", "Manifest": "manifest"}
_CITATION = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)`")


def _module(parts: list[str]) -> tuple[Path, list[str]] | None:
    """The source file of the longest module prefix of ``parts`` (checkpoint modules first,
    then the package's), and the names left to find in it."""
    for base in (PKG / "checkpoint", PKG):
        for n in range(len(parts), 0, -1):
            stem = base.joinpath(*parts[:n])
            for f in (stem.with_suffix(".py"), stem / "__init__.py"):
                if f.is_file():
                    return f, parts[n:]
    return None


def _defines(body: list[ast.stmt], name: str) -> ast.stmt | None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return node
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and node.target.id == name):
            return node
    return None


def test_every_cited_function_exists():
    """The spec cites the code for each statement (``module.function``): each citation of a
    module or class of ours must name something defined there (read from the source, so no
    kernel-side module is imported into the test process)."""
    text = SPEC.read_text(encoding="utf-8")
    entries = set(names(TABLES["process.entries"]))
    ours = {p.stem for p in (PKG / "checkpoint").glob("*.py")} | {"procstate", "kernel", "server"}
    checked = 0
    for ref in sorted(set(_CITATION.findall(text)) - entries):
        parts = ref.split(".")
        if parts[0] in CLASS_HOME:
            parts = [CLASS_HOME[parts[0]], *parts]
        elif parts[0] not in ours:
            continue  # the standard library, a field path, a file name
        found = _module(parts)
        assert found is not None, f"{SPEC.name} cites {ref}: no such module"
        path, rest = found
        body: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
        for name in rest:
            node = _defines(body, name)
            assert node is not None, f"{SPEC.name} cites {ref}: {path.name} defines no {name}"
            body = getattr(node, "body", [])
        checked += 1
    assert checked > 80


def test_every_process_state_entry_is_specified():
    here = {e.name for e in procstate.registered()}
    documented = set(names(TABLES["process.entries"]))
    assert here - documented == set()
    # the kernel's entries (registered only inside a kernel, so read from their module)
    src = Path(cp.__file__).parents[1].joinpath("kernel", "ipystate.py").read_text()
    kernel = set(re.findall(r'Entry\(\s*"([^"]+)"', src))
    assert kernel and documented == here | kernel


def test_tensor_entries_and_packs_are_what_the_spec_says(tmp_path, key):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load as st_load

    store_root = tmp_path / "store"
    model = torch.nn.Linear(8, 4)
    ns = {"model": model, "ids": torch.arange(5, dtype=torch.int64),
          "odd": torch.zeros(3, dtype=torch.int16)}
    cp.write(ns, str(store_root), key=key)
    _, m, _ = _published(store_root)
    check_fields("tensor", m["tensors"])
    check_fields("blob", list(m["blobs"].values()))
    assert {b["kind"] for b in m["blobs"].values()} <= set(names(TABLES["blob.kind"]))
    packs: dict[str, dict[str, Any]] = {}
    for i, te in enumerate(m["tensors"]):
        assert te["key"] == f"t{i}" and te["device"] == "cpu"
        assert m["blobs"][te["blob"]]["kind"] == "tensors"
        assert te["pack_size"] == m["blobs"][te["blob"]]["size"]
        item = torch.empty(0, dtype=getattr(torch, te["dtype"])).element_size()
        assert te["shape"] == [te["nbytes"] // item]
        if te["blob"] not in packs:
            data = (store_root / "blobs" / te["blob"][:2] / te["blob"]).read_bytes()
            (n,) = struct.unpack_from("<Q", data, 0)
            assert n % 8 == 0
            header = json.loads(data[8 : 8 + n])
            assert header.pop("__metadata__") == {"format": "jupyter-pause"}
            spans = sorted(tuple(e["data_offsets"]) for e in header.values())
            assert spans[0][0] == 0 and spans[-1][1] == len(data) - 8 - n  # no gap, no tail
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
            assert set(st_load(data)) == set(header)  # a plain safetensors reader lists it
            packs[te["blob"]] = header
        begin, end = packs[te["blob"]][te["name"]]["data_offsets"]
        assert end - begin == te["nbytes"]
    for g in m["groups"]:
        assert all(0 <= t < len(m["tensors"]) for t in g["tensors"])


def test_a_kernel_checkpoint_has_the_specified_meta_and_liveness(tmp_path):
    from tests.kernel.conftest import Kernel, kernel_env

    env = kernel_env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    k = Kernel(env, str(work))
    try:
        k.ok("%load_ext jupyter_pause")
        k.ok("import numpy as np\nx = np.ones(3)")
        k.ok("%checkpoint")
        registry = set(k.eval(
            "sorted(e.name for e in __import__('jupyter_pause.checkpoint.procstate', "
            "fromlist=['registered']).registered())"))
    finally:
        k.stop()
    data = Path(env["JUPYTER_DATA_DIR"]) / "jupyter-pause"
    key = cp.load_or_create_key(str(data / "checkpoint.key"))
    store = cp.open_store(str(data / "checkpoints"))
    m = store.load_manifest(key, env["JPY_SESSION_NAME"])
    check_fields("meta", [m.meta])
    check_fields("liveness", [m.liveness])
    assert m.meta["kind"] == "checkpoint" and m.meta["trigger"] == "magic"
    assert m.meta["modules"].get("np") == "numpy"
    documented = set(names(TABLES["process.entries"]))
    assert set(m.process["entries"]) <= documented
    assert registry == documented
