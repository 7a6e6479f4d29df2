"""Checkpoint, restore and recompute as the magics and the bridge both run them.

Every failure leaves the namespace as it was: ``read`` returns values and only after it returned
without error are they merged into ``user_ns``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .. import checkpoint as cp
from ..checkpoint.retention import is_autosave
from ..statefile import protected_ids
from ..variables import VariableRow, as_row, is_recomputable, row, set_status
from . import ipystate, liveness, namespace, provenance
from .variablereport import apply_load_notes

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]
_GONE = object()
PENDING_KEY = "not_restored"  # manifest meta: variables still missing since an earlier restore


class OpError(Exception):
    """A failure to show as one line (``str(e)``)."""


def one_line(exc: BaseException) -> str:
    """A person-readable single line for any exception (CheckpointError's str() already is)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    else:
        text = str(exc) or type(exc).__name__
        if not isinstance(exc, (cp.CheckpointError, OpError)):
            text = f"{type(exc).__name__}: {text}"
    text = " ".join(text.split())  # one line, whatever the exception's text looked like
    return text if len(text) <= 400 else text[:397] + "..."


# One change-detection cache per kernel process and store: a cache says "unchanged, reuse blob X",
# which is only true for the store X was written to.
_caches: dict[str, cp.WriteCache] = {}
_caches_lock = threading.Lock()


def _cache_for(store_url: str | None) -> cp.WriteCache:
    key = store_url or ""
    with _caches_lock:
        if key not in _caches:
            _caches[key] = cp.WriteCache()
        return _caches[key]


def protected_checkpoints() -> set[str]:
    """Checkpoint ids the server's pause or resume depends on, when the kernel can see the
    server's state (``JUPYTER_PAUSE_STATE_DIR``): %checkpoint's retention must not delete them.
    Without it, retention still keeps pinned checkpoints and the newest one a pause wrote."""
    state_dir = os.environ.get("JUPYTER_PAUSE_STATE_DIR")
    if not state_dir:
        return set()
    try:
        return {i for i in protected_ids(state_dir) if isinstance(i, str)}
    except Exception:  # a damaged state file must not fail a checkpoint
        log.debug("cannot read the server state in %s", state_dir, exc_info=True)
        return set()


def do_checkpoint(
    ip: Any,
    *,
    store_url: str | None,
    key_path: str | None,
    stream: str,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    max_size: int | None = None,
    keep: Any = ...,  # ... = the engine's default retention
    token: str | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: ProgressFn | None = None,
    unit_timeout: float | None = None,
    kind: str = "checkpoint",
    publish_guard: Callable[[Any], Any] | None = None,
    done_with: Callable[[list[Any]], None] | None = None,
) -> Any:
    """Write a checkpoint of the user's variables; returns the engine's ``WriteResult``.
    ``unit_timeout``: seconds one variable may take to serialize before it is skipped.
    ``kind``: recorded in the manifest's meta ("autosave" is kept apart by retention, see
    :mod:`.autosave`); ``publish_guard(publish)`` wraps the store's publish (the autosave's
    last chance to cancel a write that a cell started during); ``done_with``: the engine's
    hook for storages it will not read again (a forked autosave gives their memory back)."""
    prov = provenance.install(ip)
    ns = namespace.user_variables(ip)
    include = list(include) if include is not None else None
    if include is not None:
        unknown = [n for n in include if n not in ns]
        if unknown:
            raise OpError(f"no variable named {', '.join(unknown)} in this kernel")
    outs = ipystate.outputs(ip) if include is None else {}
    if outs:  # Out[n] / _n go with the variables (pickled like them), reported as one row
        include, ns = [*ns, *outs], {**ns, **outs}
    store = cp.open_store(store_url)
    if publish_guard is not None:
        store.publish = publish_guard(store.publish)  # this write's store object only
    key = cp.load_or_create_key(key_path, store=store)  # refuses to orphan existing checkpoints
    full_meta = {
        "modules": namespace.module_aliases(ip),
        "kernel_pid": os.getpid(),
        PENDING_KEY: {n: c for n, c in prov.pending.items() if n not in ns},
        **dict(meta or {}),
        "kind": kind,
    }
    kwargs: dict[str, Any] = {"protect": protected_checkpoints()}
    if keep is not ...:
        kwargs["keep"] = keep
    if unit_timeout:
        kwargs["unit_timeout"] = unit_timeout
    res = cp.write(
        ns,
        store,
        key=key,
        stream=stream,
        include=include,
        exclude=list(exclude) if exclude is not None else None,
        max_size=max_size,
        provenance=prov.snapshot(ns),
        liveness={"token": token, "pid": os.getpid()},
        meta=full_meta,
        progress=progress,
        cache=_cache_for(store_url),
        process_state=True,
        done_with=done_with,
        **kwargs,
    )
    out_row = ipystate.output_row([as_row(v) for v in res.variables])
    if out_row is not None:
        res.variables = [v for v in res.variables if not ipystate.is_output_name(v.name)]
        res.process_state.append(cp.VariableReport(  # output_row's fields are all set
            str(out_row["name"]), str(out_row["kind"]), out_row["size"] or 0,
            str(out_row["status"]), out_row["reason"]))
    return res


def newest_taken(store_url: str | None, key_path: str | None, stream: str) -> str | None:
    """The newest checkpoint of ``stream`` that is not an autosave (one ``%checkpoint``, a pause
    or a shutdown took), None when there is none: the engine's default, the newest of any kind,
    then applies. Only authentic manifests are listed (the store is read as untrusted)."""
    try:
        store = cp.open_keyed_store(store_url, key_path)
        return next((m.id for m in store.list(stream) if not is_autosave(m)), None)
    except Exception:  # the read itself then reports what is wrong with the store
        log.debug("cannot list the checkpoints of %s", stream, exc_info=True)
        return None


class Restored:
    """What a restore did: the engine's ReadResult plus what the kernel side added."""

    def __init__(self, rr: Any, modules: list[str], missing_modules: list[str]) -> None:
        self.result = rr
        self.checkpoint_id = rr.manifest.id
        rows = [as_row(v) for v in rr.variables]
        self.variables: list[VariableRow] = [
            r for r in rows if not ipystate.is_output_name(r["name"])]
        # rows of the variables' shape, kind procstate.KIND: what of the process came back
        self.process_state = [as_row(v) for v in getattr(rr, "process_state", None) or []]
        out_row = ipystate.output_row(rows)
        if out_row is not None:
            self.process_state.append(out_row)
        self.warnings = list(getattr(rr, "warnings", []) or [])
        self.modules = modules
        if missing_modules:
            self.warnings.append("modules not importable here: " + ", ".join(missing_modules))


# The last restore's variable reports, for bridge.recompute() called later by the server.
last_restored_variables: list[VariableRow] | None = None


def do_restore(
    ip: Any,
    *,
    store_url: str | None,
    key_path: str | None,
    stream: str,
    checkpoint_id: str | None = None,
    device: str = "auto",
    only: Iterable[str] | None = None,
    progress: ProgressFn | None = None,
    by: str = "magic",
    process_state: bool | None = None,
) -> Restored:
    """Read a checkpoint, then (and only then) merge its values into ``user_ns``.
    ``process_state``: put back random streams, cwd, settings, IPython's counter, ... before
    any variable; by default for a full restore only (``only`` leaves the process as it is)."""
    global last_restored_variables
    prov = provenance.install(ip)
    store = cp.open_store(store_url)
    key = cp.load_or_create_key(key_path, store=store)  # refuses to orphan existing checkpoints
    bound: list[tuple[list[str], list[str]]] = []

    def bind_modules(m: Any) -> None:
        # before the values are rebuilt: a notebook's __setstate__ or __reduce__ function looks
        # its modules (np, torch) up in the namespace as it runs
        meta = m.meta or {}
        aliases = meta.get("modules") if isinstance(meta, Mapping) else None
        if only is not None:
            aliases = {}  # a partial restore brings back what was asked for, nothing else
        bound.append(namespace.reimport_modules(ip, aliases))

    rr = cp.read(
        store,
        key=key,
        stream=stream,
        checkpoint_id=checkpoint_id,
        device=device,
        only=list(only) if only is not None else None,
        progress=progress,
        process_state=only is None if process_state is None else process_state,
        before_values=bind_modules,
    )
    # Everything was read and verified: from here on nothing can fail half-way.
    values = dict(rr.values)
    ipystate.adopt_outputs(ip, values)  # Out[n] / _n into IPython's output history
    ip.push(values, interactive=True)
    meta = rr.manifest.meta or {}
    modules, missing = bound[0] if bound else ([], [])
    out = Restored(rr, modules, missing)
    apply_load_notes(out.variables, rr.load_notes)
    _add_pending_rows(out, meta, only)
    if only is not None:
        absent = [n for n in only if n not in {v["name"] for v in out.variables}]
        if absent:
            out.warnings.append(f"not in checkpoint {out.checkpoint_id}: {', '.join(absent)}")
        if rr.manifest.process and not out.process_state:
            out.warnings.append("process state (random streams, cwd, settings) left as it is: "
                                "a partial restore; --process-state restores it too")
    prov.adopt({v["name"]: v.get("cell") for v in out.variables
                if v["name"] is not None and v["name"] in values})
    prov.adopt(dict.fromkeys(modules))
    prov.pending.update(
        {
            v["name"]: v["cell"]
            for v in out.variables
            if v["recomputable"] and v["name"] is not None and v["cell"] is not None
            and v["name"] not in values
        }
    )
    liveness.mark_restored(out.checkpoint_id, by, out.variables)
    last_restored_variables = out.variables
    return out


def _add_pending_rows(out: Restored, meta: Any, only: Iterable[str] | None) -> None:
    """Rows for variables an earlier restore could not bring back either (see PENDING_KEY)."""
    pending = meta.get(PENDING_KEY) if isinstance(meta, Mapping) else None
    if not isinstance(pending, Mapping):
        return
    wanted = set(only) if only is not None else None
    have = {v["name"] for v in out.variables}
    for name, cell in sorted(pending.items()):
        if name in have or (wanted is not None and name not in wanted):
            continue
        if not isinstance(cell, Mapping) or not cell.get("source"):
            continue
        out.variables.append(row(
            name, "skipped", "not restored since an earlier checkpoint",
            cell={"execution_count": cell.get("execution_count"), "source": cell["source"]}))


@contextlib.contextmanager
def _quiet_tracebacks(ip: Any) -> Iterator[None]:
    """A recomputed cell that fails is reported in one line, not with a traceback."""
    saved = ip.__dict__.get("showtraceback"), ip.__dict__.get("showsyntaxerror")
    ip.showtraceback = lambda *a, **k: None
    ip.showsyntaxerror = lambda *a, **k: None
    try:
        yield
    finally:
        for name, value in zip(("showtraceback", "showsyntaxerror"), saved, strict=False):
            if value is None:
                ip.__dict__.pop(name, None)
            else:
                setattr(ip, name, value)


def recompute(
    ip: Any,
    variables: list[VariableRow],
    names: Iterable[str] | None = None,
    *,
    silent: bool = False,
) -> list[VariableRow]:
    """Re-run, in execution order, the recorded cells of variables that could not be restored.

    Returns ``variables`` with those rows' status set to "recomputed" or "failed". Variables that
    exist (restored from the checkpoint, or defined since) win over what a re-run cell rebinds as
    a side effect: they are the newer state; the re-run only fills the gaps."""
    wanted = set(names) if names is not None else None
    rows = [v.copy() for v in variables]
    targets_by_cell: dict[tuple[Any, str], list[VariableRow]] = {}
    for r in rows:
        cell = r.get("cell")
        if cell is None or not is_recomputable(r.get("status"), cell):
            continue
        if wanted is not None and r["name"] not in wanted:
            continue
        targets_by_cell.setdefault((cell.get("execution_count"), cell["source"]), []).append(r)
    prov = provenance.install(ip)
    order = sorted(targets_by_cell, key=lambda k: (k[0] is None, k[0] or 0))
    for key in order:
        group = targets_by_cell[key]
        ns = ip.user_ns
        targets = {r["name"] for r in group}
        protected = {k: v for k, v in ns.items() if not k.startswith("_") and k not in targets}
        error = None
        try:
            with prov.suspended(), _quiet_tracebacks(ip):
                result = ip.run_cell(key[1], store_history=False, silent=silent)
            exc = result.error_before_exec or result.error_in_exec
            if exc is not None:
                error = one_line(exc)
        except Exception as e:  # noqa: BLE001 - reported per variable
            error = one_line(e)
        for k, v in protected.items():
            if ns.get(k, _GONE) is not v:
                ns[k] = v
        cell = {"execution_count": key[0], "source": key[1]}
        for r in group:
            name = r["name"]
            if error is None and name is not None and name in ns:
                set_status(r, "recomputed", f"re-ran cell [{key[0]}]")
                prov.adopt({name: cell})
            else:  # still recomputable: a later try may succeed
                set_status(r, "failed", f"re-running cell [{key[0]}] failed: {error}" if error
                           else f"re-running cell [{key[0]}] did not define it")
    liveness.update_restored([r for g in targets_by_cell.values() for r in g])
    return rows
