"""Property test: random sequences of mutations, checkpoints, restores, process deaths and damage
to the store, against a model of what must come back.

The model is the simplest possible one: the values as of the last checkpoint that reported
success. Whatever the sequence, a restore gives exactly those values back, or refuses with an
IntegrityError when the store was damaged after that checkpoint, and the next checkpoint after
any damage is whole again. A "process death" drops everything the process knew (its write cache,
the blobs it had vouched for, the storages it had restored), as a kernel restart or a new pod
does. Mutations include the writes torch's version counter does not see (``.data``, numpy views
of tensors, a parameter's ``.data``) and the ones it does.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from jupyter_pause.checkpoint import (
    IntegrityError,
    WriteCache,
    goodblobs,
    load_or_create_key,
    open_store,
    read,
    write,
)
from jupyter_pause.checkpoint import cache as cache_mod

TENSORS = ("w", "b", "b2", "big")
ARRAYS = ("arr", "arr2")


def _fresh_namespace() -> dict:
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(32, 16)
    return {
        "w": torch.randn(20_000, generator=g),
        "b": torch.zeros(5_000),
        "b2": torch.zeros(5_000),  # equal bytes to b, its own memory
        "big": torch.randn(300_000, generator=g),  # own pack shard territory (over 1 MiB)
        "lin": lin,
        "view": lin.weight[2:4],  # shares the module's storage
        "arr": np.arange(200_000, dtype=np.float64),
        "arr2": np.zeros(1000),
        "meta": {"step": 0, "names": ["a"]},
    }


def _snapshot(ns: dict) -> dict:
    """A deep, independent copy of the values to compare with later."""
    out = {}
    for k, v in ns.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.detach().clone()
        elif isinstance(v, torch.nn.Module):
            out[k] = {n: p.detach().clone() for n, p in v.state_dict().items()}
        else:
            out[k] = copy.deepcopy(v)
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want), (sorted(got), sorted(want))
    for k, w in want.items():
        g = got[k]
        if isinstance(g, torch.Tensor):
            assert torch.equal(g.detach(), w), k
        elif isinstance(g, torch.nn.Module):
            sd = g.state_dict()
            assert set(sd) == set(w), k
            for n, t in w.items():
                assert torch.equal(sd[n], t), f"{k}.{n}"
        elif isinstance(g, np.ndarray):
            assert np.array_equal(g, w), k
        else:
            assert g == w, k
    # shared storage survives: the view is still a view of the module's weight
    assert got["view"].untyped_storage().data_ptr() == got["lin"].weight.untyped_storage().data_ptr()
    # and nothing else is shared: tensors with equal bytes come back as separate memories
    ptrs = [got[k].untyped_storage().data_ptr() for k in TENSORS]
    assert len(set(ptrs)) == len(ptrs), dict(zip(TENSORS, ptrs, strict=False))


class CheckpointLifecycle(RuleBasedStateMachine):
    @initialize(tmp=st.just(None))
    def setup(self, tmp: None) -> None:
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="jp-prop-")
        self.store = open_store(os.path.join(self.dir, "store"))
        self.key = load_or_create_key(os.path.join(self.dir, "key"))
        self.ns = _fresh_namespace()
        self.cache = WriteCache()
        self.saved: dict | None = None  # the model: values at the last successful checkpoint
        self.saved_id: str | None = None
        self.damaged = False  # a blob of the saved checkpoint was damaged since it was written

    # -- mutations: torch sees some of them, not all ------------------------------------------
    @rule(name=st.sampled_from(TENSORS), i=st.integers(0, 4999), v=st.floats(-1e3, 1e3))
    def write_through_data(self, name: str, i: int, v: float) -> None:
        self.ns[name].data[i] = v

    @rule(name=st.sampled_from(TENSORS), i=st.integers(0, 4999), v=st.floats(-1e3, 1e3))
    def write_through_numpy_view(self, name: str, i: int, v: float) -> None:
        self.ns[name].numpy()[i] = v

    @rule(name=st.sampled_from(TENSORS), v=st.floats(-10, 10))
    def in_place_op(self, name: str, v: float) -> None:
        with torch.no_grad():
            self.ns[name].add_(v)

    @rule(i=st.integers(0, 15), v=st.floats(-10, 10))
    def parameter_data(self, i: int, v: float) -> None:
        self.ns["lin"].bias.data[i] = v

    @rule(v=st.floats(-10, 10))
    def through_view(self, v: float) -> None:
        with torch.no_grad():
            self.ns["view"][0, 0] = v  # the module's weight changes too

    @rule(name=st.sampled_from(TENSORS))
    def replace_tensor(self, name: str) -> None:
        self.ns[name] = torch.full_like(self.ns[name], 3.0)

    @rule(name=st.sampled_from(ARRAYS), i=st.integers(0, 999), v=st.floats(-1e3, 1e3))
    def numpy_in_place(self, name: str, i: int, v: float) -> None:
        self.ns[name][i] = v

    @rule(step=st.integers(0, 10**6))
    def python_object(self, step: int) -> None:
        self.ns["meta"]["step"] = step
        self.ns["meta"]["names"].append(str(step % 7))

    # -- the lifecycle ------------------------------------------------------------------------
    @rule()
    def checkpoint(self) -> None:
        r = write(self.ns, self.store, key=self.key, cache=self.cache, keep=3)
        assert all(v.status == "saved" for v in r.variables), r.variables
        self.saved, self.saved_id, self.damaged = _snapshot(self.ns), r.checkpoint_id, False

    @rule()
    def process_dies(self) -> None:
        """A kernel restart or a new pod: nothing of this process's memory survives."""
        self.cache = WriteCache()
        goodblobs.forget_all()
        cache_mod.forget_restored()
        self.ns = _fresh_namespace()

    @precondition(lambda self: self.saved is not None)
    @rule()
    def restore(self) -> None:
        try:
            got = read(self.store, key=self.key, checkpoint_id=self.saved_id).values
        except IntegrityError:
            assert self.damaged, "a checkpoint that was never damaged must restore"
            return
        assert not self.damaged, "a damaged checkpoint restored without a word"
        _assert_same(got, self.saved)
        self.ns = got  # work goes on in the restored values, as after a resume

    @precondition(lambda self: self.saved_id is not None)
    @rule(which=st.integers(0, 10**6), where=st.floats(0, 1, exclude_max=True))
    def damage_a_blob(self, which: int, where: float) -> None:
        """One byte of one blob of the last checkpoint flipped in place (same size)."""
        m = self.store.load_manifest(self.key, checkpoint_id=self.saved_id)
        digests = sorted(m.blobs)
        path = self.store.blob_path(digests[which % len(digests)])
        size = os.path.getsize(path)
        if size == 0:
            return
        off = int(where * size)
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x5A]))
        self.damaged = True

    def teardown(self) -> None:
        import shutil

        if getattr(self, "dir", None):
            shutil.rmtree(self.dir, ignore_errors=True)

    @invariant()
    def the_store_holds_no_temp_files(self) -> None:
        if getattr(self, "store", None) is None:
            return
        tmp = os.path.join(self.store.root, "tmp")
        assert not [f for f in os.listdir(tmp) if f.endswith(".part")] if os.path.isdir(tmp) else True


CheckpointLifecycle.TestCase.settings = settings(
    max_examples=int(os.environ.get("JP_PROPERTY_EXAMPLES", "40")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),  # CI: the same sequences every run; locally: new ones
)
test_checkpoint_lifecycle = CheckpointLifecycle.TestCase
