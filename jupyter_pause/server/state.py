"""The workspace's persistent state and the one function that changes it.

    running -> checkpointing -> snapshotting -> releasing -> paused
    running -> releasing -> paused                 (mode "stop": no checkpoint, no snapshot)
    paused -> resuming (waiting_for_capacity) -> verifying -> ready (live)
                                                           \\-> restoring -> ready (restored)
    any step -> failed (with reason; the last good checkpoint is still there)

A pause whose kernels lost their memory on the way (a kernel died mid-checkpoint, or the server
died with its kernels) fails with ``resume_from``: the previous good checkpoint of each such
notebook, which becomes the state's ``pause`` (marked ``offered``) so that POST resume restores
it; a new pause replaces the offer. A server stop that could not save a notebook (busy past the
budget, killed mid-checkpoint) offers that notebook's previous checkpoint the same way: its
``stopped`` event carries ``resume_from``.

Each transition is a journal event (contract §4); the states, outcomes and event names are
those of :mod:`jupyter_pause.vocabulary`. :func:`apply` is the only code that turns
events into state, so the state after a crash is rebuilt by replaying the journal through it.
"""

from __future__ import annotations

from typing import Any

from ..journal import parse_iso
from ..variables import as_row, set_status
from .pausereport import stopped_text
from .previous import offer_hint

RECOVERIES = {"deaths": 0, "server_kills": 0, "offered": 0, "restored": 0, "cells_lost": 0,
              "seconds_lost": 0.0}
# Fields kept out of the timeline (they are in the journal and the report).
_BULKY = ("kernels", "report", "variables", "resume_from", "rows")


def default_state() -> dict[str, Any]:
    return {
        "version": 1, "seq": 0, "state": "running", "outcome": None, "reason": None,
        "hint": None, "flight": None, "timeline": [], "inflight": None, "pause": None,
        "last_checkpoint": None, "last_report": None, "last_activity": None,
        # A shutdown checkpoint under way ("stopping"), and the last one that ended ("stopped":
        # what it saved, and which saved notebooks still wait for their restore).
        "stopping": None, "stopped": None,
        # After a kernel death or a server killed without grace: path -> the checkpoint offered
        # (see .deaths), and what the recoveries cost.
        "offers": {}, "recoveries": dict(RECOVERIES),
    }


def apply(st: dict[str, Any], e: dict[str, Any]) -> None:
    """Fold one journal entry into the persistent state (pure; used live and for recovery)."""
    ev, at = e.get("event"), e.get("at")
    st["seq"] = max(int(st.get("seq", 0)), int(e.get("seq", 0)))
    flight = e.get("flight")
    if ev in ("pause_requested", "resume_requested", "shutdown_requested"):
        st["timeline"] = []
        st["flight"] = {"id": flight, "kind": e.get("kind"), "trigger": e.get("trigger"),
                        "started": at}
        st.update(outcome=None, reason=None, hint=None)
    if flight and ev != "activity":
        item = {k: v for k, v in e.items() if k not in ("seq", "flight", "kind", *_BULKY)}
        st.setdefault("timeline", []).append(item)
    if ev == "activity":
        st["last_activity"] = at
    elif ev == "pause_requested":
        # A stop goes straight to releasing; its kernels come with the request (no
        # checkpoint_written will carry them), so a server that dies mid-stop still knows them.
        stop = e.get("mode") == "stop"
        st["state"] = "releasing" if stop else "checkpointing"
        st["inflight"] = {"flight_id": flight, "requested": at, "mode": e.get("mode") or "pause",
                          "kernels": e.get("kernels", []) if stop else [], "checkpoints": []}
        if not stop:
            # Which notebooks were being paused: after a crash mid-checkpoint, these are the
            # ones whose previous checkpoint is offered.
            st["inflight"]["requested_kernels"] = e.get("kernels", [])
        if (st.get("pause") or {}).get("offered"):
            st["pause"] = None  # a new pause supersedes an offered way back
    elif ev == "checkpoint_written":
        # A newer checkpoint of a notebook supersedes what the last server stop saved of it.
        _drop_pending(st, [k.get("path") for k in e.get("kernels") or []])
        inflight = st.get("inflight") or {"flight_id": flight}
        inflight.update(kernels=e.get("kernels", []), checkpoints=e.get("checkpoints", []),
                        bytes_written=e.get("bytes_written", 0), bytes_total=e.get("bytes_total", 0))
        st["inflight"] = inflight
        st["last_checkpoint"] = {
            "id": (e.get("checkpoints") or [None])[0], "ids": e.get("checkpoints", []),
            "created": at, "bytes_total": e.get("bytes_total", 0),
            "bytes_written": e.get("bytes_written", 0), "kernels": len(e.get("kernels", [])),
        }
        st["state"] = "snapshotting"
    elif ev == "snapshot_ready":
        if st.get("inflight") is not None:
            st["inflight"]["snapshot"] = {"snapshot": e.get("snapshot"), "backend": e.get("backend"),
                                          "skipped": e.get("skipped", False)}
        st["state"] = "releasing"
    elif ev == "accelerator_released":
        if st.get("inflight") is not None:
            st["inflight"].update(released_at=at, accelerator=e.get("accelerator"),
                                  released=e.get("released", True))
    elif ev == "paused":
        st["pause"] = st.get("inflight") or st.get("pause")
        st.update(inflight=None, state="paused", flight=None)
    elif ev == "resume_requested":
        st["state"] = "resuming"
    elif ev == "waiting_for_capacity":
        st.update(state="waiting_for_capacity", reason=e.get("reason"))
    elif ev == "pod_scheduled":
        st.update(state="resuming", reason=None)
    elif ev == "verified":
        st["state"] = "restoring" if e.get("outcome") == "fresh" else "verifying"
    elif ev == "ready":
        st.update(state="ready", outcome=e.get("outcome"), pause=None, flight=None, reason=None,
                  hint=None)
        if e.get("report") is not None:
            st["last_report"] = e["report"]
    elif ev == "first_cell_ran":
        report = st.get("last_report")
        if report and report.get("flight_id") == flight and not report.get("first_cell"):
            report["first_cell"] = at
            try:
                report["durations"]["first_cell_s"] = round(
                    (parse_iso(at) - parse_iso(report["requested"])).total_seconds(), 3)
            except (KeyError, TypeError, ValueError):
                pass
    elif ev == "recomputed":
        _merge_recomputed(st.get("last_report"), e)
    elif ev == "renamed":
        _rename(st, str(e.get("old_path") or ""), str(e.get("new_path") or ""))
    elif ev in ("shutdown_requested", "stop_checkpoint_written", "stopped",
                "restored_after_stop"):
        _apply_stop(st, e)
    elif ev in ("kernel_died", "server_killed", "offer_restored", "offer_dismissed"):
        _apply_offer(st, e)
    elif ev == "failed":
        after = e.get("state_after") or "failed"
        if e.get("kind") == "pause":
            if after == "paused":  # kernels may be gone already: keep the way back
                st["pause"] = st.get("inflight") or st.get("pause")
            elif e.get("resume_from"):  # memory is gone: offer the previous good checkpoint
                st["pause"] = e["resume_from"]
            st["inflight"] = None
        elif e.get("kind") == "resume" and st.get("pause") and e.get("report"):
            _note_resume_failure(st["pause"], e["report"])
        st.update(state=after, reason=e.get("message") or e.get("reason"), hint=e.get("hint"),
                  flight=None,
                  outcome="failed" if e.get("kind") == "resume" else None)
        if e.get("report") is not None:
            st["last_report"] = e["report"]


def _apply_offer(st: dict[str, Any], e: dict[str, Any]) -> None:
    """A death's offer made, taken or dismissed (see :mod:`.deaths`). Offers never change the
    lifecycle's state: they are a way back, not a flight."""
    ev = e.get("event")
    offers = st.setdefault("offers", {})
    rec = st.setdefault("recoveries", dict(RECOVERIES))
    for k, v in RECOVERIES.items():
        rec.setdefault(k, v)
    if ev in ("kernel_died", "server_killed"):
        rec["deaths" if ev == "kernel_died" else "server_kills"] += 1
        new = [e.get("offer")] if ev == "kernel_died" else list(e.get("offers") or [])
        for o in new:
            if isinstance(o, dict) and o.get("path"):
                offers[o["path"]] = dict(o)
                rec["offered"] += 1 if o.get("checkpoint_id") else 0
    elif ev == "offer_restored":
        o = offers.pop(e.get("path"), None) or {}
        rec["restored"] += 1
        lost = e.get("cells_lost", o.get("cells_lost"))
        rec["cells_lost"] += lost if isinstance(lost, int) and lost > 0 else 0
        secs = e.get("seconds_lost", o.get("age_s"))
        if isinstance(secs, (int, float)) and not isinstance(secs, bool) and secs > 0:
            rec["seconds_lost"] = round(rec["seconds_lost"] + float(secs), 3)
    else:
        offers.pop(e.get("path"), None)


def _merge_recomputed(report: dict[str, Any] | None, e: dict[str, Any]) -> None:
    """Fold a ``recomputed`` event (POST recompute) into the last report's kernel of that path:
    the variables it re-ran become "recomputed" (or "failed", with the reason)."""
    kernel = next((k for k in (report or {}).get("kernels") or []
                   if k.get("path") == e.get("path")), None)
    if kernel is None:
        return
    rows = kernel.setdefault("variables", [])
    by_name = {v.get("name"): v for v in rows}
    for v in e.get("variables") or []:
        row = by_name.get(v.get("name"))
        if row is None:
            row = as_row(v)
            rows.append(row)
            by_name[row["name"]] = row
        # A failed re-run may be retried; a recomputed variable is done.
        set_status(row, v.get("status"), v.get("reason"))


def moved(path: str | None, old: str, new: str) -> str | None:
    """``path`` once ``old`` (a file or a folder) was renamed to ``new``; None if not under it."""
    if not path or not old:
        return None
    p = path.strip("/")
    if p == old:
        return new
    if p.startswith(old + "/"):
        return new + p[len(old):]
    return None


def _recorded(st: dict[str, Any]) -> list[dict[str, Any]]:
    """Every recorded kernel whose path a resume or a restore will use."""
    out: list[dict[str, Any]] = []
    for found in (st.get("pause"), st.get("inflight")):
        part = found or {}
        out += list(part.get("kernels") or []) + list(part.get("requested_kernels") or [])
        out += list(part.get("previous") or [])
    out += list((st.get("stopped") or {}).get("kernels") or [])
    return list({id(k): k for k in out if isinstance(k, dict)}.values())  # each once


def recorded_paths(st: dict[str, Any], old: str) -> list[str]:
    """The recorded notebooks at or under ``old`` (what a rename of ``old`` moves)."""
    found = [k.get("path") for k in _recorded(st) if moved(k.get("path"), old, old)]
    found += [p for p in (st.get("stopped") or {}).get("pending") or [] if moved(p, old, old)]
    return sorted({p for p in found if p})


def _rename(st: dict[str, Any], old: str, new: str) -> None:
    """A notebook (or its folder) renamed through the server: the paused, pausing and stopped
    records follow it, so its session comes back where the notebook is now. The checkpoint
    stream keeps its name: it is where that notebook's checkpoints are."""
    if not old or not new:
        return
    for k in _recorded(st):
        to = moved(k.get("path"), old, new)
        if to is None:
            continue
        name = k.get("session_name")
        if name and name.strip("/") == k["path"].strip("/"):
            k["session_name"] = to
        elif name and name == k["path"].rsplit("/", 1)[-1]:
            k["session_name"] = to.rsplit("/", 1)[-1]
        k["path"] = to
    stopped = st.get("stopped") or {}
    if stopped.get("pending"):
        stopped["pending"] = [moved(p, old, new) or p for p in stopped["pending"]]


def _note_resume_failure(pause: dict[str, Any], report: dict[str, Any]) -> None:
    """Remember, in the paused record, what a failed resume left: ``not_restored`` (by stream)
    names the notebooks whose restore failed (their kernel is empty; ``unreadable`` when their
    checkpoint is missing or corrupt), which a stop or a pause must never checkpoint over
    their good checkpoint, and which a second resume starts fresh when it is unreadable. A
    kernel that was restored is recorded as the notebook's kernel, so a retry reuses it
    instead of starting another one that nobody owns."""
    by_kid = {k.get("kernel_id"): k for k in pause.get("kernels") or []}
    left = dict(pause.get("not_restored") or {})
    for k in report.get("kernels") or []:
        rec = by_kid.get(k.get("previous_kernel_id"))
        if rec is None:
            continue
        stream = rec.get("stream") or rec.get("path")
        if k.get("outcome") == "failed" and k.get("restore_failed"):
            left[stream] = {"path": rec.get("path"), "kernel_id": k.get("kernel_id"),
                            "checkpoint_id": rec.get("checkpoint_id"),
                            "unreadable": k.get("unreadable"), "reason": k.get("reason")}
        elif k.get("outcome") in ("restored", "live"):
            left.pop(stream, None)
            if k.get("kernel_id"):
                rec["kernel_id"] = k["kernel_id"]
    pause["not_restored"] = left


def not_restored_kernels(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Running kernel id -> note, for the notebooks of a failed resume whose restore failed
    and whose checkpoint is still readable: their kernel holds none of it (a failed restore
    changes nothing), so checkpointing it would put an empty checkpoint over the good one."""
    pause = st.get("pause") or {}
    return {n["kernel_id"]: n for n in (pause.get("not_restored") or {}).values()
            if n.get("kernel_id") and not n.get("unreadable")}


def _drop_pending(st: dict[str, Any], paths: list[str | None]) -> None:
    pending = (st.get("stopped") or {}).get("pending")
    if pending:
        st["stopped"]["pending"] = [p for p in pending if p not in paths]


def _pause_after_stop(st: dict[str, Any], saved: list[dict[str, Any]]) -> list[str]:
    """A stop from a failed resume (the paused record is still the way back): the notebooks
    this stop saved go back through their newer stop checkpoint; the others keep the paused
    checkpoint, offered to POST resume (offered, so that a pause may replace it). Their paths."""
    pause = st.get("pause")
    if not pause:
        return []
    done = {k.get("stream") for k in saved}
    left = [k for k in pause.get("kernels") or [] if k.get("stream") not in done]
    if not left:
        st["pause"] = None
        return []
    notes = {s: n for s, n in (pause.get("not_restored") or {}).items() if s not in done}
    known = {p.get("stream"): p for p in pause.get("previous") or []}
    pause.update(kernels=left, checkpoints=[k.get("checkpoint_id") for k in left],
                 offered=True, not_restored=notes,
                 previous=[known.get(k.get("stream")) or {
                     "path": k.get("path"), "stream": k.get("stream"),
                     "checkpoint_id": k.get("checkpoint_id"), "created": None} for k in left])
    # Those an earlier stop did not save have their own hint (offer_hint).
    return [k.get("path") or str(k.get("stream")) for k in left
            if not (known.get(k.get("stream")) or {}).get("not_saved")]


def _offer_after_stop(st: dict[str, Any], offer: dict[str, Any] | None,
                      rows: list[dict[str, Any]], saved: list[dict[str, Any]],
                      at: str | None) -> None:
    """A stop that did not save some notebooks offers each one's previous checkpoint (the
    stop's ``resume_from``, looked up by the server that stopped, or at the next start when it
    was killed): it joins the state's ``pause``, marked ``offered``, so that POST resume
    restores it into a fresh kernel, never by itself. A paused record that is the way back (not
    offered) is left alone; a notebook already offered keeps that offer."""
    if not offer:
        return
    pause = st.get("pause")
    if pause and not pause.get("offered"):
        return
    done = {k.get("stream") for k in saved}
    lost = {r.get("stream"): r for r in rows
            if r.get("status") != "saved" and r.get("previous_checkpoint")}
    known = {p.get("stream"): p for p in offer.get("previous") or []}
    pause = pause or {"flight_id": offer.get("flight_id"), "mode": "pause", "offered": True,
                      "kernels": [], "checkpoints": [], "previous": []}
    have = {k.get("stream") for k in pause.get("kernels") or []}
    added = False
    for k in offer.get("kernels") or []:
        stream = k.get("stream")
        row = lost.get(stream)
        if row is None or stream in done or stream in have or stream not in known:
            continue
        have.add(stream)
        pause.setdefault("kernels", []).append(dict(k))
        pause.setdefault("checkpoints", []).append(k.get("checkpoint_id"))
        pause.setdefault("previous", []).append({
            **known[stream],
            "not_saved": {"reason": row.get("cause") or row.get("reason"), "stopped_at": at}})
        added = True
    if added:
        st["pause"] = pause


def _offer_text(st: dict[str, Any]) -> str | None:
    """The hint of the checkpoints a server stop offers, while they are offered."""
    pause = st.get("pause") or {}
    return offer_hint(pause) if pause.get("offered") else None


def _joined(*hints: str | None) -> str | None:
    return " ".join(h for h in hints if h) or None


def _apply_stop(st: dict[str, Any], e: dict[str, Any]) -> None:
    """The shutdown checkpoint's events (see :mod:`.shutdown`)."""
    ev, at, flight = e.get("event"), e.get("at"), e.get("flight")
    if ev == "shutdown_requested":
        st["state"] = "stopping"
        st["stopping"] = {"flight_id": flight, "requested": at, "trigger": e.get("trigger"),
                          "hub": bool(e.get("hub")), "kernels": e.get("kernels", []),
                          "saved": []}
    elif ev == "stop_checkpoint_written":
        if st.get("stopping") is not None:
            st["stopping"]["saved"].extend(e.get("kernels") or [])
    elif ev == "stopped":
        saved = list(e.get("kernels") or [])
        rows = list(e.get("rows") or [])
        # A notebook saved by an earlier stop and not reopened since had no kernel in this
        # one: it stays pending (with its checkpoint), or a second stop would drop its restore.
        prev = st.get("stopped") or {}
        here = {k.get("path") for k in saved} | {r.get("path") for r in rows}
        carried = [k for k in prev.get("kernels") or []
                   if k.get("path") in (prev.get("pending") or []) and k.get("path") not in here]
        stopped = {
            "flight_id": flight, "trigger": e.get("trigger"), "hub": bool(e.get("hub")),
            "requested": (st.get("stopping") or {}).get("requested"), "at": at,
            "interrupted": bool(e.get("interrupted")), "budget_s": e.get("budget_s"),
            "kernels": saved + carried, "rows": rows,
            # Restored when a kernel starts for the notebook's session (the next server).
            "pending": [k["path"] for k in saved + carried if k.get("path")],
        }
        st["stopped"] = stopped
        waiting = _pause_after_stop(st, saved)
        _offer_after_stop(st, e.get("resume_from"), rows, saved, at)
        hint = ("Open a saved notebook: its variables are restored before its first cell "
                "runs.") if stopped["pending"] else None
        if waiting:
            hint = (f"{hint + ' ' if hint else ''}Resume to restore {', '.join(waiting)} from "
                    "its checkpoint (its last restore did not complete).")
        hint = _joined(hint, _offer_text(st))
        st.update(state="running", outcome="stopped", flight=None, stopping=None,
                  reason=stopped_text(stopped) if rows else None, hint=hint)
    elif ev == "restored_after_stop":
        stopped = st.get("stopped") or {}
        path = e.get("path")
        _drop_pending(st, [path])
        report = st.get("last_report")
        if not report or report.get("flight_id") != flight:
            report = {"flight_id": flight, "outcome": None, "requested": e.get("requested") or at,
                      "usable": None, "first_cell": None, "trigger": "stop",
                      "after_stop": {"trigger": stopped.get("trigger"),
                                     "hub": bool(stopped.get("hub")),
                                     "stopped_at": stopped.get("at")},
                      "durations": {}, "kernels": []}
        report["kernels"] = [k for k in report.get("kernels") or [] if k.get("path") != path]
        report["kernels"].append({
            "path": path, "kernel_id": e.get("kernel_id"),
            "previous_kernel_id": e.get("previous_kernel_id"), "outcome": e.get("outcome"),
            "reason": e.get("reason"), "checkpoint_id": e.get("checkpoint_id"),
            "warnings": e.get("warnings") or [],
            "variables": [as_row(v) for v in e.get("variables") or []]})
        report["usable"] = at
        report.setdefault("durations", {}).update(e.get("durations") or {})
        ok = any(k.get("outcome") == "restored" for k in report["kernels"])
        report["outcome"] = "restored" if ok else "failed"
        st["last_report"] = report
        # A checkpoint the stop offers for another notebook is still offered.
        if e.get("outcome") == "restored":
            st.update(state="ready", outcome="restored", reason=None, hint=_offer_text(st))
        else:
            st.update(state="ready" if ok else "running", reason=e.get("reason"),
                      hint=_joined("The checkpoint is still there: run %restore in the "
                                   "notebook to retry.", _offer_text(st)))

