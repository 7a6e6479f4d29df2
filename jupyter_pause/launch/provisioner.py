"""A kernel provisioner that forks python kernels from a zygote (:mod:`.zygote`).

``ZygoteProvisioner`` is jupyter_client's ``LocalProvisioner`` (connection file, ports, signals
to the process group, restart, shutdown: all of it) with one change: ``launch_kernel`` asks a
zygote for ``python -m ipykernel_launcher ...`` instead of exec'ing a new interpreter, and hands
``LocalProvisioner`` a ``Popen``-like :class:`ForkedKernel`. It launches as ``LocalProvisioner``
does whenever a fork would not give what a fresh process gives:

- another command (another interpreter, interpreter flags, another kernel, a wrapper script);
- ``stdin``/``stdout``/``stderr`` or other ``Popen`` arguments asked for;
- a working directory holding a module or package named like one the zygote imported beyond
  ipykernel (a new kernel would import that file instead: IPython puts the directory on
  ``sys.path`` ahead of site-packages);
- a relative ``PYTHONPATH`` entry (resolved against the directory the interpreter started in);
- no zygote (it failed to start or to fork, less than a minute ago, or did not answer).

A zygote is started with the first kernel's environment; only kernels whose environment is the
same but for the variables a server sets per kernel (``JPY_*``) share it (:func:`shared_env`):
the time zone, the locale, ``HOME``, ``PYTHONPATH`` or a thread count may have been read at
start or import. :func:`stop_idle` ends the zygotes that have no kernel left and none starting
(a pause that stopped every kernel frees their memory too).

Registered as the ``jupyter-pause-zygote`` entry point of ``jupyter_client.kernel_provisioners``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import pathlib
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from typing import Any

import psutil
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Float, List, Unicode

NAME = "jupyter-pause-zygote"
# What a kernel imports at its start (ipykernel's debugger; psutil, for jupyter_pause's
# autosave) and at a restore of a notebook with numpy and pandas state (those, and blake3).
PRELOAD = ["ipykernel.debugger", "psutil", "numpy", "pandas", "blake3"]
START_TIMEOUT_S = 60.0  # a zygote's imports, on a busy machine
FORK_TIMEOUT_S = 30.0
RETRY_AFTER_S = 60.0  # a zygote that failed to start or to fork is not asked again this soon
# What a server sets per kernel (JPY_SESSION_NAME, JPY_PARENT_PID): the rest of a kernel's
# environment must be the zygote's. Anything else may have been read at start or import (TZ
# and the locale by libc, HOME for the user site directory, PYTHONPATH, thread counts, USER
# for jupyter_client's session): one zygote per environment.
_PER_KERNEL = "JPY_"


def shared_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """What kernels sharing a zygote must share of ``env``: all but the per-kernel variables."""
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith(_PER_KERNEL)))


def relative_path_entry(env: dict[str, str]) -> str | None:
    """An entry of PYTHONPATH the interpreter resolves against its start directory (a fork
    would resolve it against the zygote's), if any."""
    for entry in env.get("PYTHONPATH", "").split(os.pathsep) if env.get("PYTHONPATH") else ():
        if not os.path.isabs(entry):
            return entry or "''"
    return None


def kernel_args(cmd: list[str]) -> list[str] | None:
    """What follows ``-m ipykernel_launcher`` when ``cmd`` is this interpreter running it."""
    if len(cmd) >= 3 and os.path.expanduser(cmd[0]) == sys.executable \
            and cmd[1:3] == ["-m", "ipykernel_launcher"]:
        return cmd[3:]
    return None


class ZygoteUnavailable(Exception):
    """No fork: the caller launches as LocalProvisioner does. ``str()`` says why."""


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (Linux >= 5.3), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class ForkedKernel:
    """The ``subprocess.Popen`` surface ``LocalProvisioner`` uses, for a kernel the zygote forked.

    The zygote is its parent: it sends the exit code on the kernel's connection and reaps the
    kernel only once that connection is closed, so the pid is the kernel's until this object
    has seen the exit. If the zygote goes first, the kernel follows it (ipykernel ends when its
    parent does): a pidfd taken at the fork says when, whoever reaps it (exit code unknown: 1).
    """

    stdin = stdout = stderr = None

    def __init__(self, pid: int, conn: socket.socket, pending: bytes = b"") -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._pidfd = _pidfd(pid)  # the zygote has not reaped it: this is the kernel's
        self._buf = pending
        self._read(b"")

    def _read(self, data: bytes) -> None:
        self._buf += data
        while b"\n" in self._buf and self.returncode is None:
            line, _, self._buf = self._buf.partition(b"\n")
            with contextlib.suppress(ValueError):
                msg = json.loads(line)
                if isinstance(msg, dict) and isinstance(msg.get("exit"), int):
                    self._ended(msg["exit"])

    def _ended(self, code: int) -> None:
        self.returncode = code
        if self._conn is not None:
            self._conn.close()  # the zygote may reap it now
            self._conn = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:  # a provisioner dropped while its kernel ran (server exit)
        if self._conn is not None:
            self._conn.close()
        if self._pidfd is not None:
            os.close(self._pidfd)

    def _gone(self) -> bool:
        """Without the zygote: has the kernel ended? (Reaped here where it became our child:
        a server that is PID 1 or a subreaper inherits the kernels of a zygote that died.)"""
        if self._pidfd is not None:
            if not select.select([self._pidfd], [], [], 0)[0]:
                return False
            with contextlib.suppress(ChildProcessError, OSError, AttributeError):
                os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
            return True
        try:  # no pidfd: a zombie (of a server that is PID 1 or a subreaper) has ended too
            return psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def poll(self) -> int | None:
        while self.returncode is None and self._conn is not None:
            try:
                data = self._conn.recv(4096)
            except BlockingIOError:
                return None
            except OSError:
                data = b""
            if not data:  # the zygote is gone without a word
                self._conn.close()
                self._conn = None
                break
            self._read(data)
        if self.returncode is None and self._conn is None and self._gone():
            self._ended(1)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"kernel {self.pid} still running")
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # never a signal once its pid may be another process's
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """One zygote process: started on first use, asked for forks over its Unix socket."""

    def __init__(self, env: dict[str, str], preload: list[str],
                 log: logging.Logger | None = None) -> None:
        self.log = log or logging.getLogger(__name__)
        self.env = dict(env)
        self.preload = list(preload)
        self.dir = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.modules: frozenset[str] = frozenset()
        self.kernels: weakref.WeakSet[ForkedKernel] = weakref.WeakSet()
        self.pending = 0  # starts and forks under way: a zygote with any is not idle
        self.failed_at: float | None = None
        self._ready = False
        # (loop, its start): a server runs one loop, a test process one per test
        self._starting: tuple[Any, asyncio.Future[None]] | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.dir, "zygote.sock")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def failed_recently(self) -> bool:
        return self.failed_at is not None and time.monotonic() - self.failed_at < RETRY_AFTER_S

    async def ready(self) -> None:
        """Started and listening (one start, however many kernels wait for it)."""
        if self.failed_recently():
            raise ZygoteUnavailable("the zygote failed less than a minute ago")
        if self._ready and self.alive():
            return
        loop = asyncio.get_running_loop()
        if self._starting is None or self._starting[0] is not loop or self._starting[1].done():
            self._starting = (loop, asyncio.ensure_future(self._start()))
        await asyncio.shield(self._starting[1])

    async def _start(self) -> None:
        t0 = time.monotonic()
        self.stop()
        _clear_stale()
        self.dir = tempfile.mkdtemp(prefix=_DIR_PREFIX)  # 0700: only we may ask for forks
        env = {k: v for k, v in self.env.items() if not k.startswith(_PER_KERNEL)}
        # Its stdout and stderr are the server's, as a kernel's are: it says it is ready on a
        # pipe of its own.
        ready_r, ready_w = os.pipe()
        try:
            # a fork and exec, as LocalProvisioner's own launch does on the loop
            self.proc = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", "jupyter_pause.launch.zygote", self.path,
                 ",".join(self.preload), str(ready_w)], stdin=subprocess.DEVNULL,
                env=env, cwd=self.dir, start_new_session=True, pass_fds=(ready_w,))
        except BaseException:
            os.close(ready_r)
            self.failed_at = time.monotonic()
            raise
        finally:
            os.close(ready_w)
        _own(self.dir, self.proc.pid)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(ready_r, "rb", 0))
        try:
            line = await asyncio.wait_for(reader.readline(), START_TIMEOUT_S)
            msg = json.loads(line) if line else None
        except (asyncio.TimeoutError, ValueError):
            msg = None
        finally:
            transport.close()
        if not isinstance(msg, dict) or msg.get("ready") is not True:
            self.stop()
            self.failed_at = time.monotonic()
            why = msg.get("error") if isinstance(msg, dict) else None
            raise ZygoteUnavailable(f"the zygote did not start{f': {why}' if why else ''}")
        self.modules = frozenset(m for m in msg.get("modules", []) if isinstance(m, str))
        self.failed_at = None
        self._ready = True
        self.log.info("jupyter_pause: kernel zygote %d ready in %.2f s (it imported %s)",
                      self.proc.pid, time.monotonic() - t0, ", ".join(self.preload))

    async def _ask(self, conn: socket.socket, req: dict[str, Any]) -> bytes:
        loop = asyncio.get_running_loop()
        await loop.sock_connect(conn, self.path)
        await loop.sock_sendall(conn, json.dumps(req).encode() + b"\n")
        buf = b""
        while b"\n" not in buf:
            chunk = await loop.sock_recv(conn, 4096)
            if not chunk:
                raise ZygoteUnavailable("the zygote closed the connection")
            buf += chunk
        return buf

    async def fork(self, args: list[str], env: dict[str, str], cwd: str) -> ForkedKernel:
        """A kernel forked in ``cwd`` with ``env``, or ZygoteUnavailable (nothing started)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.setblocking(False)
        try:
            buf = await asyncio.wait_for(
                self._ask(conn, {"argv": args, "env": env, "cwd": cwd}), FORK_TIMEOUT_S)
            line, _, rest = buf.partition(b"\n")
            msg = json.loads(line)
            if not isinstance(msg, dict) or not isinstance(msg.get("pid"), int):
                why = msg.get("error") if isinstance(msg, dict) else "an unreadable answer"
                raise ZygoteUnavailable(f"the zygote refused: {why}")
            kernel = ForkedKernel(msg["pid"], conn, rest)
        except BaseException as e:
            conn.close()
            if isinstance(e, (OSError, ValueError, asyncio.TimeoutError)):
                self.failed_at = time.monotonic()  # not asked again for a while
                raise ZygoteUnavailable(f"the zygote did not fork ({type(e).__name__})") from None
            if isinstance(e, ZygoteUnavailable):
                self.failed_at = time.monotonic()
            raise
        try:
            # No await from the answer to here: a start cancelled meanwhile closes the
            # connection instead, and the zygote kills the child before it does anything.
            conn.send(b"go\n")
        except OSError as e:  # the zygote stopped waiting: it kills the child
            conn.close()
            raise ZygoteUnavailable(f"the zygote did not wait for the go ({e})") from None
        self.kernels.add(kernel)
        return kernel

    def idle(self) -> bool:
        return self.pending == 0 and not any(k.poll() is None for k in list(self.kernels))

    def stop(self) -> None:
        proc, self.proc, self._ready = self.proc, None, False
        if proc is not None and proc.poll() is None:
            proc.terminate()  # SIGTERM: it has no handler for it
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""


_DIR_PREFIX = "jp-zygote-"


def _own(directory: str, pid: int) -> None:
    """Say whose socket directory this is (see _clear_stale)."""
    with contextlib.suppress(OSError):
        pathlib.Path(directory, "pid").write_text(str(pid))


def _clear_stale() -> None:
    """Remove the socket directories of zygotes that are gone without removing them (a whole
    process tree killed: a zygote removes its own when its server ends)."""
    tmp = pathlib.Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for d in tmp.glob(_DIR_PREFIX + "*"):
            try:
                if d.is_symlink() or not d.is_dir() or d.stat().st_uid != os.getuid():
                    continue
                pid = int((d / "pid").read_text())
                if psutil.pid_exists(pid) and str(d) in " ".join(psutil.Process(pid).cmdline()):
                    continue  # alive
            except (OSError, ValueError, psutil.Error):
                if time.time() - d.stat().st_mtime < 3600:  # no pid yet: maybe starting
                    continue
            shutil.rmtree(d, ignore_errors=True)


_zygotes: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], Zygote] = {}


def zygote_for(env: dict[str, str], preload: list[str], log: logging.Logger | None = None
               ) -> Zygote:
    """The zygote for kernels of this environment (a new one ends the idle others)."""
    key = (tuple(preload), shared_env(env))
    z = _zygotes.get(key)
    if z is None:
        stop_idle()
        z = _zygotes[key] = Zygote(env, preload, log)
    elif log is not None:
        z.log = log  # the newest server's (a test process runs many)
    return z


def _stop_all() -> None:
    for z in _zygotes.values():
        z.stop()


atexit.register(_stop_all)  # the zygotes would end a second later (their parent is gone)


def stop_idle() -> int:
    """End the zygotes that have no kernel running and none starting; how many ended. One
    that failed recently keeps its entry (and so its back-off)."""
    n = 0
    for key, z in list(_zygotes.items()):
        if z.idle():
            n += z.alive()
            z.stop()
            if not z.failed_recently():
                del _zygotes[key]
    return n


def shadowed(cwd: str, modules: frozenset[str]) -> str | None:
    """A name in ``cwd`` a fresh kernel would import instead of the zygote's module, if any."""
    try:
        names = os.listdir(cwd)
    except OSError:
        return None
    for name in names:
        if name.partition(".")[0] in modules:
            return name
    return None


class ZygoteProvisioner(LocalProvisioner):
    """``LocalProvisioner`` whose python kernels are forks of a zygote (see the module)."""

    preload = List(Unicode(), default_value=PRELOAD, config=True,
                   help="Modules the zygote imports once for every kernel it forks (those "
                        "installed): what kernels import anyway. Never one that starts threads "
                        "without fork handlers or initialises a GPU (torch is safe only while "
                        "it has not touched CUDA).")
    start_timeout = Float(START_TIMEOUT_S, config=True,
                          help="Seconds the zygote may take to start before kernels launch "
                               "as the local provisioner does.")

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        why = await self._fork(cmd, kwargs)
        if why is None:
            return self.connection_info
        self.log.info("jupyter_pause: kernel %s started as a new process: %s",
                      kwargs.get("kernel_id", "")[:8], why)
        return await super().launch_kernel(cmd, **kwargs)

    async def _fork(self, cmd: list[str], kwargs: dict[str, Any]) -> str | None:
        """None once forked; else why not."""
        args = kernel_args(cmd)
        if args is None:
            return "not this interpreter's ipykernel_launcher"
        extra = set(kwargs) - {"env", "cwd", "kernel_id"}
        if extra:
            return f"launch arguments {sorted(extra)}"
        env = kwargs.get("env")
        env = dict(os.environ if env is None else env)
        cwd = os.fspath(kwargs.get("cwd") or os.getcwd())
        # a new process fails to start there, with the reason, at once (one stat: no thread)
        if not os.path.isdir(cwd):  # noqa: ASYNC240
            return f"no directory {cwd}"
        if (entry := relative_path_entry(env)) is not None:
            return f"PYTHONPATH entry {entry} is relative to the start directory"
        z = zygote_for(env, list(self.preload), self.log)
        z.pending += 1
        try:
            await asyncio.wait_for(z.ready(), self.start_timeout)
            if (name := shadowed(cwd, z.modules)) is not None:
                return f"{name} in {cwd} would shadow an imported module"
            proc = await z.fork(args, env, cwd)
        except (ZygoteUnavailable, asyncio.TimeoutError) as e:
            return str(e) or "the zygote did not start in time"
        finally:
            z.pending -= 1
        self.process = proc  # type: ignore[assignment]  # the Popen surface it uses
        self.pid = self.pgid = proc.pid  # the child made itself a session (process group) leader
        self.cwd = kwargs.get("cwd", pathlib.Path.cwd())
        return None

    async def send_signal(self, signum: int) -> None:
        # LocalProvisioner signals the process group first, whether or not the kernel ended:
        # never once a forked one has (its pid and group may be another process's by then)
        if isinstance(self.process, ForkedKernel) and self.process.poll() is not None:
            return
        await super().send_signal(signum)
