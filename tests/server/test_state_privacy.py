"""The state directory holds cell sources: private on disk, and hidden from read-only viewers."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest
from jupyter_server.auth.authorizer import Authorizer

from jupyter_pause.journal import Journal, make_private_dir, secure_tree

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")]

SECRET = "api_key = 'sk-do-not-leak-42'"


def _mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _tree_modes(root) -> dict[str, int]:
    out = {str(root): _mode(root)}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            out[os.path.join(dirpath, n)] = _mode(os.path.join(dirpath, n))
    return out


def _assert_private(root) -> None:
    for p, m in _tree_modes(root).items():
        assert m & 0o077 == 0, f"{p} is {m:04o}"


class Switchable(Authorizer):
    """Everyone may read; writing ``jupyter_pause`` is allowed only while ``writer`` is True."""

    writer = True

    def is_authorized(self, handler, user, action, resource):
        return Switchable.writer or not (resource == "jupyter_pause" and action != "read")


@pytest.fixture
def jp_server_config(jp_server_config):
    jp_server_config["ServerApp"]["authorizer_class"] = Switchable
    Switchable.writer = True
    return jp_server_config


# -- on disk -----------------------------------------------------------------------------------


def test_journal_files_and_folders_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o000)
    try:
        j = Journal(tmp_path / "a" / "state")
        j.open()
        j.append({"seq": j.next_seq(), "event": "activity", "source": SECRET})
        j.save_state({"seq": j.seq})
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a") == 0o700 and _mode(tmp_path / "a" / "state") == 0o700
    assert _mode(j.journal_path) == 0o600 and _mode(j.state_path) == 0o600
    _assert_private(tmp_path / "a")


def test_too_open_state_dir_is_fixed_at_start_with_a_warning(tmp_path, caplog):
    d = tmp_path / "state"
    (d / "validate").mkdir(parents=True)
    (d / "journal.jsonl").write_text(
        json.dumps({"seq": 1, "at": "2026-01-01T00:00:00+00:00", "event": "activity"}) + "\n")
    (d / "validate" / "validate.json").write_text("{}")
    outside = tmp_path / "outside.txt"
    outside.write_text("not the state's")
    os.chmod(outside, 0o644)
    os.symlink(outside, d / "link")  # never followed nor changed
    os.chmod(d, 0o755)
    os.chmod(d / "validate", 0o777)
    os.chmod(d / "journal.jsonl", 0o644)
    os.chmod(d / "validate" / "validate.json", 0o666)
    with caplog.at_level(logging.WARNING):
        j = Journal(d, log=logging.getLogger("test-journal"))
        j.open()
    assert j.seq == 1
    assert _mode(d) == 0o700 and _mode(d / "validate") == 0o700
    assert _mode(d / "journal.jsonl") == 0o600 and _mode(d / "validate" / "validate.json") == 0o600
    assert _mode(outside) == 0o644
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "journal.jsonl was mode 0644" in warned and "validate.json was mode 0666" in warned
    assert secure_tree(d) == []  # nothing left to fix: no second warning


def test_make_private_dir_leaves_existing_parents_alone(tmp_path):
    os.chmod(tmp_path, 0o755)
    make_private_dir(tmp_path / "x" / "y")
    assert _mode(tmp_path) == 0o755
    assert _mode(tmp_path / "x") == 0o700 and _mode(tmp_path / "x" / "y") == 0o700


# -- GET status ------------------------------------------------------------------------------


def _report() -> dict:
    return {"flight_id": "f1", "outcome": "restored", "kernels": [{
        "path": "nb.ipynb", "kernel_id": "k1",
        "variables": [
            {"name": "api_key", "status": "restored", "recomputable": False,
             "cell": {"execution_count": 3, "source": SECRET}},
            {"name": "gen", "status": "skipped", "recomputable": True,
             "cell": {"execution_count": 4, "source": "gen = (i for i in x)", "code": "x"}},
        ]}]}


async def test_viewer_gets_no_cell_source_writer_does(ws):
    ws.lifecycle.state["last_report"] = _report()
    st = await ws.status()
    assert SECRET in json.dumps(st)
    Switchable.writer = False
    st = await ws.status()
    text = json.dumps(st)
    assert "sk-do-not-leak" not in text and "gen = (i" not in text
    rows = {v["name"]: v for v in st["last_report"]["kernels"][0]["variables"]}
    assert rows["api_key"]["cell"] == {"execution_count": 3, "source": None}
    assert rows["gen"]["cell"]["code"] is None and rows["gen"]["recomputable"] is True
    # The server's own state is untouched: writers still see the source.
    assert ws.lifecycle.state["last_report"] == _report()
    Switchable.writer = True
    assert SECRET in json.dumps(await ws.status())


async def test_real_pause_resume_keeps_sources_private(ws, pause_dirs):
    nb = await ws.open_notebook("secret.ipynb")
    await ws.run(nb["kernel"]["id"], SECRET)
    _, st = await ws.flight("pause")
    assert st["state"] == "paused", st
    _, st = await ws.flight("resume")
    assert st["state"] == "ready", st
    assert SECRET in json.dumps(st["last_report"])  # the owner sees where a variable came from
    # journal.jsonl keeps the source (reports survive restarts) but only its owner can read it.
    assert SECRET in ws.lifecycle.journal.journal_path.read_text()
    _assert_private(pause_dirs["state"])
    Switchable.writer = False
    assert "sk-do-not-leak" not in json.dumps(await ws.status())
