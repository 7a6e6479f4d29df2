"""Which kernels can be checkpointed: what each kernel's side of the bridge is.

A kernel may run in another environment than the server (any interpreter a kernelspec names,
e.g. one registered with ``python -m ipykernel install --name other-env``). The checkpoint code
runs in the kernel, from the ``jupyter-pause-kernel`` distribution, which that environment may
lack or have in a version of another bridge protocol. :func:`kernel_side_of` answers at once from
what this kernel process last said (every bridge call's reply says it, see
:data:`.protocol.SIDE_EXPRESSION`) and from its kernelspec; :func:`ask_kernel_side` asks the
kernel where nothing is known yet.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from dataclasses import asdict, dataclass
from typing import Any

from .protocol import PACKAGE, PROBE, PROTOCOL, install_command, side_error


@dataclass(frozen=True)
class KernelSide:
    """One kernel's side of the bridge.

    ``installed``: None while not known (no bridge call has reached this kernel process yet:
    :func:`ask_kernel_side` finds out). ``checkpointable`` is False only for what is known to
    fail: a kernel without the package, with one of another protocol, or not a Python kernel;
    ``why`` then says so in one line, with the command that fixes it (``install_command``, for
    the kernel's own interpreter ``python``). An unknown kernel side is checkpointable as far as
    anyone knows (``why`` is empty).
    """

    installed: bool | None
    protocol: int | None
    version: str | None
    python: str | None
    language: str
    install_command: str | None
    checkpointable: bool
    why: str

    def to_dict(self) -> dict[str, Any]:
        """The ``kernel_side`` of a kernel in ``GET status``."""
        d = asdict(self)
        d["install"] = d.pop("install_command")
        return d


# What each kernel process said about itself: kernel manager -> (its pid then, the side).
# Weak: a kernel that is shut down is forgotten with its manager.
_seen: weakref.WeakKeyDictionary[Any, tuple[int | None, dict[str, Any]]] = (
    weakref.WeakKeyDictionary())


def _pid(kernel: Any) -> int | None:
    pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
    return pid if isinstance(pid, int) else None


def record(kernel: Any, pid: int | None, side: dict[str, Any]) -> None:
    """Keep what the kernel process ``pid`` said it is (:func:`.protocol.parse_side`)."""
    try:
        _seen[kernel] = (pid, dict(side))
    except TypeError:  # not weak-referenceable (a test double): nothing is kept
        pass


def _spec(kernel: Any) -> Any:
    try:
        return kernel.kernel_spec
    except Exception:  # noqa: BLE001 - a kernelspec removed since the kernel started
        return None


def language(kernel: Any) -> str:
    """The kernel's language, from its kernelspec ("python" where it does not say)."""
    return str(getattr(_spec(kernel), "language", None) or "python").lower()


def spec_python(kernel: Any) -> str | None:
    """The interpreter the kernelspec starts, None where argv[0] is not a Python (a wrapper
    such as ``conda run``: then only the kernel can tell)."""
    argv = list(getattr(_spec(kernel), "argv", None) or [])
    if not argv:
        return None
    exe = str(argv[0])
    # jupyter_client starts its own interpreter for these names (KernelManager.format_kernel_cmd)
    major, minor = sys.version_info[:2]
    if exe in ("python", f"python{major}", f"python{major}.{minor}"):
        return sys.executable
    return exe if os.path.basename(exe).lower().startswith("python") else None


def kernel_side_of(kernel: Any) -> KernelSide:
    """What ``kernel`` (a jupyter_server kernel manager) runs on its side of the bridge, from
    what its current process last said and its kernelspec; never talks to the kernel."""
    lang = language(kernel)
    if lang != "python":
        return KernelSide(installed=None, protocol=None, version=None, python=None,
                          language=lang, install_command=None, checkpointable=False,
                          why=f"jupyter-pause checkpoints Python kernels; this kernel runs {lang}")
    try:
        entry = _seen.get(kernel)
    except TypeError:  # not weak-referenceable: nothing was kept
        entry = None
    now = _pid(kernel)
    said = entry[1] if entry is not None and (entry[0] is None or entry[0] == now) else None
    python = (said or {}).get("python") or spec_python(kernel)
    if said is None:
        return KernelSide(installed=None, protocol=None, version=None, python=python,
                          language=lang, install_command=install_command(python),
                          checkpointable=True, why="")
    why = side_error(said, python) or ""
    installed = bool(said.get("installed"))
    protocol = said.get("protocol") if isinstance(said.get("protocol"), int) else None
    return KernelSide(installed=installed, protocol=protocol,
                      version=said.get("version") if installed else None, python=python,
                      language=lang, install_command=install_command(python),
                      checkpointable=not why, why=why)


async def ask_kernel_side(serverapp: Any, kernel_id: str, timeout: float = 10.0, *,
                          fresh: bool = False) -> KernelSide:
    """:func:`kernel_side_of`, asking the kernel first where its current process has not said
    yet (one silent execution of user expressions only; it waits behind a running cell, up to
    ``timeout``). A kernel that does not answer stays unknown. ``fresh``: forget what it said
    before and ask again (before a pause loses a kernel's state on that answer: the package
    may have been installed into the running kernel's environment since)."""
    from . import bridge  # bridge records what every call learns here

    kernel = serverapp.kernel_manager.get_kernel(kernel_id)
    if fresh:
        with contextlib.suppress(TypeError):  # not weak-referenceable: nothing was kept
            _seen.pop(kernel, None)
    side = kernel_side_of(kernel)
    if side.installed is None and side.language == "python":
        with contextlib.suppress(Exception):  # gone or busy: still unknown
            await bridge.call(serverapp, kernel_id, PROBE, timeout=timeout)
        side = kernel_side_of(kernel)
    return side


__all__ = ["PACKAGE", "PROTOCOL", "KernelSide", "ask_kernel_side", "kernel_side_of", "record",
           "spec_python"]
