"""REST API shape, authentication, events and metrics (no kernels needed)."""

from __future__ import annotations

import json
import re

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_pause.policy.handlers import get_handlers
from jupyter_pause.server.events import SCHEMA_ID
from jupyter_pause.server.handlers import API, default_handlers


def _write_routes():
    """(verb, path under api/) of every route that changes something, from the registered
    handlers (tests/test_auth.py checks every route and verb for authentication)."""
    routes = []
    for pattern, handler in default_handlers() + get_handlers(None):
        path = re.sub(r"\([^)]*\)", "abc", pattern).removeprefix(f"{API}/")
        routes += [(verb, path) for verb in ("POST", "PUT", "PATCH", "DELETE")
                   if verb.lower() in vars(handler)]
    return routes


def _body(method):
    return json.dumps({}) if method == "POST" else None


async def test_status_shape(jp_fetch):
    r = await jp_fetch("jupyter-pause", "api", "status")
    assert r.code == 200
    st = json.loads(r.body)
    assert st["state"] == "running"
    assert st["outcome"] is None and st["flight"] is None and st["step"] is None
    assert st["backend"]["name"] == "local"
    assert st["kernels"] == [] and st["last_checkpoint"] is None and st["last_report"] is None
    assert isinstance(st["seq"], int)  # orders lifecycle events against this answer
    assert set(st) == {"seq", "state", "outcome", "step", "reason", "hint", "flight", "timeline",
                       "backend", "kernels", "last_checkpoint", "last_report",
                       "resume_available", "resume_from", "stopped", "journal",
                       "offers", "recoveries", "accelerator"}
    assert st["journal"] == {"skipped_lines": 0}
    assert st["resume_available"] is False and st["resume_from"] is None
    assert st["stopped"] is None


def test_write_routes_include_every_api_change():
    assert {r for _, r in _write_routes()} >= {"pause", "resume", "recompute", "checkpoints/abc",
                                              "gc", "policy/cancel"}


@pytest.mark.parametrize("method,route", _write_routes())
async def test_cookie_auth_without_xsrf_is_refused(jp_fetch, method, route):
    # A token request makes the server set its login cookie (what a browser holds) ...
    r = await jp_fetch("jupyter-pause", "api", "status")
    cookies = "; ".join(c.split(";", 1)[0] for c in r.headers.get_list("Set-Cookie"))
    assert cookies, "expected a login cookie"
    # ... and that cookie alone, without the _xsrf token, must not change anything.
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("jupyter-pause", "api", *route.split("/"), method=method,
                       body=_body(method), headers={"Authorization": "", "Cookie": cookies},
                       allow_nonstandard_methods=True)
    assert e.value.code == 403
    assert b"XSRF" in e.value.response.body or b"xsrf" in e.value.response.body
    # The cookie itself is valid: a GET with it is answered.
    r = await jp_fetch("jupyter-pause", "api", "status",
                       headers={"Authorization": "", "Cookie": cookies})
    assert json.loads(r.body)["flight"] is None


async def test_resume_when_running_is_refused(jp_fetch):
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("jupyter-pause", "api", "resume", method="POST", body="{}")
    assert e.value.code == 409
    assert "not paused" in json.loads(e.value.response.body)["message"]


async def test_bad_body_is_400(jp_fetch):
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("jupyter-pause", "api", "pause", method="POST", body="[1")
    assert e.value.code == 400
    assert json.loads(e.value.response.body)["message"]


async def test_pause_without_kernels_emits_events_and_metrics(jp_fetch, jp_serverapp, pause_dirs):
    seen = []

    async def listener(logger, schema_id, data):
        seen.append(dict(data))

    jp_serverapp.event_logger.add_listener(schema_id=SCHEMA_ID, listener=listener)
    r = await jp_fetch("jupyter-pause", "api", "pause", method="POST",
                       body=json.dumps({"trigger": "manual"}))
    assert r.code == 202
    flight = json.loads(r.body)["flight"]
    assert flight["kind"] == "pause" and flight["trigger"] == "manual"
    app = jp_serverapp.web_app.settings["jupyter_pause_lifecycle"]
    await app.wait()
    st = json.loads((await jp_fetch("jupyter-pause", "api", "status")).body)
    assert st["state"] == "paused", st
    events = [e["event"] for e in st["timeline"]]
    assert events == ["pause_requested", "checkpoint_written", "snapshot_ready",
                      "accelerator_released", "paused"]
    r = await jp_fetch("jupyter-pause", "api", "resume", method="POST", body="{}")
    assert r.code == 202
    await app.wait()
    st = json.loads((await jp_fetch("jupyter-pause", "api", "status")).body)
    assert st["state"] == "ready" and st["outcome"] == "fresh"
    journal = [json.loads(line)["event"] for line in
               (pause_dirs["state"] / "journal.jsonl").read_text().splitlines()]
    assert journal[-4:] == ["resume_requested", "verified", "kernel_usable", "ready"]
    emitted = [e["event"] for e in seen if e["event"] != "progress"]
    assert emitted == journal, (emitted, journal)
    assert {e["state"] for e in seen} >= {"checkpointing", "paused", "resuming", "ready"}
    state_json = json.loads((pause_dirs["state"] / "state.json").read_text())
    assert state_json["state"] == "ready" and state_json["seq"] == len(journal)

    text = (await jp_fetch("metrics")).body.decode()
    for name in ("jupyter_pause_pause_duration_seconds_count",
                 "jupyter_pause_resume_duration_seconds_count",
                 "jupyter_pause_checkpoint_bytes_written_total",
                 "jupyter_pause_accelerator_seconds_released_total",
                 "jupyter_pause_fallback_restores_total", "jupyter_pause_failures_total"):
        assert name in text, name
    assert 'jupyter_pause_accelerator_seconds_released_total{accelerator="test-gpu"' in text


async def test_a_status_read_while_the_server_starts_holds_what_the_start_found(ws):
    """jupyter_server binds its port before the extensions start, so a page may read status
    while the start-up checks still run (a killed server's offers: a store listing). That
    read waits for them: their event may come before the page listens for events."""
    import asyncio

    from jupyter_pause.server.deaths import make_offer

    app = ws.lifecycle.app
    app._start_checked = asyncio.Event()  # as while _start_jupyter_server_extension runs
    read = asyncio.ensure_future(ws.status())
    done, _ = await asyncio.wait([read], timeout=1.0)
    assert not done, "GET status answered before the start-up checks ended"
    offer = make_offer("server_killed", "a.ipynb", "/nb/a.ipynb", None, "2026-12-03T10:00:00Z",
                       dead_kernel_id=None, last_cell=None)
    await ws.lifecycle.record("server_killed", flight=False, offers=[offer],
                              previous_start="2026-12-03T09:00:00Z")
    app._start_checked.set()
    st = await asyncio.wait_for(read, 30)
    assert [(o["path"], o["cause"]) for o in st["offers"]] == [("a.ipynb", "server_killed")]
