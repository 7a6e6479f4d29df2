"""The zygote: imports what every python kernel imports, then forks one kernel per request.

Run as ``python -m jupyter_pause.launch.zygote SOCKET PRELOAD FD`` by :mod:`.provisioner`, with
the environment the kernels would have been started with. It listens on the Unix socket
``SOCKET``, imports ipykernel's kernel app and the comma-separated ``PRELOAD`` modules that are
installed, and writes one JSON line on the file descriptor ``FD`` (then closed):
``{"ready": true, "modules": [top-level names]}``, the packages it imported that a new kernel
imports only once its directory is on ``sys.path`` (``{"ready": false, "error": ...}`` if it
cannot listen).

Protocol, one connection per kernel, JSON lines. The server sends ``{"argv": [...], "env":
{...}, "cwd": "..."}`` (``argv``: what follows ``python -m ipykernel_launcher``); the zygote
forks and answers ``{"pid": N}``; the server answers ``go`` once it has taken that pid on. Only
then does the child go on to become the kernel: a server that gave up meanwhile (a timeout, a
cancelled start) closes the connection instead, and the child is killed before it has done
anything. When the kernel ends the zygote sends ``{"exit": code}`` (negative: the signal that
ended it, as ``subprocess`` says) and reaps it only once the server has closed the connection:
until then its pid cannot be another process's, so the server's signals never reach a stranger.

The child becomes what ``python -m ipykernel_launcher ARGV`` in ``cwd`` with ``env`` would have
been: its own session (process group), the environment and working directory, ``sys.path``
without the zygote's directory (as ipykernel_launcher leaves it), stdin a pipe closed at the
other end, the signal dispositions the zygote started with, numpy's global random state drawn
anew (``random`` reseeds itself at a fork; numpy does not), ``JPY_PARENT_PID`` the zygote (the
kernel ends when the zygote does, as a kernel ends with the server that started it), and the
command line ``ps`` shows. Nothing here may start a thread of its own or a ZMQ context before a
fork. The zygote ends when the process that started it does.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

POLL_PARENT_S = 1.0  # how often the zygote looks for its parent's end
REQUEST_TIMEOUT_S = 10.0  # a connection must send its request within this
# ... and its go within this: longer than the server waits for the pid (provisioner's
# FORK_TIMEOUT_S); a server that gave up closes the connection, which ends the wait at once
GO_TIMEOUT_S = 60.0

# The dispositions a kernel exec'd from the server would start with: the zygote's own at its
# start, before it changed these two.
_STARTED_WITH = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGCHLD)}


def _top(names: set[str]) -> set[str]:
    return {m.partition(".")[0] for m in names}


def _preload(names: list[str]) -> None:
    for name in names:
        # not installed or broken: a kernel that needs it imports it itself, and says why
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _read_line(conn: socket.socket, timeout: float = REQUEST_TIMEOUT_S) -> bytes | None:
    conn.settimeout(timeout)
    data = b""
    try:
        while b"\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    return data.partition(b"\n")[0]


def _read_request(conn: socket.socket) -> dict[str, Any] | None:
    line = _read_line(conn)
    try:
        req = json.loads(line) if line is not None else None
    except ValueError:
        return None
    ok = isinstance(req, dict) and isinstance(req.get("argv"), list) \
        and isinstance(req.get("env"), dict) and isinstance(req.get("cwd"), str)
    return req if ok else None


def _send(conn: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(msg).encode() + b"\n")


def _exit_code(info: Any) -> int:
    """``subprocess``'s returncode from a ``waitid`` result."""
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return -int(info.si_status)


def _become_kernel(req: dict[str, Any], comm: str | None, set_by_imports: dict[str, str]
                   ) -> None:
    """In the child: the process state ``python -m ipykernel_launcher`` would start with."""
    signal.set_wakeup_fd(-1)
    for sig, handler in _STARTED_WITH.items():
        signal.signal(sig, handler)
    os.setsid()
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in req["env"].items()})
    os.environ["JPY_PARENT_PID"] = str(os.getppid())
    from jupyter_pause import startenv  # /proc/self/environ is the zygote's, not ours

    startenv.set_given(dict(os.environ))
    for k, v in set_by_imports.items():  # after: the imports set them, not the launch
        os.environ.setdefault(k, v)
    # `python -m` put the zygote's directory first (unless safe_path): a new kernel's would be
    # its own. ipykernel_launcher removes that entry, or one that is '' or the working
    # directory, before it imports anything; IPython adds '' (after the standard library) later.
    first = sys.path[0] if sys.path else None
    if first is not None and (not getattr(sys.flags, "safe_path", False) or first == ""
                              or Path(first) == Path.cwd()):
        del sys.path[0]
    # What the zygote froze is the kernel's to collect and to find (gc.get_referrers): a new
    # kernel has nothing frozen (jupyter_pause's autosave freezes for its own fork).
    gc.unfreeze()
    # jupyter_client gives a kernel a pipe for stdin and closes its end at once
    r, w = os.pipe()
    os.close(w)
    os.dup2(r, 0)
    os.close(r)
    spec = importlib.util.find_spec("ipykernel_launcher")
    args = [str(a) for a in req["argv"]]
    sys.argv = [spec.origin if spec and spec.origin else "ipykernel_launcher", *args]
    sys.orig_argv = [sys.executable, "-m", "ipykernel_launcher", *args]
    title = sys.modules.get("setproctitle")
    if title is not None:  # ps and psutil show the command a new process would have had
        title.setproctitle(" ".join(sys.orig_argv))
        if comm is not None:
            title.setthreadtitle(comm)
    # ipykernel's app class reads JPY_PARENT_PID (and JPY_INTERRUPT_EVENT) into its trait
    # defaults when its module runs: run it again, now that the environment is the kernel's.
    importlib.reload(sys.modules["ipykernel.kernelapp"])
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # the legacy global state, else every sibling draws the same


class _Child:
    """A kernel the zygote forked: its connection (None once the server closed it)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn: socket.socket | None = conn
        self.exited = False


def serve(path: str, preload: list[str], ready_fd: int) -> dict[str, Any] | None:
    """The zygote's loop. Returns in a forked child only, with that child's request."""
    me, parent = os.getpid(), os.getppid()
    ready = open(ready_fd, "w")  # noqa: SIM115 - closed once it has said whether it is ready
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)  # first: a path it cannot take fails before seconds of imports
        listener.listen(64)
    except OSError as e:
        ready.write(json.dumps({"ready": False, "error": f"cannot listen on {path}: {e}"}) + "\n")
        ready.close()
        return None
    try:
        return _serve(listener, path, preload, ready, me, parent)
    finally:
        if os.getpid() == me:  # the zygote ends: its directory goes with it
            directory = os.path.dirname(path)
            for name in (path, os.path.join(directory, "pid")):  # the server's note of us
                with contextlib.suppress(OSError):
                    os.unlink(name)
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def _serve(listener: socket.socket, path: str, preload: list[str], ready: Any, me: int,
           parent: int) -> dict[str, Any] | None:
    import ipykernel.kernelapp  # noqa: F401 - what every kernel imports first

    # What a new kernel has imported before IPython puts its directory on sys.path: the
    # interpreter's start and ipykernel (jupyter_pause is ours, not the kernel's)
    fresh = _top(set(sys.modules)) - {"jupyter_pause"}
    comm = None
    with contextlib.suppress(ImportError):
        import setproctitle

        comm = setproctitle.getthreadtitle()
        # Set up before any fork, while the environment is the one exec'd: it takes over the
        # argv area and the environ strings after it, room for a kernel's whole command line.
        setproctitle.setproctitle(" ".join([sys.executable, "-m", "jupyter_pause.launch.zygote",
                                            *sys.argv[1:]]))
        setproctitle.setthreadtitle(comm)
    exec_env = dict(os.environ)
    _preload(preload)
    modules = sorted(_top(set(sys.modules)) - fresh - set(sys.stdlib_module_names))
    # What the imports put into os.environ (debugpy sets PYDEVD_USE_FRAME_EVAL where unset):
    # a new kernel's imports would have set it in its environment too.
    set_by_imports = {k: v for k, v in os.environ.items() if exec_env.get(k) != v}
    # Garbage of the imports goes now, not in every kernel; and until a child unfreezes
    # (first thing), nothing it does here walks those objects.
    gc.collect()
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd does the work
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children: dict[int, _Child] = {}
    killed: set[int] = set()  # forks the server gave up on: reaped at once
    ready.write(json.dumps({"ready": True, "modules": modules}) + "\n")
    ready.close()

    def reap(pid: int) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

    def exits() -> None:
        for pid in list(killed):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            killed.discard(pid)
        for pid, child in list(children.items()):
            if child.exited:
                continue
            try:  # WNOWAIT: the pid stays ours until the server has read the exit
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # only we reap: cannot happen, but never spin on it
                info, gone = None, True
            else:
                gone = info is not None
            if not gone:
                continue
            child.exited = True
            if child.conn is None:  # the server let go of it: nobody to tell
                reap(pid)
                del children[pid]
            else:
                _send(child.conn, {"exit": _exit_code(info) if info is not None else 1})

    def closed(pid: int) -> None:
        child = children[pid]
        if child.conn is not None:
            sel.unregister(child.conn)
            child.conn.close()
            child.conn = None
        if child.exited:
            reap(pid)
            del children[pid]

    def fork(conn: socket.socket) -> dict[str, Any] | None:
        req = _read_request(conn)
        if req is None:
            _send(conn, {"error": "no valid request"})
            conn.close()
            return None
        go_r, go_w = os.pipe()
        with warnings.catch_warnings():
            # Python >= 3.12 warns of forking a process with threads: ours are OpenBLAS's
            # pool and jemalloc's (pyarrow's) background thread, both of which stop or reset
            # themselves at a fork (pthread_atfork).
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)  # before its fd closes: a signal must not write elsewhere
            os.close(go_w)
            sel.close()
            listener.close()
            conn.close()
            for c in children.values():
                if c.conn is not None:
                    c.conn.close()
            os.close(wake_r)
            os.close(wake_w)
            go = os.read(go_r, 1)
            os.close(go_r)
            if go != b"g" or os.getppid() != me:  # the server gave up, or the zygote died
                os._exit(1)
            _become_kernel(req, comm, set_by_imports)
            return req
        os.close(go_r)
        _send(conn, {"pid": pid})
        if _read_line(conn, GO_TIMEOUT_S) == b"go":
            with contextlib.suppress(OSError):
                os.write(go_w, b"g")
            os.close(go_w)
            conn.setblocking(False)
            children[pid] = _Child(conn)
            sel.register(conn, selectors.EVENT_READ, pid)
        else:
            os.close(go_w)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
            conn.close()
        return None

    while True:
        events = sel.select(POLL_PARENT_S)
        if os.getppid() != parent:
            return None  # the server is gone: so are we (our kernels follow, as with it)
        for key, _ in events:
            if key.fileobj is listener:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                req = fork(conn)
                if req is not None:
                    return req  # in the child
            elif key.fileobj == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
                exits()
            else:  # a kernel's connection: the server closed it (or wrote what we ignore)
                kconn = key.fileobj
                assert isinstance(kconn, socket.socket)
                try:
                    data = kconn.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    closed(key.data)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    preload = [m for m in (args[1] if len(args) > 1 else "").split(",") if m]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the server's to take
    req = serve(args[0], preload, int(args[2]))
    if req is None:
        return 0
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()
    return 0


if __name__ == "__main__":
    sys.exit(main())
