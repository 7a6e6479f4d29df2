"""The lifecycle's one vocabulary: workspace states, outcomes, flight kinds, event and step names,
offer kinds and causes (the failure reasons live in :mod:`jupyter_pause.cluster.reasons`).

The journal accepts only these events, :func:`jupyter_pause.server.state.apply` produces only
these states and outcomes, and two files are generated from this module so that the event bus
and the frontend cannot drift from it:

- the lifecycle event schema, ``jupyter_pause/server/event_schemas/lifecycle/v1.yaml``
  (jupyter_events validates every event against it whenever a listener is attached: an event
  outside the schema never reaches the frontend);
- the frontend's types, ``labextension/src/vocabulary.ts``.

Regenerate both after a change, from a source checkout:

    python -m jupyter_pause.vocabulary            # rewrite both files
    python -m jupyter_pause.vocabulary --check    # exit 1 when one is out of date

Standard library only (the journal imports it, and every layer imports the journal).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

from .cluster.reasons import FAILURE_REASONS

# name -> what it means. The order is the order of a pause, a resume and a server stop.
STATES: dict[str, str] = {
    "running": "the kernels run; nothing is paused",
    "checkpointing": "a pause writes each kernel's checkpoint",
    "snapshotting": "the platform snapshots the pod",
    "releasing": "the kernels (or the pod) stop and the accelerator is released",
    "paused": "the kernels are stopped; a resume brings them back",
    "resuming": "a resume brings the compute back and starts the kernels",
    "waiting_for_capacity": "the resume waits for an accelerator (reason says why)",
    "verifying": "each kernel is asked whether its live process came back",
    "restoring": "kernels that came back empty are restored from their checkpoint",
    "ready": "the resume ended; outcome says how",
    "failed": "a pause or resume failed; reason says why, the last good checkpoint is intact",
    "stopping": "the server is stopping: each kernel is checkpointed first, and restored when "
                "its notebook's kernel starts on the next server",
}
PAUSE_STATES = ("checkpointing", "snapshotting", "releasing")
RESUME_STATES = ("resuming", "waiting_for_capacity", "verifying", "restoring")
STOP_STATES = ("stopping",)

# The workspace's outcome (``GET status`` -> ``outcome``); a kernel's outcome in a report is one
# of the first four.
OUTCOMES: dict[str, str] = {
    "live": "the kernel processes came back with their memory (pod snapshot restored)",
    "restored": "the kernels started fresh and were restored from their checkpoints",
    "fresh": "the kernels started fresh with nothing to restore",
    "failed": "the resume failed",
    "stopped": "the server stopped; the notebooks it saved are restored when their kernel starts",
}
KERNEL_OUTCOMES = ("live", "restored", "fresh", "failed")

# A flight's kind, and the request that opens it.
FLIGHT_KINDS = ("pause", "resume", "stop")
FLIGHT_REQUESTS = {"pause_requested": "pause", "resume_requested": "resume",
                   "shutdown_requested": "stop"}
# A pause's mode: "stop" shuts the kernels down without a checkpoint or snapshot.
PAUSE_MODES = ("pause", "stop")

# Every event the journal may hold: name -> what it records. Grouped as in a flight.
JOURNAL_EVENTS: dict[str, str] = {
    "activity": "kernel activity, sampled for the idle policy",
    # pause
    "pause_requested": "a pause (or stop) began",
    "checkpoint_written": "every kernel's checkpoint is written",
    "snapshot_ready": "the pod snapshot is taken (or skipped)",
    "accelerator_released": "the kernels (or the pod) stopped; the accelerator is free",
    "paused": "the pause ended",
    # resume
    "resume_requested": "a resume began",
    "waiting_for_capacity": "the resume waits for an accelerator",
    "pod_scheduled": "the pod has a node again",
    "verified": "each kernel was checked: live, or fresh and to be restored",
    "restored": "the fresh kernels were restored from their checkpoints",
    "kernel_usable": "every kernel runs cells again",
    "ready": "the resume ended",
    "first_cell_ran": "the person ran a first cell after the resume",
    # server stop
    "shutdown_requested": "the server began to stop; its kernels are checkpointed",
    "stop_checkpoint_written": "one kernel was saved before the server stopped",
    "stopped": "the server's stop ended (what it saved and did not)",
    "restored_after_stop": "a notebook saved at the last stop was restored into its new kernel",
    # any flight
    "failed": "the flight failed (reason, hint and state_after say how)",
    # outside flights
    "auto_pause_announced": "the idle policy announced an auto-pause",
    "auto_pause_cancelled": "an announced auto-pause was cancelled",
    "recomputed": "skipped variables of a report were recomputed",
    "renamed": "a recorded notebook was renamed; its records follow it",
    # offers: a kernel's lost state offered back (they change GET status's offers, not the state)
    "kernel_died": "a kernel died; its last saved state is offered",
    "server_killed": "the server was killed with its kernels; their saved state is offered",
    "offer_restored": "an offered state was restored",
    "offer_dismissed": "an offered state was dismissed",
    # backends' own events (PauseContext.report)
    "gke_workspaces_checkpoint_failed": "GKE Workspaces' pod snapshot failed and was ended",
}
# Emitted on the event bus only (never journaled): the running step's progress.
PROGRESS = "progress"
# Every event name on the event bus.
EVENTS: dict[str, str] = {**JOURNAL_EVENTS, PROGRESS: "the running step made progress"}
# The events that change GET status's offers, never the state.
OFFER_EVENTS = ("kernel_died", "server_killed", "offer_restored", "offer_dismissed")

# The steps a flight runs (the emitted ``step.name``, a failure's ``step``).
STEPS: dict[str, str] = {
    "checkpointing": "writing the kernels' checkpoints",
    "snapshotting": "the pod snapshot",
    "releasing": "stopping the kernels (or the pod)",
    "resuming": "bringing the compute and the kernels back",
    "waiting_for_capacity": "waiting for an accelerator",
    "verifying": "asking each kernel whether it came back live",
    "restoring": "restoring kernels from their checkpoints",
    "attaching": "handing the kernels back to their sessions",
    "stopping": "checkpointing the kernels before the server stops",
}

# A lost kernel state offered back (GET status -> offers): what saved it, and why it was lost.
OFFER_KINDS = ("autosave", "checkpoint")
OFFER_CAUSES = ("kernel_died", "server_killed")

SCHEMA_ID = "https://events.jupyter.org/jupyter_pause/lifecycle/v1"
PACKAGE = Path(__file__).resolve().parent
SCHEMA_PATH = PACKAGE / "server" / "event_schemas" / "lifecycle" / "v1.yaml"
TS_PATH = PACKAGE.parent / "labextension" / "src" / "vocabulary.ts"
_GENERATED = "Generated by `python -m jupyter_pause.vocabulary` from jupyter_pause/vocabulary.py"


def _block(text: str) -> str:
    return textwrap.fill(" ".join(text.split()), 96) + "\n"


def _listing(names: dict[str, str]) -> str:
    return "".join(f"- {name}: {what}\n" for name, what in names.items())


def lifecycle_schema() -> dict:
    """The lifecycle event schema (jupyter_events) as a dict, enums from this vocabulary."""
    return {
        "$id": SCHEMA_ID,
        "version": "1",
        "title": "jupyter-pause lifecycle",
        "personal-data": True,
        "description": _block(
            "One event per transition of the workspace's pause/resume lifecycle, plus throttled "
            "progress events while a step runs. Clients refetch `GET <base_url>/jupyter-pause/"
            "api/status` for details."),
        "type": "object",
        "required": ["state", "event"],
        "properties": {
            "seq": {"type": "integer", "description": _block(
                "Increases with every event; `GET status` answers with the newest one it "
                "includes, so a client drops an event that arrives after a newer read.")},
            "state": {"enum": list(STATES), "description": "The workspace state after this "
                      "event:\n" + _listing(STATES)},
            "outcome": {"enum": [None, *OUTCOMES], "description": "How the last resume or "
                        "server stop ended (null while none ended):\n" + _listing(OUTCOMES)},
            "step": {"type": ["object", "null"], "description": _block(
                "The running step and its progress: {\"name\", \"done\", \"total\", "
                "\"message\"} (bytes for checkpoint and restore; null when nothing runs)."
                ) + "Step names:\n" + _listing(STEPS)},
            "reason": {"type": ["string", "null"], "description": _block(
                "One line saying why (state \"failed\" or \"waiting_for_capacity\", or what a "
                "server stop did not save).")},
            "flight_id": {"type": ["string", "null"],
                          "description": "The pause, resume or stop flight this event belongs "
                                         "to.\n"},
            "event": {"enum": list(EVENTS), "description": _block(
                "The journal event name of the transition, or \"progress\". The offer events "
                f"({', '.join(OFFER_EVENTS)}) change `GET status`'s `offers` (a kernel's lost "
                "state offered back), not the state.") + _listing(EVENTS)},
        },
    }


def schema_yaml() -> str:
    """:func:`lifecycle_schema` as the YAML file jupyter_server registers."""
    import yaml  # jupyter_events depends on PyYAML; only generating needs it

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s
                                       else None)

    Dumper.add_representer(str, text)
    body = yaml.dump(lifecycle_schema(), Dumper=Dumper, sort_keys=False, width=100,
                     allow_unicode=True)
    return f"# {_GENERATED}: edit that, then run it again.\n{body}"


def _ts_list(const: str, type_name: str | None, doc: str, names: Iterable[object]) -> str:
    # As prettier prints it (printWidth 80): on one line when it fits.
    one_line = f"export const {const} = [{', '.join(repr(n) for n in names)}] as const;\n"
    items = "".join(f"  '{n}',\n" for n in names).rstrip(",\n") + "\n"
    out = f"/** {doc} */\n" + (one_line if len(one_line) <= 81 else
                               f"export const {const} = [\n{items}] as const;\n")
    if type_name:
        out += f"export type {type_name} = (typeof {const})[number];\n"
    return out + "\n"


def typescript() -> str:
    """``labextension/src/vocabulary.ts``: the same names as constants and union types."""
    parts = [
        (f"/*\n * {_GENERATED}\n * (failure reasons: jupyter_pause/cluster/reasons.py). Edit "
         "those, then run it again;\n * a test checks that this file is up to date.\n */\n\n"),
        _ts_list("WORKSPACE_STATES", "WorkspaceState",
                 "Workspace states of the server's lifecycle (`GET status` -> `state`).", STATES),
        _ts_list("PAUSE_STATES", None, "The states of a pause in progress.", PAUSE_STATES),
        _ts_list("RESUME_STATES", None, "The states of a resume in progress.", RESUME_STATES),
        _ts_list("STOP_STATES", None, "The states of a server stop in progress.", STOP_STATES),
        _ts_list("OUTCOMES", "Outcome",
                 "How the last resume or server stop ended (`GET status` -> `outcome`).",
                 OUTCOMES),
        _ts_list("KERNEL_OUTCOMES", "KernelOutcome", "How one kernel came back (a report's "
                 "kernel `outcome`).", KERNEL_OUTCOMES),
        _ts_list("FLIGHT_KINDS", "FlightKind", "A flight's kind (`GET status` -> `flight.kind`).",
                 FLIGHT_KINDS),
        _ts_list("LIFECYCLE_EVENTS", "LifecycleEvent",
                 "Event names of the lifecycle event stream (`event`).", EVENTS),
        _ts_list("STEP_NAMES", "StepName", "The steps a flight runs (`step.name`).", STEPS),
        _ts_list("OFFER_KINDS", "OfferKind", "What saved an offered state (`offers[].kind`).",
                 OFFER_KINDS),
        _ts_list("OFFER_CAUSES", "OfferCause", "Why a kernel's state was lost "
                 "(`offers[].cause`).", OFFER_CAUSES),
        _ts_list("FAILURE_REASONS", "FailureReason",
                 "Machine-readable failure reasons (a failed event's `reason`).", FAILURE_REASONS),
    ]
    return "".join(parts).rstrip("\n") + "\n"


def generated() -> dict[Path, str]:
    """Each generated file and the text it must hold."""
    return {SCHEMA_PATH: schema_yaml(), TS_PATH: typescript()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_pause.vocabulary",
        description="Write (or check) the event schema and the frontend's vocabulary.ts.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a generated file is out of date")
    args = parser.parse_args(argv)
    if not TS_PATH.parent.is_dir():
        print(f"{TS_PATH.parent} is missing: run this from a source checkout", file=sys.stderr)
        return 2
    files = generated()
    stale = [p for p, text in files.items()
             if not p.is_file() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            print(f"out of date: {p}", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(files[p], encoding="utf-8")
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
