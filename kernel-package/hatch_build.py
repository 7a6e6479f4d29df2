"""The files of jupyter-pause-kernel: the kernel side of ../jupyter_pause, exactly the paths the
server distribution excludes from its wheel (``[tool.hatch.build.targets.wheel] exclude`` of
../pyproject.toml), so that the two never own the same file and together ship the whole package.

An editable install ships none of them: ``dev-mode-dirs`` maps the package to the source tree.
Either writes ``jupyter_pause/_version.py`` (the server's build does not: the file is ours).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.version.core import VersionFile

if sys.version_info >= (3, 11):
    import tomllib
else:  # hatchling itself needs tomli there
    import tomli as tomllib


def kernel_side_paths(repo: Path) -> list[str]:
    """The kernel side's paths in the repository (``jupyter_pause/...``), from the server's
    exclude list; each entry there must be an anchored path, not a pattern."""
    config = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))
    exclude = config["tool"]["hatch"]["build"]["targets"]["wheel"]["exclude"]
    paths = []
    for entry in exclude:
        rel = entry.lstrip("/")
        if not entry.startswith("/jupyter_pause/") or any(c in rel for c in "*?[!"):
            raise ValueError(f"{entry!r} in ../pyproject.toml's wheel exclude: the kernel side "
                             "is listed as anchored paths (/jupyter_pause/...), one per entry")
        if not (repo / rel).exists():
            raise FileNotFoundError(f"{rel} (listed in ../pyproject.toml's wheel exclude)")
        paths.append(rel)
    return paths


class KernelSideHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        repo = Path(self.root).resolve().parent
        # jupyter_pause.__version__, written as hatchling's version hook writes it (ignored by
        # git), also for an editable install: it is read from the source tree then.
        VersionFile(str(repo), "jupyter_pause/_version.py").write(self.metadata.version)
        if version == "editable":
            return
        for rel in kernel_side_paths(repo):
            build_data["force_include"][str(repo / rel)] = rel
