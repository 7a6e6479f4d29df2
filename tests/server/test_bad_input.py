"""No silent loss: bad configuration, bad journal lines and bad strings are refused or
skipped with a reason, on a real server, before they can cost a person their variables."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

pytestmark = pytest.mark.timeout(180)

_PAUSED = [  # a finished pause of no kernels: POST resume then starts nothing and ends "ready"
    {"event": "pause_requested", "kind": "pause", "trigger": "manual", "kernels": []},
    {"event": "checkpoint_written", "kind": "pause", "kernels": [], "checkpoints": []},
    {"event": "snapshot_ready", "kind": "pause", "skipped": True},
    {"event": "accelerator_released", "kind": "pause"},
    {"event": "paused", "kind": "pause"},
]
# Every kind of line the journal must survive: not JSON, not an object, wrong types of each
# field, unknown events, lone surrogates, NaN, deep nesting, a huge line.
BAD_LINES = [
    '{"seq": "x"}', '{"seq": "x", "event": "paused", "at": "2024-01-01T00:00:00Z"}',
    "not json", "[1, 2]", "42", '"text"', "null", "{", '{"seq": 9999',
    '{"seq": true, "event": "paused", "at": "2024-01-01T00:00:00Z"}',
    '{"seq": -1, "event": "paused", "at": "2024-01-01T00:00:00Z"}',
    '{"seq": 1.5, "event": "paused", "at": "2024-01-01T00:00:00Z"}',
    '{"seq": 50, "event": "no_such_event", "at": "2024-01-01T00:00:00Z"}',
    '{"seq": 50, "event": ["paused"], "at": "2024-01-01T00:00:00Z"}',
    '{"seq": 50, "event": "paused", "at": "yesterday"}',
    '{"seq": 50, "event": "paused", "at": NaN}',
    '{"seq": 50, "event": "paused", "at": 1e999}',
    '{"seq": 50, "event": "paused"}',
    '{"seq": 50, "event": "checkpoint_written", "at": "2024-01-01T00:00:00Z", "kernels": "x"}',
    '{"seq": 50, "event": "checkpoint_written", "at": "2024-01-01T00:00:00Z", "kernels": [1]}',
    ('{"seq": 50, "event": "checkpoint_written", "at": "2024-01-01T00:00:00Z", '
     '"checkpoints": {"a": 1}}'),
    ('{"seq": 50, "event": "checkpoint_written", "at": "2024-01-01T00:00:00Z", '
     '"checkpoints": [1]}'),
    '{"seq": 50, "event": "ready", "at": "2024-01-01T00:00:00Z", "report": "x"}',
    '{"seq": 50, "event": "failed", "at": "2024-01-01T00:00:00Z", "message": {"a": 1}}',
    '{"seq": 50, "event": "stopped", "at": "2024-01-01T00:00:00Z", "rows": 7}',
    '{"seq": 50, "event": "paused", "at": "2024-01-01T00:00:00Z", "flight": 3}',
    '{"seq": 50, "event": "pause_requested", "at": "2024-01-01T00:00:00Z", "mode": 1}',
    "[" * 100000,
    '{"seq": 50, "event": "activity", "at": "2024-01-01T00:00:00Z", "pad": "'
    + "x" * (33 << 20) + '"}',
]


def _journal_lines(good: list[dict], bad: list[str]) -> str:
    lines = []
    for i, e in enumerate(good, 1):
        lines.append(json.dumps({"seq": i, "at": f"2024-01-01T00:00:{i:02d}Z",
                                 "flight": "pause-1", **e}))
        lines += bad if i == 2 else []  # bad lines between good ones, not only at the end
    return "\n".join(lines) + "\n"


@pytest.fixture
def pause_config(request, pause_dirs):
    """``(PauseApp traits, journal text)`` by parametrize; the journal is there before start."""
    traits, journal = getattr(request, "param", ({}, ""))
    if journal:
        (pause_dirs["state"] / "journal.jsonl").write_text(journal, encoding="utf-8")
    return {"PauseApp": dict(traits), "LocalBackend": {}}


@pytest.mark.parametrize("pause_config", [
    ({"restore_device": "tpu", "keep_checkpoints": -3, "store_memory": "1K"}, ""),
], indirect=True)
async def test_invalid_config_refuses_the_pause_before_the_kernels_stop(ws, jp_serverapp):
    nb = await ws.open_notebook("nb.ipynb")
    kid = nb["kernel"]["id"]
    await ws.run(kid, "v = 41")
    st = await ws.status()  # the server started: the person can read why
    assert st["backend"]["can_pause"] is False
    why = st["backend"]["why_not"]
    for name in ("restore_device", "keep_checkpoints", "store_memory"):
        assert f"PauseApp.{name}" in why, why
    assert "'tpu' is not a device" in why and "16 MiB" in why
    with pytest.raises(HTTPClientError) as e:
        await ws.api("POST", "pause", {"trigger": "manual"})
    assert e.value.code == 409 and "restore_device" in e.value.response.body.decode()
    assert (await ws.status())["state"] == "running"
    assert (await ws.run(kid, "print(v + 1)")).strip() == "42"  # the kernel kept its variables
    # gc by the configured keep_checkpoints is refused too (never by a default nobody chose)
    with pytest.raises(HTTPClientError) as e:
        await ws.api("POST", "gc", {"dry_run": True})
    assert e.value.code == 400 and "keep_checkpoints" in e.value.response.body.decode()


@pytest.mark.parametrize("pause_config", [
    ({"keep_checkpoints": -3}, _journal_lines(_PAUSED, [])),
], indirect=True)
async def test_invalid_pause_only_value_still_resumes_an_existing_pause(ws):
    st = await ws.status()
    assert st["state"] == "paused" and st["backend"]["can_pause"] is False
    assert "keep_checkpoints" in st["backend"]["why_not"]
    _, st = await ws.flight("resume", {"trigger": "manual"})
    assert st["state"] == "ready", st


@pytest.mark.parametrize("pause_config", [
    ({"restore_device": "tpu"}, _journal_lines(_PAUSED, [])),
], indirect=True)
async def test_invalid_resume_value_refuses_the_resume_with_the_reason(ws):
    with pytest.raises(HTTPClientError) as e:
        await ws.api("POST", "resume", {"trigger": "manual"})
    assert e.value.code == 409
    assert "PauseApp.restore_device" in json.loads(e.value.response.body)["message"]
    assert (await ws.status())["state"] == "paused"  # the way back is still there


@pytest.mark.parametrize("pause_config", [({}, _journal_lines(_PAUSED, BAD_LINES))],
                         indirect=True)
async def test_bad_journal_lines_are_skipped_and_counted(ws, jp_fetch):
    st = await ws.status()  # the extension loaded: its API answers
    assert st["state"] == "paused", st
    assert st["journal"]["skipped_lines"] == len(BAD_LINES)
    r = await jp_fetch("jupyter-pause", "api", "report")
    assert json.loads(r.body)["report"]["journal"]["skipped_lines"] == len(BAD_LINES)
    _, st = await ws.flight("resume", {"trigger": "manual"})
    assert st["state"] == "ready", st
    # new lines go after the highest good seq, never reusing one
    seqs = [e["seq"] for e in ws.lifecycle.journal.entries()]
    assert seqs == sorted(set(seqs)) and seqs[-1] > len(_PAUSED), seqs


async def test_lone_surrogate_in_trigger_is_refused(ws):
    for body in ({"trigger": "\ud800"}, {"trigger": "ok\udfff"}):
        with pytest.raises(HTTPClientError) as e:
            await ws.api("POST", "pause", body)
        assert e.value.code == 400
        assert "trigger" in json.loads(e.value.response.body)["message"]
    assert (await ws.status())["state"] == "running"


async def test_non_finite_gc_number_says_so(jp_fetch):
    for raw in ('{"older_than": Infinity}', '{"older_than": NaN}', '{"older_than": 1e999}'):
        with pytest.raises(HTTPClientError) as e:
            await jp_fetch("jupyter-pause", "api", "gc", method="POST", body=raw)
        assert e.value.code == 400
        assert "finite" in json.loads(e.value.response.body)["message"], raw


async def test_report_accepts_the_token_query_parameter(jp_fetch, jp_auth_header):
    token = jp_auth_header["Authorization"].split()[-1]
    r = await jp_fetch("jupyter-pause", "api", "report", params={"token": token},
                       headers={"Authorization": ""})
    assert r.code == 200 and "report" in json.loads(r.body)
