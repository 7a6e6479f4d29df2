"""Start-up: the state rebuilt from state.json and the journal, and the flights a dead server
left half done settled, so that a crash at any step leaves a state a person can act on."""

from __future__ import annotations

from typing import Any

from ..cluster.base import KernelRecord
from ..vocabulary import RESUME_STATES
from .previous import add_previous, offer_previous, offer_text
from .recorder import Recorder
from .state import apply, default_state


def load(rec: Recorder) -> None:
    """Rebuild the state from state.json + newer journal lines; settle interrupted flights.

    Runs at server start (before the event loop serves requests), so blocking I/O is fine.
    """
    journal = rec.journal
    journal.open()
    st = journal.load_state() or default_state()
    if not isinstance(st.get("seq", 0), int) or isinstance(st.get("seq"), bool):
        st["seq"] = 0  # an edited state.json: replay the whole journal instead
    for entry in journal.entries(after_seq=int(st.get("seq", 0))):
        try:
            apply(st, entry)
        except Exception as e:  # noqa: BLE001 - a line of odd content must not stop the server
            journal.skipped_lines += 1
            rec.log.warning("jupyter_pause: journal line seq %s not applied: %s",
                            entry.get("seq"), e)
    rec.state = {**default_state(), **st}
    journal.seq = max(journal.seq, int(rec.state.get("seq", 0)))
    cur, flight = rec.state["state"], rec.state.get("flight") or {}
    fid = flight.get("id")
    if cur == "checkpointing":
        # The server died before every checkpoint was written: the pause did not happen.
        # Earlier checkpoints are untouched (a checkpoint becomes visible only when complete).
        _settle_interrupted_checkpoint(rec, fid)
    elif cur in ("snapshotting", "releasing"):
        # Every checkpoint is written: the way back exists, and the kernels went down with
        # the server (or the pod); count the pause as done so that resume restores them.
        rec.record_sync("paused", fid, "pause", recovered=True)
    elif cur in RESUME_STATES:
        rec.record_sync("failed", fid, "resume", step=cur, reason="interrupted",
                        message=f"the server stopped during {cur}", state_after="paused",
                        hint="Resume again; the checkpoint is still available.")
    elif cur == "stopping":
        _settle_interrupted_stop(rec, fid)
    journal.save_state(rec.state)


def _settle_interrupted_stop(rec: Recorder, fid: str | None) -> None:
    """The server was killed (the grace period ended) during its shutdown checkpoint: the
    kernels whose checkpoint was journaled are saved; the others keep their previous one."""
    stopping = rec.state.get("stopping") or {}
    saved = list(stopping.get("saved") or [])
    done = {k.get("kernel_id"): k for k in saved}
    rows, lost = [], []
    for k in stopping.get("kernels") or []:
        kr = KernelRecord.from_dict(k)
        row: dict[str, Any] = {"path": kr.path, "stream": kr.stream,
                               "kernel_id": kr.kernel_id, "status": "not_saved",
                               "checkpoint_id": None, "reason": "the server was killed "
                               "during its shutdown checkpoint"}
        if kr.kernel_id in done:
            row.update(status="saved", reason=None,
                       checkpoint_id=done[kr.kernel_id].get("checkpoint_id"))
        else:
            lost.append(kr)
        rows.append(row)
    offer = offer_previous(rec.app, lost, fid) if lost else None
    add_previous(rows, offer)
    # The not-saved notebooks' previous checkpoints are offered to POST resume (state.apply).
    extra = {"resume_from": offer} if offer else {}
    rec.record_sync("stopped", fid, "stop", trigger=stopping.get("trigger"),
                    hub=bool(stopping.get("hub")), interrupted=True, rows=rows, kernels=saved,
                    **extra)


def _settle_interrupted_checkpoint(rec: Recorder, fid: str | None) -> None:
    """A pause that died mid-checkpoint. Kernels that still run (the same process kept
    them) are untouched: back to running. Kernels that died with the server lost their
    memory: the state offers their previous good checkpoints, which POST resume restores."""
    message = "the server stopped during checkpointing; the pause did not happen"
    requested = [KernelRecord.from_dict(k) for k in
                 (rec.state.get("inflight") or {}).get("requested_kernels") or []]
    km = rec.serverapp.kernel_manager
    gone = [r for r in requested if r.kernel_id not in km]
    offer = offer_previous(rec.app, gone, fid) if gone else None
    if offer is None:
        hint = ("Pause again; the previous checkpoint is still available." if not gone else
                "The kernels stopped with the server and no earlier checkpoint of theirs "
                "exists; pause again once they run.")
        rec.record_sync("failed", fid, "pause", step="checkpointing", reason="interrupted",
                        message=message, state_after="running", hint=hint)
        return
    rec.record_sync(
        "failed", fid, "pause", step="checkpointing", reason="interrupted",
        message=f"{message}; the kernels stopped with it ({offer_text(offer)})",
        state_after="failed", resume_from=offer,
        hint="Resume to restore the previous checkpoint into fresh kernels, or pause again.")
