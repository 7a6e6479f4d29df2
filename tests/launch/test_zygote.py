"""Kernels forked from the zygote (PauseApp.fast_kernel_start) start as a new process would:
real `jupyter server` processes, real kernels, real signals. What a fork could get wrong is
checked in the kernels themselves: the working directory and sys.path, the environment (and
what the checkpoint takes for the person's changes to it), the random states, the command line
others see, the parent that ends them; then interrupt, restart, death, the zygote's own death,
and the cases that must start a new process instead."""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_pause.launch.provisioner import kernel_args, relative_path_entry, shared_env
from tests.server.server_process import Server

pytestmark = pytest.mark.timeout(300)

FACTS = """
import gc, json, os, random, sys, time, numpy as np
from jupyter_pause.checkpoint.procstate import environment
print(json.dumps({
    "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "path": sys.path,
    "argv": sys.argv, "session": os.environ.get("JPY_SESSION_NAME"),
    "parent_env": os.environ.get("JPY_PARENT_PID"),
    "np": float(np.random.rand()), "random": random.random(),
    "env_changes": environment._env_capture(),
    "numpy_file": np.__file__, "comm": open("/proc/self/comm").read().strip(),
    "orig_argv": sys.orig_argv[1:3], "tz": time.tzname, "frozen": gc.get_freeze_count(),
}))
"""


def facts(srv: Server, kid: str) -> dict[str, Any]:
    return json.loads(srv.output(kid, FACTS).strip().splitlines()[-1])


def zygotes(srv: Server) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(srv.proc.pid).children(recursive=True):
        try:
            if "jupyter_pause.launch.zygote" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(srv: Server, pid: int, timeout: float = 30) -> None:
    srv.wait_for(f"process {pid} to end", lambda: not psutil.pid_exists(pid)
                 or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, timeout)


def _three(srv: Server) -> tuple[list[str], list[dict[str, Any]]]:
    (srv.root / "sub").mkdir()
    kids = [srv.open_notebook(p)["kernel"]["id"] for p in NOTEBOOKS]
    return kids, [facts(srv, k) for k in kids]


NOTEBOOKS = ("a.ipynb", "b.ipynb", "sub/c.ipynb")


def _as_seen(f: dict[str, Any], root: Path) -> dict[str, Any]:
    """What a forked and a new kernel of the same notebook must share (paths from the root)."""
    changes = f["env_changes"] or {"set": {}, "unset": []}
    path = [f"<root>{e[len(str(root)):]}" if e.startswith(str(root)) else e for e in f["path"]]
    return {"cwd": os.path.relpath(f["cwd"], root), "path": path,
            "session": os.path.relpath(f["session"], root), "argv0": f["argv"][0],
            "argv1": f["argv"][1], "changed": sorted(changes["set"]),
            "unset": sorted(changes["unset"]), "numpy": f["numpy_file"], "comm": f["comm"],
            "orig_argv": f["orig_argv"], "frozen": f["frozen"]}


@pytest.mark.parametrize("env", ["default", "safe-path", "safe-path-cwd-first"])
def test_forked_kernels_start_as_a_new_process_would(tmp_path: Path, env: str) -> None:
    """Each fact of a forked kernel against a new process's for the same notebooks. With
    PYTHONSAFEPATH, a PYTHONPATH entry stays first, unless it is the notebook's directory
    (ipykernel_launcher removes that one)."""
    extra = tmp_path / "extra"
    extra.mkdir()
    first = {"safe-path": str(extra), "safe-path-cwd-first": "{root}"}.get(env)
    def with_env(srv: Server) -> Server:
        if first is not None:
            srv.env.update(PYTHONSAFEPATH="1", PYTHONPATH=first.format(root=srv.root))
        return srv

    fresh = with_env(Server(tmp_path / "fresh", {"fast_kernel_start": False}))
    fresh.start()
    try:
        _, expected = _three(fresh)
    finally:
        fresh.stop()
    srv = with_env(Server(tmp_path / "forked"))
    srv.start()
    try:
        kids, got = _three(srv)
        (zygote,) = zygotes(srv)
        for kid, f, e in zip(kids, got, expected, strict=True):
            assert _as_seen(f, srv.root) == _as_seen(e, fresh.root)
            assert e["ppid"] == fresh.proc.pid  # the new process: the server's child
            assert f["ppid"] == zygote.pid and f["parent_env"] == str(zygote.pid)
            # the command line others see (ps, psutil): a new process's, naming its
            # connection file
            cmdline = " ".join(psutil.Process(f["pid"]).cmdline())
            assert f"-m ipykernel_launcher -f {srv.home}/runtime/kernel-{kid}.json" in cmdline
        # random states drawn anew in each (numpy's global one does not reseed itself at a fork)
        assert len({f["np"] for f in got}) == 3 and len({f["random"] for f in got}) == 3
    finally:
        srv.stop()


def test_interrupt_restart_death_and_the_zygotes_death(tmp_path: Path) -> None:
    srv = Server(tmp_path).start()
    try:
        kid = srv.open_notebook("a.ipynb")["kernel"]["id"]
        first = facts(srv, kid)
        # interrupt: the kernel's process group gets SIGINT, as with a local kernel
        with srv.driver(kid) as k:
            msg_id = k.kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
            srv.wait_for("the cell to sleep", lambda: _printed(k.kc, msg_id, "sleeping"), 30)
            srv.request("POST", f"api/kernels/{kid}/interrupt")
            reply = k.kc.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        # restart: a new fork
        srv.request("POST", f"api/kernels/{kid}/restart")
        again = facts(srv, kid)
        assert again["pid"] != first["pid"] and again["ppid"] == first["ppid"]
        # SIGKILL: jupyter_server sees it die (the zygote reaped it and said so) and restarts it
        os.kill(again["pid"], signal.SIGKILL)
        srv.wait_for("the restart after the kill",
                     lambda: _pid_now(srv, kid) not in (None, again["pid"]), 60)
        third = facts(srv, kid)
        assert third["ppid"] == first["ppid"]
        # the zygote killed: its kernels end with it (ipykernel watches its parent), the server
        # restarts them, and they are forks of a new zygote
        (zygote,) = zygotes(srv)
        zygote.kill()
        wait_gone(srv, third["pid"])
        srv.wait_for("the restart after the zygote's death",
                     lambda: _pid_now(srv, kid) not in (None, third["pid"]), 60)
        fourth = facts(srv, kid)
        (new_zygote,) = zygotes(srv)
        assert new_zygote.pid != zygote.pid and fourth["ppid"] == new_zygote.pid
    finally:
        srv.stop()


def _printed(kc: Any, msg_id: str, text: str) -> bool:
    try:
        msg = kc.get_iopub_msg(timeout=1)
    except queue.Empty:
        return False
    return msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream" \
        and text in msg["content"]["text"]


def _pid_now(srv: Server, kid: str) -> int | None:
    for p in psutil.Process(srv.proc.pid).children(recursive=True):
        try:
            if f"kernel-{kid}.json" in " ".join(p.cmdline()) and p.status() != \
                    psutil.STATUS_ZOMBIE:
                return p.pid
        except psutil.NoSuchProcess:
            pass
    return None


def test_a_killed_server_leaves_no_zygote_kernel_or_socket_behind(tmp_path: Path) -> None:
    srv = Server(tmp_path).start()
    try:
        kid = srv.open_notebook("a.ipynb")["kernel"]["id"]
        kernel = facts(srv, kid)["pid"]
        (zygote,) = zygotes(srv)
        sock = Path(" ".join(zygote.cmdline()).split()[3])  # its socket
        assert sock.exists()
        os.kill(srv.proc.pid, signal.SIGKILL)  # the server alone (the OOM killer's choice)
        srv.proc.wait()
        for pid in (zygote.pid, kernel):
            wait_gone(srv, pid)
        srv.wait_for("the socket's directory to go", lambda: not sock.parent.exists(), 10)
    finally:
        srv.kill()


def test_a_directory_shadowing_an_imported_module_gets_a_new_process(tmp_path: Path) -> None:
    """A fresh kernel in a directory holding numpy.py imports that file (the directory comes
    first on sys.path); a fork of a zygote that imported numpy would not: so no fork."""
    srv = Server(tmp_path).start()
    try:
        (srv.root / "shadow").mkdir()
        (srv.root / "shadow" / "numpy.py").write_text("random = None\n")
        plain = srv.open_notebook("plain.ipynb")["kernel"]["id"]
        assert facts(srv, plain)["ppid"] != srv.proc.pid  # a fork
        kid = srv.open_notebook("shadow/x.ipynb")["kernel"]["id"]
        out = json.loads(srv.output(kid, "import os, json, numpy\nprint(json.dumps("
                                         "[os.getppid(), numpy.__file__]))").strip())
        assert out == [srv.proc.pid, str(srv.root / "shadow" / "numpy.py")]
        assert "launch" in srv.log_text() and "shadow an imported module" in srv.log_text()
    finally:
        srv.stop()


def test_a_kernel_with_another_environment_gets_a_zygote_of_its_own(tmp_path: Path) -> None:
    """A kernelspec that sets TZ: libc read the zygote's time zone once, at its start."""
    srv = Server(tmp_path)
    spec = srv.home / "data" / "kernels" / "tokyo"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Tokyo", "language": "python", "env": {"TZ": "Asia/Tokyo"}}))
    srv.start()
    try:
        utc = srv.open_notebook("a.ipynb")["kernel"]["id"]
        r = srv.request("POST", "api/sessions", {"path": "b.ipynb", "name": "b.ipynb",
                                                 "type": "notebook", "kernel": {"name": "tokyo"}})
        tokyo = facts(srv, r["kernel"]["id"])
        assert tokyo["tz"] == ["JST", "JST"]
        assert facts(srv, utc)["tz"] != ["JST", "JST"]
        assert len(zygotes(srv)) == 2 and tokyo["ppid"] in {z.pid for z in zygotes(srv)}
    finally:
        srv.stop()


def test_a_relative_pythonpath_gets_a_new_process(tmp_path: Path) -> None:
    """PYTHONPATH=lib means <the kernel's directory>/lib to a new kernel; the zygote's
    interpreter resolved it against its own directory: so no fork."""
    srv = Server(tmp_path)
    srv.env["PYTHONPATH"] = "lib"
    (srv.root / "nb" / "lib").mkdir(parents=True)
    (srv.root / "nb" / "lib" / "mymod.py").write_text("WHERE = 'nb/lib'\n")
    srv.start()
    try:
        kid = srv.open_notebook("nb/x.ipynb")["kernel"]["id"]
        out = srv.output(kid, "import os, mymod\nprint(os.getppid(), mymod.WHERE)").split()
        assert out == [str(srv.proc.pid), "nb/lib"]
        assert "PYTHONPATH entry lib is relative" in srv.log_text()
    finally:
        srv.stop()


def test_fast_kernel_start_off_starts_new_processes(tmp_path: Path) -> None:
    srv = Server(tmp_path, {"fast_kernel_start": False}).start()
    try:
        kid = srv.open_notebook("a.ipynb")["kernel"]["id"]
        assert facts(srv, kid)["ppid"] == srv.proc.pid
        assert not zygotes(srv)
    finally:
        srv.stop()


def test_a_pause_ends_the_zygote_and_the_resume_forks_again(tmp_path: Path) -> None:
    srv = Server(tmp_path).start()
    try:
        kid = srv.open_notebook("a.ipynb")["kernel"]["id"]
        srv.output(kid, "import numpy as np\nw = np.arange(5.0) * 3")
        (zygote,) = zygotes(srv)
        srv.request("POST", "jupyter-pause/api/pause", {})
        srv.state("paused")
        wait_gone(srv, zygote.pid)
        assert not zygotes(srv)
        srv.request("POST", "jupyter-pause/api/resume", {})
        srv.state("ready", "running")
        (new_kid,) = [s["kernel"]["id"] for s in srv.get("api/sessions")]
        assert srv.output(new_kid, "print(w.tolist())").strip() == "[0.0, 3.0, 6.0, 9.0, 12.0]"
        (again,) = zygotes(srv)
        assert facts(srv, new_kid)["ppid"] == again.pid != zygote.pid
    finally:
        srv.stop()


def test_what_may_be_forked() -> None:
    me = sys.executable
    assert kernel_args([me, "-m", "ipykernel_launcher", "-f", "c.json"]) == ["-f", "c.json"]
    assert kernel_args(["/other/python", "-m", "ipykernel_launcher", "-f", "c.json"]) is None
    assert kernel_args([me, "-X", "importtime", "-m", "ipykernel_launcher"]) is None
    assert kernel_args([me, "-m", "other_kernel", "-f", "c.json"]) is None
    assert kernel_args(["R", "--slave"]) is None
    base = {"HOME": "/h", "JPY_SESSION_NAME": "a", "PATH": "/bin"}
    # kernels of one server share a zygote: only the variables it sets per kernel differ
    assert shared_env(base) == shared_env({**base, "JPY_SESSION_NAME": "b", "JPY_PARENT_PID": "1"})
    # anything else may have been read at the start or an import (libc's time zone and locale,
    # the user site directory, thread pools, jupyter_client's user name)
    for var in ("TZ", "LC_ALL", "HOME", "USER", "PYTHONPATH", "OMP_NUM_THREADS"):
        assert shared_env({**base, var: "x"}) != shared_env(base), var
    assert relative_path_entry({"PYTHONPATH": "/abs:/other"}) is None
    assert relative_path_entry({"PYTHONPATH": "/abs:lib"}) == "lib"
    assert relative_path_entry({"PYTHONPATH": "/abs::/b"}) == "''"  # empty: the start directory
    assert relative_path_entry({}) is None
