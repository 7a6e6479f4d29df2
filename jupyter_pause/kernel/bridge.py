"""What the Jupyter server runs inside a kernel (by silent execution).

Protocol (implemented for the server by :func:`jupyter_pause.server.bridge.run_bridge`)
-----------------------------------------------------------------------------------------

1. The server sends ONE ``execute_request`` with ``silent=True, store_history=False,
   stop_on_error=False, allow_stdin=False`` and::

       code = ("__import__('jupyter_pause.kernel.bridge', fromlist=['_']).call(%r, %r, %d) "
               "if <jupyter_pause importable> else None") % (func, json.dumps(kwargs), PROTOCOL)
       user_expressions = {
           "jupyter_pause": "__import__('jupyter_pause.kernel.bridge', fromlist=['_']).last_result()",
           "jupyter_pause_kernel_side": "<jupyter_pause.kernel.side.describe() if importable, "
                                        "else {'installed': False, 'python': sys.executable}>"}

   ``PROTOCOL`` is :data:`jupyter_pause.kernel.side.PROTOCOL` of the server's version: a kernel
   side of another protocol runs nothing and answers ``{"ok": false, "protocol_mismatch": true,
   "kernel_side": {...}}``. The second expression tells the server what the kernel side is (or
   which interpreter lacks it) with every call; the server sends it alone (code ``None``) to ask
   before a pause (:func:`jupyter_pause.server.kernelside.ask_kernel_side`).

   ``func`` is one of ``checkpoint``, ``restore``, ``liveness``, ``recompute``, ``autosave``; ``kwargs`` are
   that function's keyword arguments as JSON. The code is a single expression: it binds no name
   in the user's namespace, and silent execution adds nothing to the history or ``Out``, does not
   bump the execution count and fires no ``pre/post_run_cell`` hooks.

2. The reply's ``content["user_expressions"]["jupyter_pause"]`` is
   ``{"status": "ok", "data": {"text/plain": "<JSON>"}}``; ``json.loads`` of that text is the
   result dict. If the status of the reply or of the expression is ``"error"``, the call
   failed as a whole; ``ename``/``evalue`` say why.

3. While it works, ``checkpoint`` and ``restore`` print progress lines on stdout (iopub
   ``stream`` messages whose ``parent_header.msg_id`` is the request's)::

       JUPYTER_PAUSE_PROGRESS {"done": 1048576, "total": 8388608}

   throttled to about 5 per second, the last one with ``done == total``. Other stdout text (e.g.
   from a recomputed cell) may be interleaved; a ``stream`` message may hold several lines or
   part of one, so split on newlines across messages.

Results (every function returns a JSON string and never raises)::

    checkpoint(..., variable_timeout=None)
               -> {"ok": true, "checkpoint_id", "bytes_written", "bytes_total", "variables",
                   "pid", "token", "warnings": []} | {"ok": false, "error": "one line",
                   "error_kind": "missing" | "corrupt" | null, "error_type": "StorageFullError"}
    restore    -> {"ok": true, "checkpoint_id", "variables", "warnings", "modules"} | {"ok": false, ...}
    liveness   -> {"ok": true, "token": str|None, "pid", "armed_at", "never_pause": bool,
                   "restored": null | {"checkpoint_id", "at", "by", "variables"},
                   "provenance": bool}
    recompute  -> {"ok": true, "variables": [...]} | {"ok": false, "error"}
    autosave(settings, store_url, key_path, stream, offered)
               -> {"ok": true, "enabled", "every_s", "phase", "saved", "cancelled", "last", ...}

Every ``{"ok": false}`` result carries ``error_type``: the failure's exception type, a class
name of :mod:`jupyter_pause.checkpoint.errors` when it is one of them (``StorageFullError``,
``IntegrityError``, ``KeyMismatchError``, ``NotFoundError``, ``CheckpointError``), else the
exception's own class name (``OpError``, ``KeyboardInterrupt``); the server maps it to a
failure reason (:mod:`jupyter_pause.server.bridgeresults`) and never reads the message.

``variables`` rows: ``{"name", "kind", "size", "status", "reason", "cell", "recomputable"}``.
``checkpoint`` and ``restore`` also return ``process_state``: rows of the same shape with
``kind == "process state"`` (random streams, cwd, environment, settings, IPython's counter:
saved / restored / skipped and why), kept apart from ``variables`` so that counts of variables
stay counts of variables.
``liveness()["restored"]`` is set once this process was rebuilt from a checkpoint (by the
server's ``restore``, ``%restore`` or ``%resume``): the server must then NOT restore it again,
and must not call it live either (``token`` stays None unless a pause armed it in this process).
Its ``variables`` are that restore's rows (updated by a later recompute), for the server's report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ..checkpoint import errors as cp_errors
from ..variables import as_row, row
from . import autosave as _autosave
from . import liveness as _liveness
from . import namespace, ops, provenance, side
from .progress import StdoutProgress

log = logging.getLogger(__name__)

_last: str | None = None


class _Result:
    """Displayed as its raw JSON text, so ``user_expressions`` carries plain JSON."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text)


def _ip() -> Any:
    from IPython import get_ipython

    ip = get_ipython()
    if ip is None:
        raise ops.OpError("not running inside IPython")
    return ip


def _ok(**fields: Any) -> str:
    return json.dumps({"ok": True, **fields}, default=str)


def _fail(e: BaseException) -> str:
    log.debug("jupyter-pause bridge call failed", exc_info=e)
    return json.dumps({"ok": False, "error": ops.one_line(e), "error_kind": _error_kind(e),
                       "error_type": cp_errors.error_type(e)})


def _error_kind(e: BaseException) -> str | None:
    """What the server can act on: "missing" (no such checkpoint) and "corrupt" (it failed
    verification) cannot be fixed by retrying; a key signed for another key may be, once the
    right key is back, so it is not "corrupt"."""
    if isinstance(e, cp_errors.NotFoundError):
        return "missing"
    if isinstance(e, cp_errors.IntegrityError) and not isinstance(e, cp_errors.KeyMismatchError):
        return "corrupt"
    return None


def checkpoint(
    store_url: str | None = None,
    key_path: str | None = None,
    stream: str | None = None,
    token: str | None = None,
    meta: dict[str, Any] | None = None,
    keep: int | None = 5,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    max_size: int | None = None,
    variable_timeout: float | None = None,
) -> str:
    """Arm the liveness token (memory only), then write a checkpoint of the user's variables.

    ``variable_timeout``: seconds one variable may take to serialize; a slower one (a
    ``__getstate__`` that hangs) is skipped with that reason and the checkpoint goes on, so the
    kernel is free again afterwards (see ``checkpoint.timelimit``: this runs in the kernel's main
    thread, where the limit's SIGALRM can interrupt the pickler)."""
    try:
        ip = _ip()
        provenance.install(ip)  # the server calls this on kernels that never ran %load_ext
        if token is not None:
            _liveness.arm(token)
        # a running autosave stops first: this write saves the same state
        with _autosave.yielding(ip):
            res = ops.do_checkpoint(
                ip,
                store_url=store_url,
                key_path=key_path,
                stream=stream or namespace.default_stream(),
                include=include,
                exclude=exclude,
                max_size=max_size,
                keep=keep,
                token=token,
                meta={"trigger": "server", **dict(meta or {})},
                progress=StdoutProgress(),
                unit_timeout=variable_timeout,
            )
        return _ok(
            checkpoint_id=res.checkpoint_id,
            bytes_written=res.bytes_written,
            bytes_total=res.bytes_total,
            variables=[as_row(v) for v in res.variables],
            process_state=[as_row(v) for v in getattr(res, "process_state", [])],
            pid=_liveness.state()["pid"],
            token=_liveness.token(),
            warnings=list(getattr(res, "warnings", []) or []),
        )
    except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt too: always answer
        return _fail(e)


def restore(
    store_url: str | None = None,
    key_path: str | None = None,
    stream: str | None = None,
    checkpoint_id: str | None = None,
    device: str = "auto",
    only: list[str] | None = None,
    process_state: bool | None = None,
) -> str:
    """Read a checkpoint and merge it into the namespace only after everything was read.
    ``process_state``: None = with a full restore only (see ops.do_restore)."""
    try:
        ip = _ip()
        with _autosave.yielding(ip):  # no autosave reads the namespace while it changes
            out = ops.do_restore(
                ip,
                store_url=store_url,
                key_path=key_path,
                stream=stream or namespace.default_stream(),
                checkpoint_id=checkpoint_id,
                device=device,
                only=only,
                progress=StdoutProgress(),
                by="server",
                process_state=process_state,
            )
        auto = _autosave.get(ip)
        if auto is not None and auto.offered == out.checkpoint_id:
            auto.offered = None  # the offer is taken
        return _ok(
            checkpoint_id=out.checkpoint_id,
            variables=out.variables,
            process_state=out.process_state,
            warnings=out.warnings,
            modules=out.modules,
        )
    except BaseException as e:  # noqa: BLE001
        return _fail(e)


def liveness() -> str:
    try:
        state = _liveness.state()
        try:
            state["provenance"] = provenance.get(_ip()) is not None
        except ops.OpError:
            state["provenance"] = False
        return _ok(**state)
    except BaseException as e:  # noqa: BLE001
        return _fail(e)


def recompute(names: list[str] | None = None) -> str:
    """Re-run the recorded cells of variables the last restore could not bring back.

    Uses the provenance of the last restore in this process; names with no such record fall back
    to this kernel's own provenance (cells run since it started)."""
    try:
        ip = _ip()
        rows = list(ops.last_restored_variables or [])
        known = {r["name"] for r in rows}
        prov = provenance.install(ip)
        for name in names or []:
            if name not in known and name in prov.cells:
                rows.append(row(name, "failed", "not restored", cell=prov.cells[name]))
        unknown = [n for n in names or [] if n not in known and n not in prov.cells]
        result = ops.recompute(ip, rows, names, silent=True)
        wanted = set(names) if names is not None else None
        rows_out = [r for r in result if wanted is None or r["name"] in wanted]
        rows_out += [row(n, "failed", "no recorded cell defines it") for n in unknown]
        return _ok(variables=rows_out)
    except BaseException as e:  # noqa: BLE001
        return _fail(e)


def autosave(
    settings: dict[str, Any] | None = None,
    store_url: str | None = None,
    key_path: str | None = None,
    stream: str | None = None,
    offered: str | None = None,
) -> str:
    """Install (or reconfigure) this kernel's autosave; ``offered``: the checkpoint the person
    was offered after this notebook's kernel died (``%restore`` takes it by default).
    Returns the autosave's status."""
    try:
        ip = _ip()
        provenance.install(ip)
        auto = _autosave.install(ip, _autosave.Settings.from_dict(settings),
                                 store_url=store_url, key_path=key_path, stream=stream)
        if offered is not None:
            auto.offered = offered or None
        return _ok(**auto.status())
    except BaseException as e:  # noqa: BLE001
        return _fail(e)


_FUNCS: dict[str, Callable[..., str]] = {
    "autosave": autosave,
    "checkpoint": checkpoint,
    "restore": restore,
    "liveness": liveness,
    "recompute": recompute,
}


def call(func: str, kwargs_json: str = "{}", protocol: int | None = None) -> None:
    """Entry point of the silent execution: run ``func(**json.loads(kwargs_json))``; the JSON
    result is kept for :func:`last_result` (read through ``user_expressions``).

    ``protocol``: the bridge protocol the server speaks. Another one than ours runs nothing:
    the result says so, and the server, which knows both versions and the command that installs
    its own, tells the person (arguments and results may mean something else there)."""
    global _last
    _last = None
    if protocol is not None and protocol != side.PROTOCOL:
        _last = json.dumps({"ok": False, "protocol_mismatch": True, "error_kind": "kernel_side",
                            "error": f"the server speaks bridge protocol {protocol}, this "
                            f"kernel side {side.PROTOCOL}", "kernel_side": side.describe()})
        return
    try:
        fn = _FUNCS[func]
        kwargs = json.loads(kwargs_json or "{}")
        if not isinstance(kwargs, dict):
            raise TypeError("arguments must be a JSON object")
        _last = fn(**kwargs)
    except BaseException as e:  # noqa: BLE001 - unknown function, bad arguments
        if isinstance(e, KeyError):
            e = ops.OpError(f"unknown bridge function {func!r}")
        _last = _fail(e)


def last_result() -> _Result:
    """The JSON of the last :func:`call` (evaluated as a user expression right after it)."""
    return _Result(
        _last if _last is not None else json.dumps({"ok": False, "error": "no bridge call ran"})
    )
