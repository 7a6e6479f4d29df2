"""The zygote's protocol with a real zygote process, without a server: a start given up on
leaves no kernel behind, an exit is told before the pid is freed, a kernel whose zygote died
is seen to end even as a zombie, no signal reaches a pid after its kernel ended, a zygote that
cannot listen fails at once and is not asked again for a while, and one with forks pending is
not idle."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from jupyter_pause.launch import provisioner as p

pytestmark = pytest.mark.timeout(120)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("JPY_")}


async def _zygote() -> p.Zygote:
    z = p.Zygote(_env(), [])
    await z.ready()
    return z


def _children(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children()


def _until(what: str, check, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.02)


async def test_a_fork_the_server_gave_up_on_never_runs(tmp_path: Path) -> None:
    """The server closes the connection after the pid (a timeout, a cancelled start): the
    child is killed before it becomes a kernel, so nothing listens on that connection file."""
    z = await _zygote()
    try:
        # ipykernel writes the connection file it is given when there is none: a mark of a
        # kernel that ran
        marker = tmp_path / "kernel-abandoned.json"
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(30)
        conn.connect(z.path)
        req = {"argv": ["-f", str(marker)], "env": _env(), "cwd": str(tmp_path)}
        conn.sendall(json.dumps(req).encode() + b"\n")
        pid = json.loads(conn.makefile().readline())["pid"]
        conn.close()  # no "go"
        _until("the abandoned fork to be reaped", lambda: not psutil.pid_exists(pid))
        assert not marker.exists() and _children(z.proc.pid) == []
        # the same request carried through starts a kernel, which writes that file
        k = await z.fork(["-f", str(marker)], _env(), str(tmp_path))
        _until("the kernel to write its connection file", marker.exists)
        k.kill()
        assert k.wait(30) == -signal.SIGKILL
    finally:
        z.stop()


async def test_the_exit_is_told_before_the_pid_is_freed(tmp_path: Path) -> None:
    z = await _zygote()
    try:
        k = await z.fork(["-f", str(tmp_path / "kernel.json")], _env(), str(tmp_path))
        assert psutil.Process(k.pid).ppid() == z.proc.pid
        os.kill(k.pid, signal.SIGKILL)
        _until("the zygote to tell the exit", lambda: _told(k))
        # told, not yet read: the pid is still the dead kernel's (a zombie of the zygote)
        assert psutil.Process(k.pid).status() == psutil.STATUS_ZOMBIE
        assert k.poll() == -signal.SIGKILL  # read: the connection closes, the zygote reaps
        _until("the zygote to reap it", lambda: not psutil.pid_exists(k.pid))
    finally:
        z.stop()


def _told(k: p.ForkedKernel) -> bool:
    """Something waits on the kernel's connection (peeked: not read)."""
    try:
        return bool(k._conn is not None and k._conn.recv(4096, socket.MSG_PEEK))
    except BlockingIOError:
        return False


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "psutil"])
def test_a_kernel_whose_zygote_died_is_seen_to_end_as_a_zombie(
        pidfd: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the zygote gone the server may be the one that inherits (PID 1, a subreaper): a
    zombie has ended all the same, and is reaped (where it is ours) with its exit code."""
    if not pidfd:
        monkeypatch.setattr(p, "_pidfd", lambda pid: None)  # a kernel before Linux 5.3
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    a, b = socket.socketpair()
    a.setblocking(False)
    b.close()  # the zygote is gone without a word
    k = p.ForkedKernel(child.pid, a)
    try:
        assert k.poll() is None  # alive
        os.kill(child.pid, signal.SIGKILL)
        _until("a zombie to read as ended", lambda: k.poll() is not None, 10)
        assert k.returncode == 1  # unknown: not the zygote's to tell
        if pidfd:  # reaped through the pidfd: no zombie left behind
            assert not psutil.pid_exists(child.pid)
        else:
            assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        child.wait()  # reaped already through the pidfd: Popen takes ECHILD as an end


STRANGER = """
import signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
print("blocked", flush=True)
time.sleep(60)
"""


def _pending(pid: int) -> int:
    """The signals pending for ``pid`` (its own and its process's), as a bit mask."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    return int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


async def test_no_signal_reaches_a_pid_once_its_kernel_ended() -> None:
    """A stranger that got the pid (and so the process group id) after the kernel ended. It
    blocks SIGTERM and SIGINT, so a signal sent to it stays pending where we can see it."""
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER],  # noqa: ASYNC220
                                start_new_session=True, stdout=subprocess.PIPE)
    assert stranger.stdout is not None and stranger.stdout.readline() == b"blocked\n"
    a, b = socket.socketpair()
    a.setblocking(False)
    b.sendall(json.dumps({"exit": 0}).encode() + b"\n")
    k = p.ForkedKernel(stranger.pid, a)
    prov = p.ZygoteProvisioner(kernel_id="k", kernel_spec=None)
    prov.process = k
    prov.pid = prov.pgid = stranger.pid
    try:
        assert k.poll() == 0
        await prov.send_signal(signal.SIGTERM)
        await prov.send_signal(signal.SIGINT)
        await prov.terminate()
        k.terminate()
        await prov.kill()
        k.kill()
        assert _pending(stranger.pid) == 0 and stranger.poll() is None
        os.kill(stranger.pid, signal.SIGTERM)  # the check sees a signal that was sent
        assert _pending(stranger.pid) & (1 << (signal.SIGTERM - 1))
    finally:
        stranger.kill()
        stranger.wait()
        stranger.stdout.close()
        b.close()


async def test_a_zygote_that_cannot_listen_fails_before_its_imports_and_is_not_asked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long = tmp_path / ("d" * 120)  # more than a Unix socket path may hold
    long.mkdir()
    monkeypatch.setattr(p.tempfile, "mkdtemp", lambda prefix="": str(long))
    monkeypatch.setattr(p, "_zygotes", {})
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(600)\n")
    env = {**_env(), "PYTHONPATH": str(tmp_path)}
    z = p.zygote_for(env, ["slow_to_import"])
    with pytest.raises(p.ZygoteUnavailable, match="cannot listen"):
        await asyncio.wait_for(z.ready(), 120)  # not the import's ten minutes: it never ran
    assert p.stop_idle() == 0  # its back-off outlives a pause's clean-up
    assert p.zygote_for(env, ["slow_to_import"]) is z
    with pytest.raises(p.ZygoteUnavailable, match="less than a minute ago"):
        await z.ready()
    assert z.proc is None


async def test_a_zygote_with_a_fork_under_way_is_not_idle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(p, "_zygotes", {})  # not the zygotes of other tests' servers
    z = await _zygote()
    try:
        p._zygotes[("test",), ()] = z  # type: ignore[index]
        z.pending += 1
        assert p.stop_idle() == 0 and z.alive()
        z.pending -= 1
        k = await z.fork(["-f", str(tmp_path / "kernel.json")], _env(), str(tmp_path))
        assert p.stop_idle() == 0 and z.alive()  # a kernel runs
        os.kill(k.pid, signal.SIGKILL)
        _until("the kernel's end", lambda: k.poll() is not None)
        assert p.stop_idle() == 1 and not z.alive()
    finally:
        z.stop()


async def test_socket_directories_of_zygotes_gone_are_cleared(tmp_path: Path) -> None:
    """A whole process tree killed leaves the zygote no chance to remove its directory: the
    next zygote's start does, and leaves a live zygote's alone."""
    live = await _zygote()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # noqa: ASYNC220
    dead.wait()
    stale = Path(p.tempfile.mkdtemp(prefix=p._DIR_PREFIX))
    (stale / "zygote.sock").touch()
    p._own(str(stale), dead.pid)
    z = await _zygote()
    try:
        assert not stale.exists()
        assert Path(live.dir).exists() and Path(z.dir).exists()
    finally:
        z.stop()
        live.stop()


async def test_a_missing_working_directory_fails_the_start_as_a_new_process_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a fork that dies at once (jupyter_server would take it for a kernel that died and
    restart it): the launch's own error, as without the zygote."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    # the process's one factory, whatever an earlier test's server made its default
    monkeypatch.setattr(KernelProvisionerFactory.instance(), "default_provisioner_name", p.NAME)
    km = AsyncKernelManager(kernel_name="python3")
    with pytest.raises(FileNotFoundError):
        await km.start_kernel(cwd=str(tmp_path / "gone"))
    assert isinstance(km.provisioner, p.ZygoteProvisioner)
