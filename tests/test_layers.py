"""The layering of the packages, read from every module's imports (ast, nothing imported).

``checkpoint`` is a plain library and ``kernel`` runs in the kernel: together with a few small
shared modules they are the kernel side, installable without the server's dependencies, so
they may import nothing else of ours. ``cluster`` (the snapshot backends) knows nothing of the
server or the policy tools, and the packages depend on each other one way only: the policy
tools are a plugin of the server (an entry point), never imported by it.

A module named by a string (``importlib.import_module("jupyter_pause.x")``, a ``"module:Class"``
default) counts as an import: a dependency by name is a dependency all the same.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections import defaultdict
from pathlib import Path

import pytest

import jupyter_pause

ROOT = Path(jupyter_pause.__file__).parent
PACKAGES = {"checkpoint", "kernel", "server", "cluster", "policy", "cli", "launch"}
# Top-level modules the kernel side ships with checkpoint/ and kernel/.
KERNEL_SHARED = {"__init__", "_version", "atomicfile", "startenv", "statefile", "units",
                 "variables"}
_MODULE_STRING = re.compile(r"^jupyter_pause(?:\.\w+)+(?::[\w.]+)?$")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:]) if "." in module else Path()
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def _unit(module: str) -> str:
    """The layer a module belongs to: its package, or the top-level module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for each of our modules this file imports, at any depth of the code."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import name`: the submodule when there is one, else pkg itself
            subs = [f"{mod}.{a.name}" for a in node.names if _exists(f"{mod}.{a.name}")]
            found = subs if len(subs) == len(node.names) else [mod, *subs]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and _MODULE_STRING.match(node.value):
            mod = node.value.partition(":")[0]
            found = [mod] if _exists(mod) else []  # an entry-point group name is no module
        out += [(node.lineno, m) for m in found
                if m == "jupyter_pause" or m.startswith("jupyter_pause.")]
    return out


def _edges() -> dict[str, dict[str, list[str]]]:
    """unit -> unit it imports -> where ("file:line -> module"), other units only."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "__init__.py":
            # The entry points jupyter_server and IPython look up (by convention here): it
            # names the server and the kernel side, each loaded only when that host asks.
            continue
        src = _unit(_module_name(path))
        for line, mod in _imports(path):
            dst = _unit(mod)
            if dst != src:
                edges[src][dst].append(f"{path.relative_to(ROOT.parent)}:{line} -> {mod}")
    return edges


EDGES = _edges()


def _where(src: str, banned: set[str]) -> list[str]:
    return [w for dst in sorted(banned & set(EDGES[src])) for w in EDGES[src][dst]]


def test_the_parser_sees_real_imports() -> None:
    # the checks below must not pass because nothing was read
    assert "checkpoint" in EDGES["kernel"] and "cluster" in EDGES["server"]
    assert "server" in EDGES["policy"] and "kernel" in EDGES["cli"]


@pytest.mark.parametrize(("package", "banned"), [
    ("kernel", {"server", "cluster", "policy", "cli", "launch"}),
    ("cluster", {"server", "policy", "cli"}),
    ("checkpoint", PACKAGES - {"checkpoint"}),
    ("launch", PACKAGES - {"launch"}),
])
def test_package_imports_none_of(package: str, banned: set[str]) -> None:
    assert not _where(package, banned), "\n".join(_where(package, banned))


@pytest.mark.parametrize("package", ["checkpoint", "kernel"])
def test_the_kernel_side_imports_only_the_kernel_side(package: str) -> None:
    allowed = {"checkpoint", "kernel"} | KERNEL_SHARED
    bad = [w for dst in sorted(set(EDGES[package]) - allowed) for w in EDGES[package][dst]]
    assert not bad, ("the kernel-side distribution would lack these (ship the module with it, "
                     "or move the code):\n" + "\n".join(bad))


def test_no_cycle_between_packages_and_top_level_modules() -> None:
    graph = {src: set(dsts) for src, dsts in EDGES.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    msg = []
    for cycle in cycles:
        msg.append(" -> ".join(cycle))
        msg += [f"    {w}" for a, b in itertools.pairwise(cycle) for w in EDGES[a][b][:3]]
    assert not cycles, "\n".join(msg)
