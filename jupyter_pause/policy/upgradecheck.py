"""The upgrade restore check: ``jupyter pause validate prepare`` before, ``check`` after.

prepare: start a test kernel (detached, so it can outlive this command the way a snapshotted
pod outlives an upgrade), give it a random value that exists only in its memory, write a marker
file on the persistent volume (the state dir), and pause it under the current configuration:
checkpoint through the same kernel bridge the server uses, with a liveness token armed in the
kernel's memory. ``--stop`` then shuts the kernel down, as the local backend's pause does.

check: exactly one outcome, decided by reading the in-memory value back from a kernel (never from
a file):

* ``live``      the same process answers with the armed token, and the value is in its memory;
* ``restored``  a new process got the value from the checkpoint (with what was lost);
* ``fresh``     a new process, and nothing could be restored.

Exit codes: 0 live, 10 restored, 20 fresh, 1 error (e.g. the marker file was lost, the value
came back wrong, nothing was prepared). One line per check; ``--json`` for machines.
Only the sha256 of the value and of the token are written to disk.

One file (about 420 lines) on purpose: prepare and check must agree on every file name, field
and kernel step, and read best side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.connect import write_connection_file
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

from ..atomicfile import replace_file
from ..journal import make_private_dir
from ..server.bridge import run_bridge

EXIT = {"live": 0, "restored": 10, "fresh": 20, "error": 1}
STREAM = "jupyter-pause-validate"
VALUE_VAR = "jp_validate_value"
LOST_VAR = "jp_validate_generator"  # a generator cannot be checkpointed: shows "what was lost"
_DIR = "validate"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _vdir(state_dir: str) -> str:
    return os.path.join(state_dir, _DIR)


def _state_file(state_dir: str) -> str:
    return os.path.join(_vdir(state_dir), "validate.json")


def _marker_file(state_dir: str) -> str:
    return os.path.join(_vdir(state_dir), "marker.txt")


@dataclass
class Check:
    """One line of the restore check: a name, ok/failed, and what was seen."""

    name: str
    status: str
    detail: str = ""

    def line(self) -> str:
        return f"{self.name:<10} {self.status:<9} {self.detail}".rstrip()


@dataclass
class Outcome:
    """The restore check's verdict (live, restored, fresh or error) and its checks."""

    outcome: str  # live | restored | fresh | error
    checks: list[Check] = field(default_factory=list)
    lost: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT[self.outcome]

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "exit_code": self.exit_code,
                "checks": [c.__dict__ for c in self.checks], "lost": self.lost,
                "warnings": self.warnings}

    def render(self) -> str:
        return "\n".join([*(c.line() for c in self.checks),
                          Check("outcome", self.outcome, f"exit {self.exit_code}").line()])


class ValidateError(Exception):
    """A one-line reason the validation could not run."""


# ------------------------------------------------------------------ kernels


def _kernel_argv(kernel_name: str, connection_file: str) -> list[str]:
    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
        argv = list(spec.argv)
    except NoSuchKernel:
        if kernel_name != "python3":
            raise ValidateError(f"no kernel named {kernel_name!r}") from None
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    # as jupyter_client does: a bare "python" means this interpreter, not the first on PATH
    if argv and argv[0] in ("python", f"python{sys.version_info[0]}"):
        argv[0] = sys.executable
    return [a.replace("{connection_file}", connection_file) for a in argv]


def start_detached_kernel(kernel_name: str, connection_file: str) -> int:
    """Start a kernel in its own session, not tied to this process (no JPY_PARENT_PID)."""
    os.makedirs(os.path.dirname(connection_file), exist_ok=True)
    write_connection_file(connection_file, ip="127.0.0.1", key=secrets.token_hex(16).encode())
    env = {k: v for k, v in os.environ.items() if k != "JPY_PARENT_PID"}
    # private like everything under the state directory (0600 whatever the umask)
    fd = os.open(connection_file + ".log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    log = open(fd, "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(_kernel_argv(kernel_name, connection_file), env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, cwd=os.path.dirname(connection_file))
    finally:
        log.close()
    return proc.pid


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        # a zombie (exited child not reaped yet) is not alive
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def kill_kernel(pid: int | None, timeout: float = 5.0) -> None:
    if pid is None or not pid_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


async def _client(connection_file: str, timeout: float, pid: int | None = None) -> Any:
    """A started client, once the kernel answers ``kernel_info`` and IOPub delivers.

    Not ``wait_for_ready()``: without a kernel manager it judges a kernel that is still starting
    by its heartbeat and gives up; here the process id tells whether it is still there. Like it,
    this waits until IOPub delivered a message: ``execute_interactive`` ends on IOPub's idle,
    which a SUB socket still subscribing would miss (the call would wait out its timeout).
    """
    kc = AsyncKernelClient()
    kc.load_connection_file(connection_file)
    kc.start_channels(hb=False)
    deadline = time.monotonic() + timeout
    try:
        while True:
            msg_id = kc.kernel_info()
            try:
                while True:
                    reply = await kc.get_shell_msg(timeout=1.0)
                    if reply.get("parent_header", {}).get("msg_id") == msg_id:
                        break
                await kc.get_iopub_msg(timeout=0.5)  # the request's busy/idle: subscribed
                return kc
            except Exception:  # noqa: BLE001, S110 - queue.Empty: not up (or subscribed) yet
                pass
            if pid is not None and not pid_alive(pid):
                raise ValidateError(f"the kernel (pid {pid}) exited while starting")
            if time.monotonic() > deadline:
                raise ValidateError(f"the kernel did not answer within {timeout:.0f} s")
    except BaseException:
        kc.stop_channels()
        raise


async def _run(kc: Any, code: str, expressions: dict[str, str] | None = None,
               timeout: float = 60.0) -> dict[str, Any]:
    """Execute code silently; return ``user_expressions`` results as plain text."""
    reply = await kc.execute_interactive(code, silent=True, store_history=False,
                                         user_expressions=expressions or {}, timeout=timeout,
                                         output_hook=lambda msg: None)
    content = reply["content"]
    if content.get("status") != "ok":
        raise ValidateError(f"the kernel failed: {content.get('ename')}: {content.get('evalue')}")
    out = {}
    for k, v in (content.get("user_expressions") or {}).items():
        out[k] = v.get("data", {}).get("text/plain") if v.get("status") == "ok" else None
    return out


async def _bridge(kc: Any, func: str, timeout: float, **kwargs: Any) -> dict[str, Any]:
    return await run_bridge(kc, func, timeout=timeout, **kwargs)


async def _read_value_sha(kc: Any) -> str | None:
    expr = (f"__import__('hashlib').sha256(globals()['{VALUE_VAR}'].encode()).hexdigest() "
            f"if '{VALUE_VAR}' in globals() else ''")
    text = (await _run(kc, "", {"v": expr})).get("v")
    if not text:
        return None
    text = text.strip("'\"")
    return text or None


# ------------------------------------------------------------------ prepare


async def prepare(*, state_dir: str, store_url: str | None = None, key_path: str | None = None,
                  kernel_name: str = "python3", stop: bool = False, timeout: float = 120.0
                  ) -> dict[str, Any]:
    vdir = _vdir(state_dir)
    make_private_dir(vdir)  # the state directory is private (journal.py)
    old = load_state(state_dir)
    if old:  # a previous preparation's kernel must not linger
        kill_kernel(old.get("pid"))
    conn = os.path.join(vdir, f"kernel-{secrets.token_hex(4)}.json")
    pid = start_detached_kernel(kernel_name, conn)
    kc = None
    try:
        kc = await _client(conn, timeout, pid)
        value = secrets.token_hex(16)
        # The value is sent in the code once and kept only in the kernel's memory.
        await _run(kc, f"{VALUE_VAR} = {value!r}\n{LOST_VAR} = (i for i in range(3))\n")
        value_sha = _sha(value)
        del value
        if await _read_value_sha(kc) != value_sha:
            raise ValidateError("the test kernel did not keep the value")
        await asyncio.to_thread(_write_json, _marker_file(state_dir),
                                {"value_sha256": value_sha, "created": time.time()})
        token = secrets.token_urlsafe(24)
        res = await _bridge(kc, "checkpoint", timeout, store_url=store_url, key_path=key_path,
                            stream=STREAM, token=token, meta={"trigger": "validate"}, keep=2)
        if not res.get("ok"):
            raise ValidateError(f"checkpoint failed: {res.get('error')}")
        state = {
            "created": time.time(), "pid": pid, "connection_file": conn,
            "kernel_name": kernel_name, "kernel_pid": res.get("pid"),
            "token_sha256": _sha(token), "value_sha256": value_sha,
            "checkpoint_id": res.get("checkpoint_id"), "stream": STREAM,
            "store_url": store_url, "key_path": key_path, "stopped": stop,
            "variables": res.get("variables") or [],
        }
        await asyncio.to_thread(_write_json, _state_file(state_dir), state)
    except BaseException:
        if kc is not None:
            kc.stop_channels()
            kc = None
        kill_kernel(pid)
        raise
    finally:
        if kc is not None:
            kc.stop_channels()
    if stop:
        kill_kernel(pid)
    return state


def _write_json(path: str, data: dict[str, Any]) -> None:
    """Durable and atomic; 0600, like every file of the check's folder."""
    replace_file(path, json.dumps(data, indent=1))


def _read_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def load_state(state_dir: str) -> dict[str, Any] | None:
    try:
        return _read_json(_state_file(state_dir))
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------ check


async def _try_live(st: dict[str, Any], out: Outcome, timeout: float) -> bool | None:
    """True: live and the value is back; False: not live; None: live process, wrong value."""
    pid = st.get("pid")
    if not pid_alive(pid) or not os.path.exists(st.get("connection_file") or ""):  # noqa: ASYNC240 - one stat
        out.checks.append(Check("process", "gone", f"the prepared kernel (pid {pid}) is not "
                                                   "running"))
        return False
    try:
        kc = await _client(st["connection_file"], min(timeout, 30.0), pid)
    except Exception as e:  # noqa: BLE001 - any failure to connect means "not live"
        out.checks.append(Check("process", "silent", f"pid {pid} runs but does not answer: {e}"))
        return False
    try:
        live = await _bridge(kc, "liveness", timeout)
        token = live.get("token") if live.get("ok") else None
        if not token or _sha(token) != st["token_sha256"]:
            why = "no liveness token" if not token else "another liveness token"
            out.checks.append(Check("process", "other", f"pid {pid} answers with {why}"))
            return False
        out.checks.append(Check("process", "same", f"pid {live.get('pid')}: the liveness token "
                                                   "matches"))
        got = await _read_value_sha(kc)
        if got != st["value_sha256"]:
            out.checks.append(Check("value", "wrong", "the live process lost the in-memory "
                                                      "value"))
            return None
        out.checks.append(Check("value", "ok", "in-memory value read back from the same "
                                               "process"))
        return True
    finally:
        kc.stop_channels()


async def _try_restore(st: dict[str, Any], out: Outcome, store_url: str | None,
                       key_path: str | None, timeout: float, kernel_name: str) -> str:
    conn = os.path.join(os.path.dirname(st["connection_file"]),
                        f"check-{secrets.token_hex(4)}.json")
    pid = start_detached_kernel(kernel_name, conn)
    try:
        kc = await _client(conn, timeout, pid)
        try:
            out.checks.append(Check("kernel", "new", f"a new kernel process (pid {pid})"))
            res = await _bridge(kc, "restore", timeout, store_url=store_url, key_path=key_path,
                                stream=st.get("stream", STREAM),
                                checkpoint_id=st.get("checkpoint_id"), device="auto", only=None)
            if not res.get("ok"):
                out.checks.append(Check("restore", "failed", str(res.get("error"))))
                out.checks.append(Check("value", "absent", "nothing was restored"))
                return "fresh"
            out.warnings = list(res.get("warnings") or [])
            variables = res.get("variables") or []
            out.lost = [{"name": v.get("name"), "status": v.get("status"),
                         "reason": v.get("reason")} for v in variables
                        if v.get("status") != "restored"]
            got = await _read_value_sha(kc)
            if got is None:
                out.checks.append(Check("restore", "empty",
                                        f"checkpoint {res.get('checkpoint_id')} did not bring "
                                        "the value back"))
                return "fresh"
            if got != st["value_sha256"]:
                out.checks.append(Check("value", "wrong", "the restored value differs"))
                return "error"
            out.checks.append(Check("restore", "ok", f"from checkpoint {res.get('checkpoint_id')}"
                                                     f" ({len(variables)} variables)"))
            out.checks.append(Check("value", "ok", "in-memory value read back from the restored "
                                                   "kernel"))
            lost = ", ".join(f"{v['name']} ({v['status']}: {v['reason']})" for v in out.lost)
            out.checks.append(Check("lost", str(len(out.lost)), lost or "nothing"))
            return "restored"
        finally:
            kc.stop_channels()
    finally:
        kill_kernel(pid)
        with contextlib.suppress(OSError):
            os.unlink(conn)


async def check(*, state_dir: str, store_url: str | None = None, key_path: str | None = None,
                kernel_name: str | None = None, keep_kernel: bool = False,
                timeout: float = 120.0) -> Outcome:
    """After the upgrade: live, restored or fresh (see the module docstring)."""
    st = load_state(state_dir)
    out = Outcome("error")
    if st is None:
        out.checks.append(Check("prepare", "missing",
                                "run `jupyter pause validate prepare` before the upgrade"))
        return out
    # store/key: the new configuration's when given, else what prepare used
    store_url = store_url if store_url is not None else st.get("store_url")
    key_path = key_path if key_path is not None else st.get("key_path")
    try:
        marker = await asyncio.to_thread(_read_json, _marker_file(state_dir))
        marker_ok = marker.get("value_sha256") == st["value_sha256"]
        out.checks.append(Check("file", "ok" if marker_ok else "changed",
                                "marker file on the persistent volume"))
    except (OSError, ValueError):
        marker_ok = False
        out.checks.append(Check("file", "missing", "the marker file on the persistent volume "
                                                   "is gone"))
    try:
        live = await _try_live(st, out, timeout)
        if live is True:
            outcome = "live"
        elif live is None:
            outcome = "error"
        else:
            outcome = await _try_restore(st, out, store_url, key_path, timeout,
                                         kernel_name or st.get("kernel_name") or "python3")
    except ValidateError as e:
        out.checks.append(Check("error", "-", str(e)))
        outcome = "error"
    finally:
        if not keep_kernel:
            kill_kernel(st.get("pid"))
    out.outcome = outcome if marker_ok else "error"
    return out
