"""A pause whose checkpoint store cannot be written fails, and changes nothing.

The configured store is the only one ever used: no fallback to the library's default store.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_pause.checkpoint import default_store_url

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pause_config(tmp_path, request):
    if hasattr(request, "param"):
        return request.param
    blocker = tmp_path / "afile"
    blocker.write_text("a regular file where the store's parent directory should be")
    return {"PauseApp": {"store_url": str(blocker / "store")}, "LocalBackend": {}}


async def test_unwritable_store_fails_the_pause_and_keeps_the_kernel(
    ws, jp_serverapp, pause_config, pause_dirs, tmp_path
):
    store_url = pause_config["PauseApp"]["store_url"]
    nb = await ws.open_notebook("nb.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "v = 41")

    _, st = await ws.flight("pause", {"trigger": "manual"})
    assert st["state"] == "failed", st
    assert "nb.ipynb" in st["reason"] and store_url in st["reason"], st["reason"]
    assert st["hint"].startswith("Your kernels are untouched"), st["hint"]
    assert st["last_checkpoint"] is None
    # The kernel runs on with its variables.
    assert kid in jp_serverapp.kernel_manager
    assert (await ws.run(kid, "print(v + 1)")).strip() == "42"
    # Nothing was written anywhere else: not the fixture's store dir, not the default store.
    assert list(pause_dirs["store"].rglob("*")) == []
    default_store = Path(default_store_url())  # under the test's JUPYTER_DATA_DIR
    assert str(tmp_path) in str(default_store)
    assert not default_store.exists() or list(default_store.rglob("*")) == []
    failed = [e for e in ws.journal() if e["event"] == "failed"]
    assert failed and failed[-1]["step"] == "checkpointing", failed


@pytest.mark.parametrize("pause_config", [
    # A trait jupyter_server cannot apply (as with `--PauseApp.store_url` given twice): it only
    # logs the error and loads the extension with every later trait at its default.
    {"PauseApp": {"store_url": ["one", "two"], "keep_checkpoints": 3}, "LocalBackend": {}},
], indirect=True)
async def test_config_error_refuses_pause_instead_of_using_the_default_store(
    ws, jp_serverapp, tmp_path
):
    from tornado.httpclient import HTTPClientError

    app = ws.lifecycle.app
    assert app.config_error and "store_url" in app.config_error
    nb = await ws.open_notebook("nb.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "v = 41")

    st = await ws.status()
    assert st["backend"]["can_pause"] is False
    assert "invalid jupyter_pause configuration" in st["backend"]["why_not"]
    with pytest.raises(HTTPClientError) as e:
        await ws.api("POST", "pause", {"trigger": "manual"})
    assert e.value.code == 409
    assert "store_url" in e.value.response.body.decode()
    assert (await ws.status())["state"] == "running"
    assert (await ws.run(kid, "print(v + 1)")).strip() == "42"
    # No autosave either: it would write to the default store the roll-back left.
    assert ws.lifecycle.app.autosave_settings() == {"enabled": False}
    on = await ws.run(kid, "import jupyter_pause.kernel.autosave as _a\n"
                           "_s = _a.get(get_ipython())\nprint(bool(_s and _s.settings.enabled))")
    assert on.strip() == "False", on
    default_store = Path(default_store_url())
    assert not default_store.exists() or list(default_store.rglob("*")) == []
    # traitlets rolled the whole section back: the journal still goes to a real state dir
    # (the default one), never the server's working directory.
    assert Path(app.state_dir).is_absolute() and app.state_dir.startswith(str(tmp_path))
    assert (Path(app.state_dir) / "state.json").exists()
