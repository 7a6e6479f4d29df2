"""Which running kernels a pause can checkpoint, and the choice a pause makes for the others.

A kernel of another language (an R, Julia or wrapper kernel), or a Python kernel whose
environment lacks the kernel side of jupyter-pause, cannot be checkpointed. A pause never loses
such a kernel's state silently: the request that would is refused (409, naming each kernel)
unless it says which kernels may lose their state (``lose_state``: their ids, or True for all).
Those kernels are then shut down without a checkpoint; the journal and the reports name each one
("state not saved: <why>") and a resume starts it fresh, never "restored".

Whether one kernel can be checkpointed is :mod:`.kernelside`'s answer (its kernelspec's
language, then what the kernel said of itself); :func:`find` asks it for every kernel of a pause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ..cluster.base import KernelRecord
from . import bridge
from .kernelside import KernelSide, ask_kernel_side, kernel_side_of

# What a pause request may say about kernels that cannot be checkpointed: the ids of those
# whose state may be lost, or True for any such kernel.
LoseState = Collection[str] | bool


@dataclass(frozen=True)
class Uncheckpointable:
    """One running kernel a pause cannot checkpoint, in the words the 409 and the UI show."""

    kernel_id: str
    path: str | None
    kernel: str  # the kernelspec name
    language: str
    why: str
    install_command: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kernel_id": self.kernel_id, "path": self.path, "kernel": self.kernel,
                "language": self.language, "why": self.why,
                "install_command": self.install_command}


def allowed(found: Uncheckpointable, lose_state: LoseState) -> bool:
    """Whether the request lets this kernel's state be lost."""
    if isinstance(lose_state, bool):
        return lose_state
    return found.kernel_id in lose_state


def refusal_message(refused: list[Uncheckpointable]) -> str:
    """The one line of a pause refused for kernels that would lose their state."""
    names = "; ".join(f"{u.path or 'kernel ' + u.kernel_id[:8]} ({u.kernel}: {u.why})"
                      for u in refused)
    return (f"pausing would lose the state of {names}. Nothing was changed. Pause anyway "
            "(lose_state: those kernel ids, or allow_uncheckpointable: true) to shut "
            f"{'it' if len(refused) == 1 else 'them'} down without a checkpoint")


async def find(serverapp: Any, records: list[KernelRecord], timeout: float, *,
               skip_busy: bool = False, fresh: bool = False,
               busy: frozenset[str] = frozenset()) -> list[Uncheckpointable]:
    """The kernels of ``records`` that cannot be checkpointed.

    ``skip_busy``: a busy Python kernel is not asked (its answer would wait for the running
    cell, and the cell may be the ``%pause`` that asked for this pause); the flight asks it
    once the cell has ended; ``busy``: kernels known to be busy whatever jupyter_server has
    heard of their state. A kernel that cannot tell (no answer in ``timeout``) counts as
    checkpointable: its checkpoint then fails with its own reason, and nothing is lost.
    """

    async def one(rec: KernelRecord) -> Uncheckpointable | None:
        side = await side_of(serverapp, rec.kernel_id, timeout, skip_busy=skip_busy,
                             fresh=fresh, known_busy=rec.kernel_id in busy)
        if side.checkpointable:
            return None
        return Uncheckpointable(kernel_id=rec.kernel_id, path=rec.path, kernel=rec.kernel_name,
                                language=side.language, why=side.why,
                                install_command=side.install_command)

    found = await asyncio.gather(*(one(r) for r in records))
    return [u for u in found if u is not None]


async def side_of(serverapp: Any, kernel_id: str, timeout: float, *,
                  skip_busy: bool = False, fresh: bool = False,
                  known_busy: bool = False) -> KernelSide:
    """The kernel's side, asked of the kernel where not known yet, unless it is busy and
    ``skip_busy``, or ``known_busy`` (then what is known, checkpointable when nothing is)."""
    km = serverapp.kernel_manager
    if kernel_id not in km:
        return KernelSide(installed=None, protocol=None, version=None, python=None,
                          language="unknown", install_command=None, checkpointable=True, why="")
    if known_busy or (skip_busy and bridge.execution_state(serverapp, kernel_id) == "busy"):
        return kernel_side_of(km.get_kernel(kernel_id))
    return await ask_kernel_side(serverapp, kernel_id, timeout, fresh=fresh)
