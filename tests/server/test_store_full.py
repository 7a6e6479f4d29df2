"""A pause whose store runs out of space fails with the reason ``storage_full``: the kernel
sends its exception's type across the bridge and the server maps that type, not the message.
The full disk is a real one: a tiny tmpfs (the conftest's ``mount_tmpfs``)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pause_config(mount_tmpfs):
    store = mount_tmpfs("1m") / "store"
    return {"PauseApp": {"store_url": str(store)}, "LocalBackend": {}}


async def test_full_store_fails_the_pause_as_storage_full(ws, jp_serverapp, pause_config):
    nb = await ws.open_notebook("nb.ipynb")
    kid = nb["kernel"]["id"]
    # 3 MiB of random floats (incompressible) into 1 MiB of space
    await ws.run(kid, "import numpy as np\nbig = np.random.default_rng(0).random(400_000)")

    _, st = await ws.flight("pause", {"trigger": "manual"})
    assert st["state"] == "failed", st
    failed = [e for e in ws.journal() if e["event"] == "failed"][-1]
    assert failed["step"] == "checkpointing" and failed["reason"] == "storage_full", failed
    # nothing was stopped: the kernel runs on with its variables
    assert kid in jp_serverapp.kernel_manager
    assert (await ws.run(kid, "print(big.shape[0])")).strip() == "400000"
