"""jupyter-pause: pause a GPU notebook, give the accelerator back, and resume it live or from a checkpoint."""

from __future__ import annotations

from typing import Any

try:
    from ._version import __version__
except ImportError:  # a source checkout that was never installed
    __version__ = "0.0.0+unknown"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-pause"}]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    # Imported here so that `%load_ext jupyter_pause` in a kernel never pulls in jupyter_server.
    from .server.app import PauseApp

    return [{"module": "jupyter_pause", "app": PauseApp}]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext jupyter_pause`: register %checkpoint, %restore, %pause and %resume."""
    from .kernel.magics import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .kernel.magics import unload

    unload(ipython)
