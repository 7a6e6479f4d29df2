"""Kernels in environments of their own (tests/kernelenv/envs.py) under a real Jupyter server
with jupyter_pause (tests/server/server_process.py): the kernel side installed there alone (no
jupyter_server), on this Python and on another version; and a kernel without it, named with the
command that installs it into that kernel's own interpreter."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

import jupyter_pause
from jupyter_pause.kernel.side import PROTOCOL
from tests.kernelenv.envs import KernelEnv
from tests.server.server_process import Server

pytestmark = pytest.mark.timeout(600)


def command(env: KernelEnv) -> str:
    return f"{shlex.quote(str(env.python))} -m pip install jupyter-pause-kernel==" \
           f"{jupyter_pause.__version__}"


def serve(tmp: Path, *envs: KernelEnv) -> Server:
    """A started server whose kernelspecs include these environments' (as
    ``python -m ipykernel install --name`` registers them, in the server's data directory)."""
    srv = Server(tmp)
    for env in envs:
        env.install_kernelspec(tmp / "data")
    # The kernels must import what their own environment has, never this tree or this venv.
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        srv.env.pop(var, None)
    srv.env["PYTHONNOUSERSITE"] = "1"
    return srv.start()


def open_notebook(srv: Server, path: str, kernel: str) -> str:
    """A saved notebook on ``kernel``, opened as JupyterLab opens it: its kernel's id."""
    (srv.root / path).write_text(json.dumps({
        "cells": [], "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": kernel, "display_name": kernel,
                                    "language": "python"}}}))
    session = srv.request("POST", "api/sessions", {"path": path, "name": path,
                                                   "type": "notebook", "kernel": {"name": kernel}})
    return session["kernel"]["id"]


def kernel_side(srv: Server, kernel_id: str) -> dict[str, Any]:
    """The kernel's ``kernel_side`` in ``GET status`` once the server has learnt it (it asks
    an idle kernel in the background)."""
    def known() -> dict[str, Any] | None:
        for k in srv.get("jupyter-pause/api/status")["kernels"]:
            if k["id"] == kernel_id and k["kernel_side"]["installed"] is not None:
                return k["kernel_side"]
        return None

    return srv.wait_for("the kernel side in status", known, timeout=60)


def lines(srv: Server, kernel_id: str, code: str) -> list[str]:
    return srv.output(kernel_id, code).splitlines()


def pause_resume_restores(srv: Server, env: KernelEnv, tmp: Path) -> None:
    """Variables set in the environment's kernel come back after a pause and a resume into a
    fresh kernel of the same environment, from the server's checkpoint; the in-kernel magics
    work there too."""
    kid = open_notebook(srv, "other.ipynb", env.name)
    where = lines(srv, kid, "import sys, jupyter_pause\nimport numpy as np\n"
                  "x = 41\narr = np.arange(5)\nnames = {'a': [1, 2]}\n"
                  "print(sys.executable)\nprint(jupyter_pause.__file__)")
    assert where[0] == str(env.python)
    # jupyter_pause comes from the environment's own install, not from this tree
    assert Path(where[1]).is_relative_to(env.python.parent.parent), where
    assert kernel_side(srv, kid) == {
        "installed": True, "protocol": PROTOCOL, "version": jupyter_pause.__version__,
        "python": str(env.python), "language": "python", "install": command(env),
        "checkpointable": True, "why": ""}

    srv.request("POST", "jupyter-pause/api/pause", {"trigger": "manual"})
    st = srv.state("paused", "failed")
    assert st["state"] == "paused", st
    assert srv.get("jupyter-pause/api/status")["kernels"] == []  # the kernel was stopped
    srv.request("POST", "jupyter-pause/api/resume", {"trigger": "manual"})
    st = srv.state("ready", "failed")
    assert st["state"] == "ready" and st["outcome"] == "restored", st
    [k] = st["last_report"]["kernels"]
    new = k["kernel_id"]
    assert new != kid
    # The next cell sees the variables, in a new process of the same environment.
    assert lines(srv, new, "print(sys.executable)\nprint(x + 1, arr.sum(), names['a'])") == [
        str(env.python), "42 10 [1, 2]"]

    # %load_ext, %checkpoint and %restore in that kernel
    out = srv.output(new, "%load_ext jupyter_pause\ny = 'kept'\n%checkpoint")
    assert "Traceback" not in out, out
    lines(srv, new, "del y\nx = 0")
    out = srv.output(new, "%restore")
    assert "Traceback" not in out, out
    assert lines(srv, new, "print(y, x)") == ["kept 41"]


def test_a_kernel_with_only_the_kernel_side_pauses_and_resumes(kernel_side_env, tmp_path):
    env = kernel_side_env
    # The kernel side alone: none of the server's dependencies are there.
    for module in ("jupyter_server", "jupyterlab", "kubernetes", "prometheus_client"):
        r = env.run(f"import {module}")
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (module, r)
    r = env.run("import importlib.metadata as m; print(m.version('jupyter-pause-kernel'))")
    assert r.stdout.strip() == jupyter_pause.__version__, r
    srv = serve(tmp_path, env)
    try:
        pause_resume_restores(srv, env, tmp_path)
    finally:
        srv.stop()


def test_a_kernel_on_another_python_version_pauses_and_resumes(other_version_env, tmp_path):
    env = other_version_env
    here = env.run("import sys; print(*sys.version_info[:2])").stdout.split()
    assert here and [int(v) for v in here] != list(__import__("sys").version_info[:2])
    srv = serve(tmp_path, env)
    try:
        pause_resume_restores(srv, env, tmp_path)
    finally:
        srv.stop()


def test_a_kernel_without_the_kernel_side_is_named_with_its_install_command(bare_env,
                                                                            tmp_path):
    env = bare_env
    assert env.run("import jupyter_pause").returncode != 0
    srv = serve(tmp_path, env)
    try:
        kid = open_notebook(srv, "bare.ipynb", env.name)
        lines(srv, kid, "x = 1")
        side = kernel_side(srv, kid)
        assert side == {
            "installed": False, "protocol": None, "version": None, "python": str(env.python),
            "language": "python", "install": command(env), "checkpointable": False,
            "why": f"jupyter-pause-kernel is not installed in this kernel's environment "
                   f"({env.python}); install it there, then restart the kernel: "
                   f"`{command(env)}`"}
        # A pause is refused (the kernel would lose its state), naming it and that command.
        code, body = srv.call("POST", "jupyter-pause/api/pause", {"trigger": "manual"})
        assert code == 409 and "bare.ipynb" in body["message"], (code, body)
        [k] = body["uncheckpointable"]
        assert k["install_command"] == command(env) and command(env) in k["why"], body
        assert lines(srv, kid, "print(x)") == ["1"]  # the kernel runs on, with its memory
    finally:
        srv.stop()
