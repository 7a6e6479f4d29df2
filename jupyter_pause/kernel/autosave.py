"""Autosave: a checkpoint of kind ``autosave`` after cells, written while the kernel is idle.

- ``post_run_cell`` only schedules (a lock and a notify: microseconds on the cell's path).
- Once the kernel has been idle for ``idle_delay`` (its reply and idle status are out), the
  writer thread forks the kernel (:mod:`.forkwrite`): the child writes the checkpoint from its
  copy-on-write memory, through the engine's change cache (content hashes: a write through a
  numpy view or ``.data`` is seen), and sends back what it learnt, so that the next pause or
  shutdown checkpoint writes only what changed since. The parent goes on at once: a cell
  started meanwhile neither waits nor tears the copy (it is the state before that cell), and
  the autosave completes even while cells run.
- Why not a thread writing in the kernel: the engine's C pickler holds the interpreter lock for
  as long as one variable takes (seconds for a dict of a million entries), so the next cell
  waited that long (measured: +475 ms p99 on the bench's mixed namespace). The thread is kept
  for kernels where CUDA is initialized (a forked CUDA context is unusable) and for platforms
  without fork: there ``pre_run_cell`` stops the write where it is (an exception raised in
  the thread) and a write is published only if no cell started meanwhile (checked under the
  lock right before its manifest is published), so a torn state is never published.
- Silent executions and comm messages (widget callbacks) run the notebook's code without cell
  hooks: the kernel's handlers of those requests count them, no write starts while one runs,
  and one that starts during a thread's write stops it (a fork's copy is already taken).
- Why not dirty tracking (Kishu, ElasticNotebook): it cannot see writes through views and C
  extensions, the silent-loss case the engine's content hashes exist for.
- Either way the previous autosave stays readable until a new one is published whole, and
  nothing is sent on IOPub: an autosave neither shows the kernel busy nor moves
  jupyter_server's ``last_activity`` (it is not the person's activity).
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .. import checkpoint as cp
from ..checkpoint import procstate
from ..checkpoint.retention import retain_autosaves
from . import forkwrite, namespace, ops

log = logging.getLogger(__name__)

KIND = "autosave"
ENV = "JUPYTER_PAUSE_AUTOSAVE"
FORK_IDLE_FACTOR = 3.0  # idle time before a fork, in forks
RETRY_MAX_S = 60.0  # the longest a thread write stopped by callbacks waits to come again


class Cancelled(KeyboardInterrupt):
    """A cell started (or a foreground checkpoint/restore): the autosave under way stops.

    A KeyboardInterrupt so that the engine aborts the whole write (it never takes an interrupt
    for one variable's failure) and removes what the write had put in the store."""


@dataclass
class Settings:
    """What the autosave does; ``enabled=False`` writes nothing."""

    enabled: bool = True
    every_s: float = 0.0      # at most one autosave per this many seconds (0: after each cell)
    idle_delay: float = 0.25  # the kernel idle this long before a write starts
    keep: int = 3             # newest autosaves kept per notebook
    mode: str = "auto"        # auto (fork, or thread where CUDA is initialized) | fork | thread
    max_bytes: int = 0        # and at most this many bytes of them (0: no byte bound)

    @classmethod
    def from_env(cls) -> Settings:
        """The server's ``c.PauseApp.autosave`` as it exports it to its kernels (JSON in
        ``JUPYTER_PAUSE_AUTOSAVE``); the defaults without it, and for a value that is not."""
        raw = os.environ.get(ENV, "")
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        return cls.from_dict(data if isinstance(data, dict) else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Settings:
        s = cls()
        for k, v in (d or {}).items():
            if k == "enabled" and isinstance(v, bool):
                s.enabled = v
            elif k in ("every_s", "idle_delay") and isinstance(v, (int, float)) and \
                    not isinstance(v, bool) and 0 <= v < 1e9:
                setattr(s, k, float(v))
            elif k == "mode" and v in ("auto", "fork", "thread"):
                s.mode = v
            elif k in ("keep", "max_bytes") and isinstance(v, int) and \
                    not isinstance(v, bool) and v >= 0:
                setattr(s, k, v)
        s.keep = max(1, s.keep)
        return s


class Autosave:
    """The autosave of one shell: hooks, the writer thread and what it did."""

    def __init__(self, ip: Any, settings: Settings, *, store_url: str | None = None,
                 key_path: str | None = None, stream: str | None = None) -> None:
        self.ip = ip
        self.settings = settings
        self.store_url, self.key_path = store_url, key_path
        self.stream = stream or namespace.default_stream()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._cancel = threading.Event()
        self._fg = 0                         # foreground checkpoints/restores under way
        self._mode_now = "thread"            # how the write under way runs: thread | fork
        self._child: int | None = None       # the forked writer's pid
        self._fork_s = 0.0                   # how long a fork of this kernel takes (recent)
        self._due: float | None = None       # monotonic time a write may start
        self._cell: int | None = None        # execution count of the last finished cell
        self._phase = "idle"                 # idle | forking | writing | publishing | retaining
        self._in_cell = 0                    # cells running now (a cell may run another)
        self._callbacks = 0                  # silent executions and comm messages running now
        self._callback_stops = 0             # thread writes stopped by them since one was saved
        self.wrapped: dict[str, tuple[Any, Any]] = {}  # kernel handler -> (its own, ours)
        self._cells_started = 0              # cells begun so far: a round forks only if none
        self._round_cells = 0                # ... began since the round read the cell's number
        self._last_start = 0.0
        self._stopped = False
        # Checkpoint the person was offered after a death: %restore takes it by default.
        self.offered: str | None = None
        self.stats: dict[str, Any] = {"saved": 0, "cancelled": 0, "failed": 0, "last": None,
                                      "error": None, "hook_ms_max": 0.0, "fork_ms_max": 0.0,
                                      "callback_stops": 0}
        self._thread = threading.Thread(target=self._loop, name="jupyter-pause-autosave",
                                         daemon=True)
        self._thread.start()

    # -- IPython events (the cell's critical path: no I/O, no hashing) --------------------------
    def post_run_cell(self, result: Any) -> None:
        t0 = time.perf_counter()
        info = getattr(result, "info", None)
        # our own nested cells (recompute) are not the notebook's cells
        ours = info is not None and not getattr(info, "store_history", True)
        with self._lock:
            self._in_cell = max(0, self._in_cell - 1)
            if not ours:
                self._cell = getattr(result, "execution_count", None)
            if self.settings.enabled and not self._stopped and not ours:
                now = time.monotonic()
                # A cell that starts during the fork waits for it (the fork holds the
                # interpreter): wait for an idle time a few forks long, so that cells in quick
                # succession are saved at the first pause between them instead.
                idle = max(self.settings.idle_delay, FORK_IDLE_FACTOR * self._fork_s)
                self._due = max(now + idle, self._last_start + self.settings.every_s)
                self._wake.notify()
        self._held(t0)

    def pre_run_cell(self, info: Any) -> None:
        t0 = time.perf_counter()
        with self._lock:
            self._in_cell += 1
            self._cells_started += 1
        forkwrite.thaw()  # the person's code never runs with the collector frozen
        self.cancel(for_cell=True)
        self._held(t0)

    # Silent executions (a front end's variable inspector, another client's code) and comm
    # messages (widget callbacks) run the notebook's code without pre/post_run_cell. No fork
    # copies the state in the middle of one; one that is due waits until they end. They
    # neither schedule nor postpone an autosave, and stop only a thread's write (which reads
    # the live namespace): a front end that polls several times a second would otherwise hold
    # every autosave back.
    def callback_started(self) -> None:
        with self._lock:
            self._callbacks += 1
            # A thread's write pickles the live namespace: a callback that changes it now would
            # tear the copy. The write stops as for a cell, and comes again once they end.
            tears = (self._mode_now == "thread" and self._phase == "writing"
                     and not self._cancel.is_set())
        forkwrite.thaw()  # the person's code never runs with the collector frozen
        if tears:
            self.cancel(again=True)

    def callback_ended(self) -> None:
        with self._lock:
            self._callbacks = max(0, self._callbacks - 1)
            self._wake.notify_all()

    def cancel(self, for_cell: bool = False, again: bool = False) -> None:
        """Stop a write under way (unless it already passed the publish gate) and the one due.

        ``for_cell``: a cell starts. A forked write goes on: its copy of the namespace is the
        one before the cell. A thread's write is stopped where it is (an exception raised in
        the writer thread at its next bytecode), not at the end of the variable it pickles.
        ``again``: the autosave is due again (after the callbacks that stopped it)."""
        with self._lock:
            if not again:
                self._due = None
            if self._phase not in ("forking", "writing", "retaining") or self._cancel.is_set():
                return  # (again: a retry another callback set stays)
            if again:
                self._due = None
                if self.settings.enabled and not self._stopped and not self._fg:
                    # backs off while callbacks keep stopping writes (a widget that plays):
                    # each attempt holds the interpreter while it pickles, and is thrown away
                    self._callback_stops += 1
                    self.stats["callback_stops"] += 1
                    backoff = min(RETRY_MAX_S, self.settings.idle_delay
                                  * 2 ** min(self._callback_stops, 8))
                    self._due = max(time.monotonic() + backoff,
                                    self._last_start + self.settings.every_s)
            if for_cell and self._mode_now == "fork":
                return
            if self._child is not None:
                self._cancel.set()
                _kill(self._child)
            elif self._mode_now == "fork":
                # never an exception in the forking thread: it could land in os.fork (a child
                # nobody waits for) or in an at-fork handler (a lock left held). The fork is
                # checked against the flag under this lock, and started() kills a child
                # forked before it.
                self._cancel.set()
            else:
                # raised first: the writer must not also see the flag and raise on its own,
                # then meet this exception in its clean-up
                _raise_in(self._thread, Cancelled)
                self._cancel.set()

    def _held(self, t0: float) -> None:
        ms = (time.perf_counter() - t0) * 1000
        if ms > self.stats["hook_ms_max"]:
            self.stats["hook_ms_max"] = round(ms, 3)

    # -- the writer thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        # Everything is inside the try: the Cancelled raised by cancel() may arrive anywhere in
        # this thread (at most once per write); each round starts again from a known state.
        while not self._stopped:
            try:
                self._round()
            except Cancelled:
                self.stats["cancelled"] += 1
            except Exception as e:  # an autosave never fails the notebook or ends this thread
                log.debug("autosave round failed", exc_info=True)
                self._failed(ops.one_line(e))  # e.g. a fork refused (no memory, no process)

    def _round(self) -> None:
        with self._lock:
            _raise_in(self._thread, None)  # a stop that came too late is not for this round
            self._phase = "idle"
            self._wake.notify_all()  # a foreground checkpoint waits for "idle"
            while not self._stopped and (self._due is None or self._in_cell or self._fg
                                         or self._callbacks
                                         or time.monotonic() < self._due):
                # what ends a cell, a foreground write or a callback notifies: no timed wait
                # for them (it would spin once the due time has passed)
                due = self._due
                held = due is None or self._in_cell or self._fg or self._callbacks
                self._wake.wait(None if held or due is None
                                else max(0.0, due - time.monotonic()))
            if self._stopped:
                return
            self._due = None
            cell = self._cell
            self._round_cells = self._cells_started
            self._cancel.clear()
            self._phase = "writing"
            self._last_start = time.monotonic()
            self._mode_now = self._mode()
        try:
            self._write_round(cell)
        finally:
            # back to idle under the lock: no cancel raises into this thread after this (a
            # late one would land outside _loop's try and end the thread), and a pending one
            # is withdrawn
            with self._lock:
                _raise_in(self._thread, None)
                self._phase = "idle"
                self._wake.notify_all()

    def _write_round(self, cell: int | None) -> None:
        t0 = time.monotonic()
        if self._mode_now == "fork":
            done = self._write_forked(cell)
            if done is None:
                return
        else:
            try:
                res = self._write(cell, self._guard, self._check)
            except KeyboardInterrupt:  # Cancelled, as the engine re-raises it
                raise Cancelled() from None
            except Exception as e:  # noqa: BLE001 - an autosave never fails the notebook
                self._failed(ops.one_line(e))
                return
            done = {"checkpoint_id": res.checkpoint_id, "bytes_written": res.bytes_written,
                    "bytes_total": res.bytes_total}
        with self._lock:
            self._callback_stops = 0
        self.stats["saved"] += 1
        self.stats["error"] = None
        self.stats["last"] = {**done, "cell": cell, "mode": self._mode_now, "at": time.time(),
                              "seconds": round(time.monotonic() - t0, 4)}
        if self._mode_now != "fork":  # a forked writer retains in the child
            self._retain()

    def _write(self, cell: int | None, guard: Any, progress: Any,
               done_with: Any = None) -> Any:
        return ops.do_checkpoint(
            self.ip, store_url=self.store_url, key_path=self.key_path, stream=self.stream,
            keep=0,  # the engine's count rule would mix kinds; retain_autosaves runs after
            meta={"kind": KIND, "trigger": KIND, "cell": cell},
            progress=progress, publish_guard=guard, kind=KIND, done_with=done_with)

    def _write_forked(self, cell: int | None) -> dict[str, Any] | None:
        t0 = time.perf_counter()

        def started(pid: int) -> None:
            took = time.perf_counter() - t0
            self._fork_s = took if not self._fork_s else 0.5 * self._fork_s + 0.5 * took
            self.stats["fork_ms_max"] = max(self.stats["fork_ms_max"], round(took * 1000, 3))
            with self._lock:
                self._child = pid
                self._phase = "writing"
                if self._cancel.is_set():  # stopped while forking
                    _kill(pid)

        def may_fork() -> bool:  # holding self._lock, which the cells' hook takes too
            if self._cells_started != self._round_cells or self._cancel.is_set():
                # a cell began since the round read its number (it may even have ended: its
                # effects would be saved under the number before it), or a stop came
                return False
            if self._callbacks:  # one runs now: the round comes again once it has ended
                self._due = time.monotonic()
                return False
            self._phase = "forking"  # a cell that starts now waits for the fork to end
            return True

        def ended() -> None:
            with self._lock:
                self._child = None

        def settled() -> None:  # published: the child only runs retention, which may stop
            with self._lock:
                self._phase = "retaining"
                if (self._fg or self._stopped) and self._child is not None:
                    _kill(self._child)  # a pause or stop that came while it published

        url = cp.open_store(self.store_url).url
        procstate.warm()  # once per kernel: what each child would otherwise work out again
        msg = forkwrite.write_in_child(
            lambda guard, done_with: self._write(cell, guard, None, done_with), url,
            ops._cache_for(self.store_url), may_publish=self._may_publish, started=started,
            lock=self._lock, may_fork=may_fork, ended=ended,  # ended() forgets the child
            after=self._retain, settled=settled)
        if msg.get("cancelled"):
            if msg.get("signal") and not self._cancel.is_set():
                # killed from outside: most likely the OOM killer (the child is the biggest
                # process of the pod while it lives)
                self._failed(f"the autosave's writer was killed ({msg['signal']}; out of "
                             "memory?); the previous autosave stays the newest")
                return None
            raise Cancelled()
        if "error" in msg:
            self._failed(str(msg["error"]))
            return None
        return dict(msg["done"])

    def _may_publish(self) -> bool:
        with self._lock:
            if self._cancel.is_set():
                return False
            self._phase = "publishing"
            return True

    def _mode(self) -> str:
        """"fork" unless CUDA is initialized here (a forked CUDA context is unusable) or the
        settings or the platform say thread."""
        want = self.settings.mode
        if want == "thread" or not hasattr(os, "fork"):
            return "thread"
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch.cuda, "is_initialized", lambda: False)():
            return "thread"
        return "fork"

    def _failed(self, error: str) -> None:
        self.stats["failed"] += 1
        self.stats["error"] = error
        log.debug("autosave failed: %s", error)

    def _check(self, done: int, total: int) -> None:
        """The engine's progress tick: where a cancelled write stops."""
        if self._cancel.is_set():
            raise Cancelled()

    def _guard(self, publish: Any) -> Any:
        def guarded(txn: Any, stream: str, data: bytes) -> None:
            with self._lock:
                if self._cancel.is_set():
                    raise Cancelled()
                # From here on the checkpoint is complete and consistent: a cell that starts
                # now does not cancel it.
                self._phase = "publishing"
            publish(txn, stream, data)
        return guarded

    def _retain(self) -> None:
        try:
            store = cp.open_store(self.store_url)
            key = cp.load_or_create_key(self.key_path, store=store)
            retain_autosaves(store, self.stream, keep=self.settings.keep,
                             max_bytes=self.settings.max_bytes or None, key=key,
                             protect=ops.protected_checkpoints() | (
                                 {self.offered} if self.offered else set()))
        except Exception:  # the autosave is safe; gc cleans up later
            log.debug("autosave retention failed", exc_info=True)

    # -- control ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """A checkpoint or restore the person or the server runs: the autosave yields to it
        (a write under way stops; one that is publishing ends first)."""
        self.cancel()
        with self._lock:
            self._fg += 1
            while self._phase != "idle" and self._thread.is_alive():
                self._wake.wait(1.0)
        try:
            yield
        finally:
            with self._lock:
                self._fg -= 1
                self._wake.notify_all()

    def configure(self, settings: Settings) -> None:
        with self._lock:
            self.settings = settings
        if not settings.enabled:
            self.cancel()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self.cancel()
        with self._lock:
            self._wake.notify_all()
        self._thread.join(timeout=10)

    def status(self) -> dict[str, Any]:
        s = self.settings
        return {"enabled": s.enabled, "every_s": s.every_s, "idle_delay": s.idle_delay,
                "keep": s.keep, "max_bytes": s.max_bytes, "stream": self.stream,
                "phase": self._phase, "scheduled": self._due is not None, "offered": self.offered,
                **self.stats}


BRIDGE_CALL = "__import__('jupyter_pause.kernel.bridge'"  # how the server's calls begin


def _is_callback(msg_type: str, msg: Any) -> bool:
    """Whether a shell request runs the notebook's code outside a cell: a comm message, or a
    silent execution other than the server's own calls into this package (a status read, a
    checkpoint that yields the autosave itself)."""
    if msg_type != "execute_request":
        return True
    content = msg.get("content") if isinstance(msg, dict) else None
    if not isinstance(content, dict) or not content.get("silent"):
        return False  # a cell: its hooks count it
    code = content.get("code")
    return not (isinstance(code, str) and code.startswith(BRIDGE_CALL))


COUNTED = ("execute_request", "comm_open", "comm_msg", "comm_close")


def _hook_handlers(ip: Any, auto: Autosave) -> None:
    """Count the kernel's silent executions and comm handlers (widget callbacks) as callbacks
    (see callback_started), around the handler itself: whatever happens inside, the count
    comes back down."""
    handlers = getattr(getattr(ip, "kernel", None), "shell_handlers", None)
    if not isinstance(handlers, dict):
        return  # a plain IPython shell: no such requests
    for name in COUNTED:
        real = handlers.get(name)
        if real is None or name in auto.wrapped:
            continue
        counted: Any
        if inspect.iscoroutinefunction(real):  # ipykernel's execute_request
            async def counted(*args: Any, _real: Any = real, _name: str = name,
                              **kw: Any) -> Any:
                if not _is_callback(_name, args[-1] if args else None):
                    return await _real(*args, **kw)
                auto.callback_started()  # here, so a coroutine never awaited counts nothing
                try:
                    return await _real(*args, **kw)
                finally:
                    auto.callback_ended()
        else:
            def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                if not _is_callback(_name, args[-1] if args else None):
                    return _real(*args, **kw)
                auto.callback_started()
                try:
                    out = _real(*args, **kw)
                except BaseException:
                    auto.callback_ended()
                    raise
                if not inspect.isawaitable(out):
                    auto.callback_ended()
                    return out

                async def finish() -> Any:
                    try:
                        return await out
                    finally:
                        auto.callback_ended()
                return finish()

        auto.wrapped[name] = (real, counted)
        handlers[name] = counted


def _unhook_handlers(ip: Any, auto: Autosave) -> None:
    """Put the kernel's own handlers back, unless something wrapped ours since (then ours
    stays, and counts for a stopped autosave: harmless)."""
    handlers = getattr(getattr(ip, "kernel", None), "shell_handlers", None)
    if not isinstance(handlers, dict):
        return
    for name, (real, counted) in list(auto.wrapped.items()):
        if handlers.get(name) is counted:
            handlers[name] = real
    auto.wrapped.clear()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _raise_in(thread: threading.Thread, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in ``thread`` at its next bytecode (None: withdraw one not raised yet)."""
    if thread.ident is None or not thread.is_alive():
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                               ctypes.py_object(exc) if exc else None)


def get(ip: Any) -> Autosave | None:
    return getattr(ip, "_jupyter_pause_autosave", None)


def install(ip: Any, settings: Settings | None = None, **where: Any) -> Autosave:
    """Register the hooks once per shell (idempotent; a second call updates the settings)."""
    auto = get(ip)
    if auto is not None:
        if settings is not None:
            auto.configure(settings)
        for k in ("store_url", "key_path", "stream"):
            if where.get(k):
                setattr(auto, k, where[k])
        return auto
    auto = Autosave(ip, settings or Settings(), **where)
    ip._jupyter_pause_autosave = auto
    for event, cb in _hooks(auto):
        ip.events.register(event, cb)
    _hook_handlers(ip, auto)
    return auto


def _hooks(auto: Autosave) -> tuple[tuple[str, Any], ...]:
    return (("pre_run_cell", auto.pre_run_cell), ("post_run_cell", auto.post_run_cell))


def uninstall(ip: Any) -> None:
    auto = get(ip)
    if auto is None:
        return
    for event, cb in _hooks(auto):
        with contextlib.suppress(ValueError):
            ip.events.unregister(event, cb)
    _unhook_handlers(ip, auto)
    auto.stop()
    del ip._jupyter_pause_autosave


def parse_words(words: list[str], current: Settings) -> Settings:
    """``off``, ``on``, ``every 30 s`` / ``every 30s`` / ``every 2 min`` -> new settings.
    Raises ValueError with what is accepted."""
    text = " ".join(words).strip().lower()
    s = Settings(**vars(current))
    if text in ("off", "on"):
        s.enabled = text == "on"
        return s
    parts = text.replace("s", " s").replace("min", " min").split() if text else []
    if len(parts) in (2, 3) and parts[0] == "every":
        unit = parts[2] if len(parts) == 3 else "s"
        factor = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0}.get(unit)
        try:
            n = float(parts[1])
        except ValueError:
            n = -1.0
        if factor and 0 <= n < 1e7:
            s.enabled, s.every_s = True, n * factor
            return s
    raise ValueError(f"--autosave takes off, on or 'every N s', not {text!r}")


def set_from_words(ip: Any, words: list[str]) -> str:
    """``%pause --autosave ...``: apply and say what autosave does now."""
    auto = install(ip, Settings.from_env(), store_url=namespace.default_store_url(),
                   key_path=namespace.default_key_path())
    try:
        new = parse_words(words, auto.settings)
    except ValueError as e:
        from IPython.core.error import UsageError

        raise UsageError(f"%pause: {e}") from None
    auto.configure(new)
    if not new.enabled:
        return "Autosave is off for this kernel: a killed kernel loses what was not paused."
    every = f" at most every {new.every_s:g} s" if new.every_s else " after each cell"
    return (f"Autosave is on{every}, while the kernel is idle; a cell never waits for it "
            f"(checkpoints of {auto.stream}).")


@contextlib.contextmanager
def yielding(ip: Any) -> Iterator[None]:
    """For ops: a foreground checkpoint or restore waits for no autosave and races none."""
    auto = get(ip)
    if auto is None:
        yield
        return
    with auto.foreground():
        yield
