"""The two distributions built from this tree: jupyter_pause (the server, ../pyproject.toml) and
jupyter-pause-kernel (the kernel side, kernel-package/). Installed together they never own the
same file and ship the whole package; the server depends on the kernel side at its own version;
the kernel side needs none of the server's dependencies."""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from tests.kernelenv.envs import REPO
from tests.test_layers import KERNEL_SHARED

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PACKAGE = REPO / "jupyter_pause"
VERSION = json.loads((REPO / "labextension" / "package.json").read_text())["version"]
# What only the server needs: a kernel environment must not get any of it.
SERVER_ONLY = {"jupyter-server", "jupyterlab", "kubernetes", "prometheus-client",
               "jupyter-events", "jsonschema", "tornado"}


def package_files(wheel: Path) -> set[str]:
    """The files the wheel installs into site-packages' jupyter_pause/."""
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if n.startswith("jupyter_pause/")}


def requires(wheel: Path) -> dict[str, Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
            if line.startswith("Requires-Dist:")]
    return {re.sub(r"[-_.]+", "-", r.name).lower(): r for r in reqs if not r.marker}


def tree_files() -> set[str]:
    """Every file of the package in this tree, as a wheel names it (no bytecode; the built
    frontend ships as shared data, not in the package)."""
    out = set()
    for path in PACKAGE.rglob("*"):
        rel = path.relative_to(REPO)
        if path.is_file() and "__pycache__" not in rel.parts and rel.parts[1] != "labextension":
            out.add(rel.as_posix())
    return out


def test_the_two_wheels_are_disjoint_and_together_ship_the_whole_package(kernel_wheel,
                                                                         server_wheel):
    kernel, server = package_files(kernel_wheel), package_files(server_wheel)
    assert kernel and server
    assert not kernel & server, sorted(kernel & server)
    assert kernel | server == tree_files(), sorted((kernel | server) ^ tree_files())
    # The kernel side: checkpoint/, kernel/ and exactly the shared modules the layering
    # allows them to import (tests/test_layers.py).
    tops = {n.split("/")[1].removesuffix(".py") for n in kernel}
    assert tops == {"checkpoint", "kernel"} | KERNEL_SHARED, tops
    assert "jupyter_pause/kernel/bridge.py" in kernel and "jupyter_pause/server/app.py" in server


def test_the_server_depends_on_the_kernel_side_of_its_own_version(kernel_wheel, server_wheel):
    assert kernel_wheel.name.startswith(f"jupyter_pause_kernel-{VERSION}-")
    assert server_wheel.name.startswith(f"jupyter_pause-{VERSION}-")
    pin = requires(server_wheel)["jupyter-pause-kernel"]
    # bump the pin in pyproject.toml together with labextension/package.json
    assert str(pin.specifier) == f"=={VERSION}", pin
    with zipfile.ZipFile(kernel_wheel) as z:
        assert f"VERSION = '{VERSION}'" in z.read("jupyter_pause/_version.py").decode()


def test_the_kernel_side_needs_none_of_the_servers_dependencies(kernel_wheel, server_wheel):
    kernel, server = requires(kernel_wheel), requires(server_wheel)
    assert not SERVER_ONLY & set(kernel), sorted(SERVER_ONLY & set(kernel))
    assert {"ipykernel", "dill", "numpy", "safetensors", "blake3"} <= set(kernel)
    # Pinned alike where both name a package.
    for name in set(kernel) & set(server):
        assert kernel[name].specifier == server[name].specifier, (name, kernel[name],
                                                                  server[name])


def test_the_kernel_package_ships_the_list_the_server_excludes():
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    exclude = root["tool"]["hatch"]["build"]["targets"]["wheel"]["exclude"]
    assert all(e.startswith("/jupyter_pause/") for e in exclude), exclude
    kernel = tomllib.loads((REPO / "kernel-package" / "pyproject.toml").read_text())
    assert kernel["project"]["name"] == "jupyter-pause-kernel"
    assert kernel["tool"]["hatch"]["version"]["path"] == "../labextension/package.json"
    # an editable install maps the package to the source tree, one copy of the code
    assert kernel["tool"]["hatch"]["build"]["targets"]["wheel"]["dev-mode-dirs"] == [".."]


def test_the_set_up_says_what_a_kernel_environment_needs():
    readme = (REPO / "README.md").read_text()
    setup = readme[readme.index("## Set up"):readme.index("## Using it")]
    assert setup.count("```bash") == 2  # two commands: start JupyterLab, run the tests
    assert "-e ./kernel-package -e ." in setup
    # the one line for another environment: the install there, at the server's version
    flat = " ".join(setup.split())
    assert "-m pip install ./kernel-package" in flat, flat
    assert f"jupyter-pause-kernel=={VERSION}" in flat, flat
    assert "-e ./kernel-package" in (REPO / "tests" / "run.sh").read_text()
