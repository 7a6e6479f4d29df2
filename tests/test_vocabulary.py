"""One vocabulary: the event schema and the frontend's types are generated from
jupyter_pause/vocabulary.py, and every event and step name the package uses is in it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from jupyter_pause import journal, vocabulary
from jupyter_pause.cluster.reasons import FAILURE_REASONS

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_pause"
SRC = PACKAGE.parent / "labextension" / "src"
REGENERATE = "run `python -m jupyter_pause.vocabulary` and commit what it writes"

# Calls whose first argument is an event name: Recorder.record/record_sync/record_event/
# backend_report/emit, PauseContext.report and the idle policy's _record.
EVENT_CALLS = {"record", "record_sync", "record_event", "backend_report", "report", "_record",
               "emit"}
# Calls whose first argument is a step name (Recorder.set_step, kernels_progress).
STEP_CALLS = {"set_step", "kernels_progress"}


def _calls(names: set[str]) -> dict[str, list[str]]:
    """first string argument -> where, for every call of one of ``names`` in the package."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if name in names and isinstance(first, ast.Constant) and isinstance(first.value, str):
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                found.setdefault(first.value, []).append(where)
    return found


def _assigned(name: str) -> dict[str, list[str]]:
    """String constants assigned to ``name`` (``name = "x"`` or ``name="x"``) in the server."""
    found: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "server").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            keyword = isinstance(node, ast.keyword) and node.arg == name
            assigned = isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets)
            value = node.value if keyword or assigned else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.setdefault(value.value, []).append(
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_generated_files_are_up_to_date():
    for path, text in vocabulary.generated().items():
        assert path.is_file(), f"{path.name} is missing: {REGENERATE}"
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is out of date: {REGENERATE}"
    assert vocabulary.main(["--check"]) == 0


def test_the_schema_has_every_name_of_the_vocabulary():
    schema = yaml.safe_load(vocabulary.SCHEMA_PATH.read_text(encoding="utf-8"))
    props = schema["properties"]
    assert props["state"]["enum"] == list(vocabulary.STATES)
    assert props["outcome"]["enum"] == [None, *vocabulary.OUTCOMES]
    assert props["event"]["enum"] == list(vocabulary.EVENTS)
    # What the state machine produces and the schema once lacked.
    assert "stopping" in props["state"]["enum"] and "stopped" in props["outcome"]["enum"]


def test_the_vocabulary_is_consistent():
    states = set(vocabulary.STATES)
    assert {*vocabulary.PAUSE_STATES, *vocabulary.RESUME_STATES, *vocabulary.STOP_STATES} \
        <= states
    assert set(vocabulary.KERNEL_OUTCOMES) <= set(vocabulary.OUTCOMES)
    assert set(vocabulary.FLIGHT_REQUESTS.values()) == set(vocabulary.FLIGHT_KINDS)
    assert set(vocabulary.FLIGHT_REQUESTS) | set(vocabulary.OFFER_EVENTS) \
        <= set(vocabulary.JOURNAL_EVENTS)
    assert set(vocabulary.OFFER_CAUSES) <= set(vocabulary.OFFER_EVENTS)
    # The journal refuses what is not in the vocabulary; the bus adds only progress.
    assert set(vocabulary.JOURNAL_EVENTS) == journal.EVENTS
    assert set(vocabulary.EVENTS) - journal.EVENTS == {vocabulary.PROGRESS}
    # Every name is a label (one snake_case word): frontend unions and metric labels.
    for names in (vocabulary.STATES, vocabulary.OUTCOMES, vocabulary.EVENTS, vocabulary.STEPS):
        assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", n) for n in names), names


def test_every_event_the_package_records_is_in_the_vocabulary():
    found = _calls(EVENT_CALLS)
    # The scan sees the flights', the policy's, the offers' and a backend's events.
    assert {"pause_requested", "shutdown_requested", "auto_pause_announced", "kernel_died",
            "gke_workspaces_checkpoint_failed", "progress"} <= set(found)
    missing = {e: where for e, where in found.items() if e not in vocabulary.EVENTS}
    assert not missing, f"add these to JOURNAL_EVENTS in jupyter_pause/vocabulary.py: {missing}"


def test_every_step_and_sub_state_the_server_sets_is_in_the_vocabulary():
    steps = _calls(STEP_CALLS) | _assigned("step")
    assert {"checkpointing", "stopping", "restoring", "attaching"} <= set(steps)
    missing = {s: where for s, where in steps.items() if s not in vocabulary.STEPS}
    assert not missing, f"add these to STEPS in jupyter_pause/vocabulary.py: {missing}"
    sub_states = _assigned("state")
    assert {"checkpointing", "verifying", "restoring", "stopping"} <= set(sub_states)
    missing = {s: where for s, where in sub_states.items() if s not in vocabulary.STATES}
    assert not missing, f"add these to STATES in jupyter_pause/vocabulary.py: {missing}"


def test_the_frontend_takes_its_names_from_the_generated_file():
    ts = (SRC / "vocabulary.ts").read_text(encoding="utf-8")
    for const, names in (("WORKSPACE_STATES", vocabulary.STATES),
                         ("OUTCOMES", vocabulary.OUTCOMES),
                         ("FLIGHT_KINDS", vocabulary.FLIGHT_KINDS),
                         ("LIFECYCLE_EVENTS", vocabulary.EVENTS),
                         ("FAILURE_REASONS", FAILURE_REASONS)):
        body = re.search(rf"export const {const} = \[(.*?)\] as const;", ts, re.DOTALL)
        assert body, const
        assert re.findall(r"'([a-z_0-9]+)'", body.group(1)) == list(names), const
    # api.ts re-exports them instead of spelling its own unions (which drifted).
    api = (SRC / "api.ts").read_text(encoding="utf-8")
    for name in ("WorkspaceState", "Outcome", "FlightKind"):
        assert not re.search(rf"export type {name}\s*=", api), f"api.ts defines {name} itself"
    exported = re.search(r"export type \{([^}]*)\} from '\./vocabulary';", api)
    assert exported, "api.ts must re-export the vocabulary's types"
    assert {"WorkspaceState", "Outcome", "FlightKind"} <= {
        n.strip() for n in exported.group(1).split(",")}
    assert re.search(r"kind: FlightKind;", api), "IFlight.kind must be the vocabulary's"
