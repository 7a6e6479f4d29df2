"""Every transition of the state machine reaches a page: each one the state machine can make is
emitted through the real Recorder and validated by jupyter_events against the registered schema,
with a listener attached (as a page's event stream attaches one); a refused event is an error in
the server's log."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import time
from typing import Any

from jupyter_pause.journal import utcnow_iso
from jupyter_pause.server.events import SCHEMA_ID, emit_lifecycle
from jupyter_pause.server.recorder import Flight
from jupyter_pause.server.state import apply, default_state
from jupyter_pause.vocabulary import (
    FLIGHT_KINDS,
    JOURNAL_EVENTS,
    OUTCOMES,
    PAUSE_MODES,
    STATES,
    STEPS,
)

# The entry fields apply branches on, each with every value the vocabulary allows for it.
BRANCH_FIELDS: dict[str, tuple[str, ...]] = {
    "mode": PAUSE_MODES, "outcome": tuple(OUTCOMES), "state_after": tuple(STATES)}
Key = tuple[str, Any]  # (state, outcome): what an event carries


def _variants() -> list[dict[str, str]]:
    return [{}] + [{f: v} for f, values in BRANCH_FIELDS.items() for v in values]


def _key(st: dict[str, Any]) -> Key:
    return st["state"], st.get("outcome")


@functools.cache
def transitions() -> dict[tuple[Key, str, Key], tuple[dict[str, Any], str | None, dict]]:
    """Every (state, outcome) -> event -> (state, outcome) that :func:`apply` makes, found by
    running it: from the initial state, every journal event, in every flight kind (and none),
    with each branch field's values, until no new (state, outcome) appears. Each transition
    comes with a state before it, the flight kind and the fields that make it."""
    start = default_state()
    seen = {_key(start): start}
    todo = [start]
    found: dict[tuple[Key, str, Key], tuple[dict[str, Any], str | None, dict]] = {}
    at = utcnow_iso()
    while todo:
        before = todo.pop()
        frozen = json.dumps(before)  # state.json is JSON: loads(frozen) is a deep copy
        for event in JOURNAL_EVENTS:
            for kind in (None, *FLIGHT_KINDS):
                for fields in _variants():
                    after = json.loads(frozen)
                    apply(after, {"seq": 1, "at": at, "flight": kind and "f-1", "kind": kind,
                                  "event": event, **fields})
                    found.setdefault((_key(before), event, _key(after)), (before, kind, fields))
                    if _key(after) not in seen:
                        seen[_key(after)] = after
                        todo.append(after)
    return found


def test_the_state_machine_makes_only_states_and_outcomes_of_the_vocabulary():
    found = transitions()
    reached = {k for before, _, after in found for k in (before, after)}
    assert {s for s, _ in reached} <= set(STATES), {s for s, _ in reached} - set(STATES)
    assert {o for _, o in reached} <= {None, *OUTCOMES}
    # The walk reaches a server stop and every outcome, not only the pause/resume path.
    assert ("stopping", None) in reached and any(o == "stopped" for _, o in reached)
    assert {o for _, o in reached} == {None, *OUTCOMES}
    # Events keep the outcome of a stop after a restart: they must validate too.
    assert ("running", "stopped") in reached and len(found) > 500


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _listen(serverapp: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        seen.append(dict(data))

    serverapp.event_logger.add_listener(schema_id=SCHEMA_ID, listener=listener)
    return seen


async def _until(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_every_transition_emits_an_event_that_validates(jp_serverapp):
    lc = jp_serverapp.web_app.settings["jupyter_pause_lifecycle"]
    seen = _listen(jp_serverapp)
    errors = _Errors()
    jp_serverapp.log.addHandler(errors)
    expected: list[tuple[str, str, Any]] = []
    # What a transition emits depends on the event and the state after it, not before it.
    emitted = {(event, after): how for (_, event, after), how in transitions().items()}
    try:
        for (event, (state, outcome)), (before, kind, fields) in emitted.items():
            lc.state = copy.deepcopy(before)
            lc.flight = kind and Flight(id="f-1", kind=kind, trigger="test", started=utcnow_iso())
            lc.step = None
            # Recorder.record: fold the entry into the state and emit it (nothing written).
            await lc.record(event, flight=lc.flight or False, persist=False, **fields)
            expected.append((event, state, outcome))
        # Progress: each step's progress in every state the walk reached.
        for state, outcome in sorted({(s, o) for _, s, o in expected}, key=str):
            for name in STEPS:
                lc.state.update(state=state, outcome=outcome)
                lc.step = {"name": name, "done": 1, "total": 2, "message": f"{name} a.ipynb"}
                lc.progress(force=True)
                expected.append(("progress", state, outcome))
        await _until(lambda: len(seen) >= len(expected) or errors.messages)
    finally:
        jp_serverapp.log.removeHandler(errors)
        lc.flight, lc.step, lc.state = None, None, default_state()
    assert not errors.messages, errors.messages[:5]
    assert [(e["event"], e["state"], e["outcome"]) for e in seen] == expected
    # Each one as a page reads it, checked again against the registered schema.
    for data in seen:
        jp_serverapp.event_logger.schemas.validate_event(SCHEMA_ID, data)
    assert {("shutdown_requested", "stopping"), ("activity", "running")} <= {
        (e, s) for e, s, _ in expected}
    assert any(o == "stopped" for _, _, o in expected)


async def test_a_refused_event_is_an_error_with_the_event_and_why(jp_serverapp):
    seen = _listen(jp_serverapp)
    errors = _Errors()
    jp_serverapp.log.addHandler(errors)
    try:
        emit_lifecycle(jp_serverapp, {"state": "no_such_state", "event": "paused"})
        # A valid event after it arrives alone: the refused one never reached the listener.
        emit_lifecycle(jp_serverapp, {"state": "paused", "event": "paused"})
        await _until(lambda: seen)
    finally:
        jp_serverapp.log.removeHandler(errors)
    assert [e["state"] for e in seen] == ["paused"]
    assert len(errors.messages) == 1, errors.messages
    assert "lifecycle event 'paused'" in errors.messages[0]
    assert "'no_such_state' is not one of" in errors.messages[0]
