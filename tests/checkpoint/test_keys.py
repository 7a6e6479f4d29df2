"""The HMAC key: never silently replaced under existing checkpoints, never shared with others."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from jupyter_pause.checkpoint import CheckpointError, load_or_create_key, open_store, write
from jupyter_pause.checkpoint.keys import KeyFileError, count_checkpoints

posix_only = pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_deleted_key_with_checkpoints_is_an_error_not_a_new_key(tmp_path):
    kp, store = tmp_path / "keys" / "checkpoint.key", open_store(str(tmp_path / "store"))
    key = load_or_create_key(str(kp), store=store)
    write({"a": 1}, store, key=key, stream="nb.ipynb")
    write({"b": 2}, store, key=key, stream="other.ipynb")
    kp.unlink()
    with pytest.raises(KeyFileError) as e:
        load_or_create_key(str(kp), store=store)
    msg = str(e.value)
    assert str(kp) in msg and "missing" in msg and "2 checkpoint" in msg
    assert "Restore the key" in msg and "store_url" in msg
    assert not kp.exists()  # nothing minted behind the person's back
    # A URL or a path works as well as a Store.
    with pytest.raises(KeyFileError):
        load_or_create_key(str(kp), store=store.url)
    with pytest.raises(KeyFileError):
        load_or_create_key(str(kp), store="file://" + store.url)


def test_missing_key_with_an_empty_or_absent_store_is_created(tmp_path):
    store = open_store(str(tmp_path / "store"))
    (tmp_path / "store" / "manifests" / "slug").mkdir(parents=True)  # folders, no manifest
    assert count_checkpoints(store) == 0
    k = load_or_create_key(str(tmp_path / "k1"), store=store)
    assert len(k) == 32
    assert len(load_or_create_key(str(tmp_path / "k2"), store=str(tmp_path / "nowhere"))) == 32


def test_moving_the_store_aside_allows_a_new_key(tmp_path):
    kp, root = tmp_path / "checkpoint.key", tmp_path / "store"
    key = load_or_create_key(str(kp), store=str(root))
    write({"a": 1}, open_store(str(root)), key=key)
    kp.unlink()
    os.rename(root, tmp_path / "store.old")
    assert load_or_create_key(str(kp), store=str(root)) != key


def test_fsspec_store_is_counted(tmp_path):
    root = tmp_path / "store"
    (root / "manifests" / "s").mkdir(parents=True)
    (root / "manifests" / "s" / "20200101T000000000000Z-000000.json").write_text("{}")
    assert count_checkpoints(f"memory://{tmp_path.name}-empty") == 0
    assert count_checkpoints(str(root)) == 1


@posix_only
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o666, 0o620])
def test_key_open_to_others_is_refused_with_the_fix(tmp_path, mode):
    kp = tmp_path / "checkpoint.key"
    load_or_create_key(str(kp))
    os.chmod(kp, mode)
    with pytest.raises(KeyFileError) as e:
        load_or_create_key(str(kp))
    assert f"chmod 600 {kp}" in str(e.value) and f"{mode:04o}" in str(e.value)
    os.chmod(kp, 0o600)
    assert len(load_or_create_key(str(kp))) == 32


@posix_only
def test_new_key_is_0600_in_a_0700_folder_whatever_the_umask(tmp_path):
    old = os.umask(0o000)
    try:
        kp = tmp_path / "a" / "b" / "checkpoint.key"
        load_or_create_key(str(kp))
    finally:
        os.umask(old)
    assert _mode(kp) == 0o600
    assert _mode(kp.parent) == 0o700 and _mode(kp.parent.parent) == 0o700
    assert [p.name for p in kp.parent.iterdir()] == ["checkpoint.key"]  # no temp file left


def test_concurrent_creation_agrees_on_one_key(tmp_path):
    kp = str(tmp_path / "k" / "checkpoint.key")
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(load_or_create_key(kp)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1


def test_malformed_key_says_so_before_its_mode(tmp_path):
    bad = tmp_path / "bad.key"
    bad.write_text("not hex")
    os.chmod(bad, 0o644)
    with pytest.raises(CheckpointError, match="not a valid key"):
        load_or_create_key(str(bad))


def test_server_listing_refuses_to_mint_a_key_over_existing_checkpoints(tmp_path):
    from jupyter_pause.checkpoint import open_keyed_store

    kp, root = tmp_path / "checkpoint.key", tmp_path / "store"
    write({"a": 1}, open_store(str(root)), key=load_or_create_key(str(kp)))
    assert [m.stream for m in open_keyed_store(str(root), str(kp)).list()] == ["default"]
    kp.unlink()
    with pytest.raises(KeyFileError, match="missing"):
        open_keyed_store(str(root), str(kp))
    assert not kp.exists()


@pytest.mark.parametrize("data_dir", [True, False])
def test_key_store_and_state_share_jupyters_data_dir(tmp_path, monkeypatch, data_dir):
    """Key, store and state all follow jupyter_core's data dir, platformdirs mode included."""
    from jupyter_core.paths import jupyter_data_dir

    from jupyter_pause.checkpoint import default_key_path, default_store_url
    from jupyter_pause.server.app import PauseApp

    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    if data_dir:
        monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    else:
        monkeypatch.delenv("JUPYTER_DATA_DIR", raising=False)
    root = os.path.join(jupyter_data_dir(), "jupyter-pause")
    if data_dir:
        assert root == os.path.join(str(tmp_path / "data"), "jupyter-pause")
    assert default_key_path() == os.path.join(root, "checkpoint.key")
    assert default_store_url() == os.path.join(root, "checkpoints")
    assert PauseApp()._default_state_dir() == os.path.join(root, "state")
