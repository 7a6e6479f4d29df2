"""`jupyter pause validate` end to end with real kernels: live, restored, fresh, and errors."""

from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest

from jupyter_pause.cli import main as cli_main
from jupyter_pause.policy import upgradecheck as v

pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def dirs(tmp_path):
    d = {"state": str(tmp_path / "state"), "store": str(tmp_path / "store"),
         "key": str(tmp_path / "key")}
    yield d
    st = v.load_state(d["state"])
    if st:  # never leave a test kernel behind
        v.kill_kernel(st.get("pid"))


def prepare(d, stop=False):
    return asyncio.run(v.prepare(state_dir=d["state"], store_url=d["store"], key_path=d["key"],
                                 stop=stop, timeout=60))


def check(d, **kw):
    return asyncio.run(v.check(state_dir=d["state"], timeout=60, **kw))


def test_live_when_the_kernel_kept_running(dirs):
    st = prepare(dirs)
    assert v.pid_alive(st["pid"]) and st["checkpoint_id"]
    # only hashes on disk: the value itself exists only in the kernel's memory
    with open(os.path.join(dirs["state"], "validate", "validate.json")) as fh:
        raw = fh.read()
    assert "value_sha256" in raw and "token_sha256" in raw
    out = check(dirs)
    assert out.outcome == "live" and out.exit_code == 0
    assert any(c.name == "process" and c.status == "same" for c in out.checks)
    assert not v.pid_alive(st["pid"])  # check cleans up unless --keep-kernel


def test_restored_when_the_process_is_gone_with_what_was_lost(dirs):
    prepare(dirs, stop=True)  # the local backend's pause: kernel shut down
    out = check(dirs)
    assert out.outcome == "restored" and out.exit_code == 10
    assert [x["name"] for x in out.lost] == [v.LOST_VAR]  # a generator cannot be saved
    assert any(c.name == "value" and c.status == "ok" for c in out.checks)


def test_fresh_when_the_checkpoint_is_gone(dirs):
    prepare(dirs, stop=True)
    shutil.rmtree(os.path.join(dirs["store"], "manifests"))
    out = check(dirs)
    assert out.outcome == "fresh" and out.exit_code == 20
    assert any(c.name == "restore" and c.status == "failed" for c in out.checks)


def test_a_new_key_after_the_upgrade_means_fresh(dirs, tmp_path):
    prepare(dirs, stop=True)
    out = check(dirs, key_path=str(tmp_path / "another-key"))
    assert out.outcome == "fresh"
    detail = next(c.detail for c in out.checks if c.name == "restore")
    assert "key" in detail.lower() or "hmac" in detail.lower()


def test_errors_nothing_prepared_and_lost_marker_file(dirs):
    out = check(dirs)
    assert out.outcome == "error" and out.exit_code == 1
    prepare(dirs, stop=True)
    os.unlink(os.path.join(dirs["state"], "validate", "marker.txt"))
    out = check(dirs)
    assert out.outcome == "error"  # files must survive everything: the volume was lost
    assert any(c.name == "file" and c.status == "missing" for c in out.checks)


def test_cli_one_line_per_check_and_json(dirs, capsys):
    args = ["--state-dir", dirs["state"], "--store", dirs["store"], "--key", dirs["key"]]
    assert cli_main(["validate", "prepare", "--stop", *args]) == 0
    assert "checkpoint" in capsys.readouterr().out
    rc = cli_main(["validate", "check", *args])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 10
    assert lines[-1].split()[:2] == ["outcome", "restored"]
    assert [ln.split()[0] for ln in lines] == ["file", "process", "kernel", "restore", "value",
                                              "lost", "outcome"]
    rc = cli_main(["validate", "check", "--json", *args])
    data = json.loads(capsys.readouterr().out)
    assert rc == 10 and data["outcome"] == "restored" and data["exit_code"] == 10
