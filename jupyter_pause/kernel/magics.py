"""``%checkpoint``, ``%restore``, ``%pause`` and ``%resume``.

Every failure ends as one ``UsageError`` line in the notebook (IPython shows those without a
traceback and marks the cell as failed, so "Run All" stops), and leaves the namespace untouched.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments
from IPython.display import display

from ..units import format_bytes
from ..variables import as_row, summary
from . import args, autosave, liveness, namespace, ops, provenance, server_api
from .progress import NotebookProgress
from .variablereport import Report

log = logging.getLogger(__name__)


def _one_line_errors(name: str) -> Callable[..., Any]:
    """Turn anything a magic raises into one UsageError line."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(self: Any, line: str = "") -> Any:
            try:
                return fn(self, line)
            except args.HelpShown:
                return None
            except UsageError:
                raise
            except KeyboardInterrupt:
                raise UsageError(f"%{name} interrupted; nothing was changed") from None
            except server_api.ServerError as e:
                raise UsageError(f"%{name}: {e}") from None
            except Exception as e:
                log.debug("%%%s failed", name, exc_info=True)
                raise UsageError(f"%{name} failed: {ops.one_line(e)}") from None

        return inner

    return wrap


_NAMES = {"metavar": "NAMES", "type": args.names, "nargs": "+", "action": "extend"}
_DEVICE = {"default": "auto", "type": args.device}


@magics_class
class PauseMagics(Magics):
    """The magics of ``%load_ext jupyter_pause``."""

    @line_magic
    @_one_line_errors("checkpoint")
    @magic_arguments()
    @kwds(add_help=True)
    @argument("--to", metavar="PATH_OR_URL", dest="store",
              help="checkpoint store: a directory or an fsspec URL (default: the configured store)")
    @argument("--include", help="only these variables (comma or space separated)", **_NAMES)
    @argument("--exclude", help="leave these variables out", **_NAMES)
    @argument("--max-size", metavar="SIZE", type=args.size,
              help="skip variables larger than SIZE (e.g. 500M, 2G)")
    @argument("--stream", help="checkpoint lineage (default: this notebook's path)")
    @argument("--keep", type=int, metavar="N", help="keep the last N checkpoints (default 5)")
    def checkpoint(self, line: str = "") -> None:
        """Write a checkpoint of this kernel's variables."""
        opts = args.parse(self.checkpoint, line)
        stream = opts.stream or namespace.default_stream()
        bar = NotebookProgress("Checkpointing")
        try:
            res = self._checkpoint_now(
                self.shell,
                store_url=opts.store or namespace.default_store_url(),
                key_path=namespace.default_key_path(),
                stream=stream,
                include=opts.include,
                exclude=opts.exclude,
                max_size=opts.max_size,
                keep=opts.keep if opts.keep is not None else ...,
                token=liveness.token(),
                meta={"trigger": "magic"},
                progress=bar,
            )
        except BaseException:
            bar.finish("Checkpoint failed; the previous checkpoint is unchanged.")
            raise
        rows = [as_row(v) for v in res.variables]
        bar.finish(
            f"Checkpoint written in {bar.elapsed():.1f} s: "
            f"{format_bytes(res.bytes_written)} written, {format_bytes(res.bytes_total)} in total."
        )
        notes = []
        if any(r["recomputable"] for r in rows):  # skipped or stale, with a recorded cell
            notes.append(
                "Skipped variables can be rebuilt after a restore with "
                "%restore --recompute (re-runs the cells that defined them)."
            )
        display(
            Report(f"Checkpoint {res.checkpoint_id} of {stream}: {summary(rows)}",
                   rows + [as_row(v) for v in getattr(res, "process_state", [])], notes)
        )

    def _checkpoint_now(self, *a: Any, **kw: Any) -> Any:
        with autosave.yielding(self.shell):  # the autosave under way stops; this saves it all
            return ops.do_checkpoint(*a, **kw)

    @line_magic
    @_one_line_errors("restore")
    @magic_arguments()
    @kwds(add_help=True)
    @argument("--from", metavar="PATH_OR_URL", dest="store",
              help="checkpoint store: a directory or an fsspec URL")
    @argument("--device", help="where tensors go: auto, cpu or cuda:N (default auto)", **_DEVICE)
    @argument("--only", help="restore only these variables", **_NAMES)
    @argument("--recompute", action="store_true",
              help="re-run the recorded cells of variables that could not be stored")
    @argument("--id", dest="checkpoint_id",
              help="a checkpoint id, an autosave's too (default: the latest checkpoint you or a "
              "pause took; after a kernel death, the state offered back)")
    @argument("--stream", help="checkpoint lineage (default: this notebook's path)")
    @argument("--process-state", action="store_true", dest="process_state",
              help="with --only: also put back random streams, cwd, settings (a full restore "
              "always does)")
    def restore(self, line: str = "") -> None:
        """Restore variables from the latest (or a given) checkpoint."""
        opts = args.parse(self.restore, line)
        self._restore(
            opts.store,
            opts.stream,
            opts.checkpoint_id,
            opts.device,
            opts.only,
            opts.recompute,
            by="magic",
            process_state=True if opts.process_state else None,
        )

    def _restore(
        self,
        store: str | None,
        stream: str | None,
        checkpoint_id: str | None,
        device: str,
        only: list[str] | None,
        recompute: bool,
        by: str,
        title_prefix: str = "Restored",
        process_state: bool | None = None,
    ) -> ops.Restored:
        stream = stream or namespace.default_stream()
        auto = autosave.get(self.shell)
        if checkpoint_id is None and auto is not None and auto.offered and store is None:
            # After a death the offered checkpoint is the way back, even when this new kernel
            # autosaved its own (newer, smaller) state since.
            checkpoint_id = auto.offered
        elif checkpoint_id is None and by == "magic":
            # `%checkpoint`, a few cells, `%restore`: the person goes back to what they saved,
            # not to the autosave of the cells they are undoing.
            checkpoint_id = ops.newest_taken(store or namespace.default_store_url(),
                                             namespace.default_key_path(), stream)
        bar = NotebookProgress("Restoring")
        try:
            with autosave.yielding(self.shell):
                out = ops.do_restore(
                    self.shell,
                    store_url=store or namespace.default_store_url(),
                    key_path=namespace.default_key_path(),
                    stream=stream,
                    checkpoint_id=checkpoint_id,
                    device=device,
                    only=only,
                    progress=bar,
                    by=by,
                    process_state=process_state,
                )
        except BaseException:
            bar.finish("Restore failed; no variable was changed.")
            raise
        if auto is not None and auto.offered == out.checkpoint_id:
            auto.offered = None
        nbytes = getattr(out.result, "bytes_read", None) or bar.total or bar.done
        bar.finish(f"Read {format_bytes(nbytes)} in {bar.elapsed():.1f} s.")
        rows = out.variables
        if recompute:
            rows = ops.recompute(self.shell, rows, None)
        notes = [f"warning: {w}" for w in out.warnings]
        if out.modules:
            notes.append("re-imported: " + ", ".join(out.modules))
        pending = [str(r["name"]) for r in rows if r["recomputable"]]
        if pending and not recompute:
            notes.append(
                f"{', '.join(pending)}: not stored; %restore --recompute re-runs the "
                "cells that defined them."
            )
        display(
            Report(f"{title_prefix} {out.checkpoint_id} of {stream}: {summary(rows)}",
                   rows + out.process_state, notes)
        )
        return out

    @line_magic
    @_one_line_errors("pause")
    @magic_arguments()
    @kwds(add_help=True)
    @args.exclusive()
    @argument("--never", action="store_true", help="never pause this kernel automatically")
    @argument("--allow", action="store_true", help="allow pausing this kernel again")
    @argument("--autosave", nargs="+", metavar="off|on|every N s",
              help="autosave after cells: off, on, or at most every N seconds")
    @argument("--lose-state", action="store_true",
              help="pause even if a kernel cannot be checkpointed (another language, or no "
              "jupyter-pause in its environment): its state is lost, and named in the report")
    def pause(self, line: str = "") -> None:
        """Pause this workspace (checkpoint, then free the accelerator)."""
        opts = args.parse(self.pause, line)
        if opts.autosave is not None:
            print(autosave.set_from_words(self.shell, opts.autosave))
            return
        if opts.never or opts.allow:
            liveness.set_never_pause(opts.never)
            print(
                "This kernel will "
                + (
                    "never be paused automatically (%pause --allow undoes it)."
                    if opts.never
                    else "be paused automatically again when idle."
                )
            )
            return
        server = server_api.find_server()
        body: dict[str, Any] = {"trigger": "magic", "interrupt": False}
        if opts.lose_state:
            body["allow_uncheckpointable"] = True
        # This kernel is busy with this cell: the server must not ask it anything before
        # answering (its question would wait behind this cell), and its own record of the
        # kernel's state may not show the cell yet (IOPub and HTTP race to the server).
        me = server_api.own_kernel_id()
        try:
            # The server asks the other kernels first (up to 10 s, all together).
            _, payload = server_api.request(
                server, "POST", "pause", body, timeout=60,
                headers={server_api.FROM_KERNEL_HEADER: me} if me else None)
        except server_api.ServerError as e:
            if e.payload.get("reason") != "uncheckpointable":
                raise
            names = "; ".join(
                f"{k.get('path') or k.get('kernel_id')} ({k.get('kernel')}: {k.get('why')})"
                for k in e.payload.get("uncheckpointable") or []
            )
            raise UsageError(
                f"%pause: not paused, nothing was changed: a pause would lose the state of "
                f"{names}. %pause --lose-state pauses anyway."
            ) from None
        flight = payload.get("flight") or {}
        print(
            "Pause requested"
            + (f" (flight {flight['id']})" if flight.get("id") else "")
            + ": the server checkpoints this kernel as soon as this cell finishes, then frees "
            "the accelerator. Use %resume or the Resume button to come back."
        )

    @line_magic
    @_one_line_errors("resume")
    @magic_arguments()
    @kwds(add_help=True)
    @argument("--device", **_DEVICE)
    @argument("--recompute", action="store_true")
    def resume(self, line: str = "") -> None:
        """Resume the workspace; restores this kernel if it is a fresh one."""
        opts = args.parse(self.resume, line)
        server = server_api.find_server()
        if liveness.token() is not None:
            _tell_resumed(server)
            print(
                "This kernel is the live one: it kept its state through the pause; nothing to "
                "restore."
            )
            return
        already = liveness.restored()
        if already:
            _tell_resumed(server)
            print(f"This kernel was already restored from checkpoint {already['checkpoint_id']}.")
            return
        server_api.request(server, "POST", "resume", {"trigger": "magic"})
        # The server cannot restore this kernel while this cell runs (its request would queue
        # behind it), so the restore happens here; liveness() then reports it as restored.
        self._restore(
            None,
            None,
            None,
            opts.device,
            None,
            opts.recompute,
            by="resume",
            title_prefix="Resumed: this is a fresh kernel, restored",
        )


def _tell_resumed(server: dict[str, Any]) -> None:
    """Ask the server to resume; a kernel that is already live or restored has nothing to wait
    for, so "not paused" (409: the server resumed the workspace already) is no error here."""
    try:
        server_api.request(server, "POST", "resume", {"trigger": "magic"})
    except server_api.ServerError as e:
        if e.status != 409:
            raise


_magics: PauseMagics | None = None


def load(ip: Any) -> None:
    """Register the magics and the provenance hooks (``%load_ext jupyter_pause``)."""
    global _magics
    provenance.install(ip)
    autosave.install(ip, autosave.Settings.from_env(), store_url=namespace.default_store_url(),
                     key_path=namespace.default_key_path())
    if _magics is None or _magics.shell is not ip:
        _magics = PauseMagics(ip)
    ip.register_magics(_magics)


def unload(ip: Any) -> None:
    global _magics
    provenance.uninstall(ip)
    autosave.uninstall(ip)
    line_magics = ip.magics_manager.magics.get("line", {})
    for name in ("checkpoint", "restore", "pause", "resume"):
        fn = line_magics.get(name)
        if getattr(fn, "__self__", None) is _magics:
            del line_magics[name]
    _magics = None
