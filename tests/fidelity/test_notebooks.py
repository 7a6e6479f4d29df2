"""Restore fidelity: each notebook of ``notebooks/`` run in a real kernel with nbclient,
``%checkpoint``, restored into a fresh kernel (``%restore --recompute``), every user variable
compared (value and aliasing) with the original. See bench/fidelity.py for the harness."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
BENCH = HERE.parents[1] / "bench"
NOTEBOOKS = sorted((HERE / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.timeout(240)


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


fidelity = _load("fidelity")
fidelity_fp = _load("fidelity_fp")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_restores_equal(path: Path, tmp_path: Path) -> None:
    r = fidelity.run_notebook(path, "pause", detail=True)
    assert r.error is None, r.error
    assert r.original, "the notebook defined no variables: the comparison would prove nothing"
    diffs = {n: fidelity.explain(r.original[n], r.restored.get(n)) for n in r.lost}
    assert not diffs, f"{diffs}\n{r.restore_output}"


def test_unsaveable_objects_are_reported_then_rebuilt_and_dill_loses_the_notebook() -> None:
    path = HERE / "notebooks" / "unsaveable.ipynb"
    plain = fidelity.run_notebook(path, "pause", recompute=False)
    # without --recompute they are missing, each reported with its reason
    assert sorted(plain.lost) == ["digest", "sock", "squares"]
    out = plain.restore_output
    assert "a generator cannot be saved" in out and "a socket cannot be saved" in out
    assert "a hashlib object cannot be saved" in out
    dill = fidelity.run_notebook(path, "dill")
    assert dill.error is None and set(dill.lost) == set(dill.original)  # dump_module fails


def test_fingerprints_see_values_and_aliasing() -> None:
    np = pytest.importorskip("numpy")
    fps = fidelity_fp.fingerprints
    a = [1, 2]
    shared, copied = fps({"a": a, "b": a}), fps({"a": a, "b": list(a)})
    assert shared["a"] == copied["a"] and shared["b"] != copied["b"]
    base = np.arange(6.0)
    view, copy = fps({"x": base, "v": base[2:]}), fps({"x": base, "v": base[2:].copy()})
    assert view != copy  # the variable met second carries the link
    assert fps({"x": [1.0]})["x"] != fps({"x": [1.5]})["x"]

    class P:
        def __init__(self, v: int) -> None:
            self.v = v

    assert fps({"p": P(1)})["p"] == fps({"p": P(1)})["p"] != fps({"p": P(2)})["p"]
