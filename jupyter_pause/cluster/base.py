"""The backend interface: what a platform does between "checkpoint written" and "compute is back".

The server's Lifecycle owns flights and the journal. A backend only acts on the platform and tells
the Lifecycle what happened through ``ctx.report(event, **fields)`` and ``ctx.progress(message)``;
it never writes the journal itself, so every backend's history reads the same way.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, ClassVar

from traitlets.config import LoggingConfigurable

from ..configcheck import ValidatedConfig
from .results import ReleaseResult, RestoreVerdict, ResumeResult, SnapshotResult

ENTRY_POINT_GROUP = "jupyter_pause.backends"

# Backends shipped in this package, used when the entry points are not installed (a source
# checkout on PYTHONPATH): the same names as pyproject's `jupyter_pause.backends` group.
BUILTIN_BACKENDS = {
    "local": "jupyter_pause.cluster.local:LocalBackend",
    "gke": "jupyter_pause.cluster.gke:GKEBackend",
    "kubeflow": "jupyter_pause.cluster.kubeflow:KubeflowBackend",
}


@dataclasses.dataclass
class KernelRecord:
    """One kernel as it was at pause time: enough to bring its notebook back."""

    kernel_id: str
    kernel_name: str
    path: str | None = None  # notebook path (= checkpoint stream) or None for a sessionless kernel
    session_id: str | None = None
    session_name: str | None = None
    session_type: str | None = None
    stream: str = "default"
    token: str | None = None
    pid: int | None = None
    checkpoint_id: str | None = None
    bytes_written: int = 0
    bytes_total: int = 0
    variables: list[dict] = dataclasses.field(default_factory=list)
    # Why this kernel's state was not saved: a pause that was allowed to lose it (a kernel that
    # cannot be checkpointed) shut it down without a checkpoint; its resume starts it fresh.
    state_not_saved: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def label(self) -> str:
        return self.path or f"kernel {self.kernel_id[:8]}"


@dataclasses.dataclass
class _Context:
    flight_id: str
    trigger: str
    serverapp: Any  # jupyter_server.serverapp.ServerApp
    kernels: list[KernelRecord]
    accelerator: dict[str, Any]
    _report: Callable[..., Any]
    _progress: Callable[[str], None]

    @property
    def kernel_manager(self) -> Any:
        return self.serverapp.kernel_manager

    @property
    def session_manager(self) -> Any:
        return self.serverapp.session_manager

    def report(self, event: str, **fields: Any) -> Any:
        """Record a lifecycle event (e.g. "waiting_for_capacity", reason=...).

        The journal write is queued in order; the returned future may be awaited but need not be.
        """
        return self._report(event, **fields)

    def progress(self, message: str) -> None:
        """Show a one-line message as the current step's progress (status + throttled event)."""
        self._progress(message)


@dataclasses.dataclass
class PauseContext(_Context):
    """Given to snapshot() and release(): the kernels just checkpointed."""

    checkpoints: list[str | None] = dataclasses.field(default_factory=list)
    snapshot: SnapshotResult = dataclasses.field(default_factory=SnapshotResult)
    # "stop": no checkpoint and no snapshot were taken (snapshot() is not called); release()
    # only frees the accelerator, and the resume starts fresh kernels.
    mode: str = "pause"


@dataclasses.dataclass
class ResumeContext(_Context):
    """Given to resume()/restored_live()/attach(): the kernels recorded by the last pause.

    ``resume()`` fills ``kernel_map`` (recorded kernel id -> kernel id running now); the
    Lifecycle then verifies liveness and restores into those kernels.
    """

    pause: dict[str, Any] = dataclasses.field(default_factory=dict)
    kernel_map: dict[str, str] = dataclasses.field(default_factory=dict)
    # Kernels running at resume that no paused session owned ({kernel_id, path, reason}):
    # never restored into; the resume report names them.
    other_kernels: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class BackendError(Exception):
    """A backend step failed; ``str()`` is one line for a person, ``reason`` a metrics label
    (a name from :data:`.reasons.FAILURE_REASONS`)."""

    def __init__(self, message: str, *, reason: str = "backend_error", hint: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.hint = hint


class Backend(ValidatedConfig, LoggingConfigurable):
    """Base class of every backend; subclasses are configured as ``c.<ClassName>.<trait>``.

    Each call returns a frozen result of :mod:`.results` (never a dict); a step that fails
    raises :class:`BackendError`. A pause calls ``snapshot()`` (not for a stop) then
    ``release()``; a resume calls ``resume()``, ``restored_live()`` (not after a stop) and,
    after the restores, ``attach()``.
    """

    name: ClassVar[str] = "base"
    # Start a resume by itself when the server starts in state "paused" (a pod that came back).
    resume_on_start: ClassVar[bool] = False

    async def describe(self) -> dict[str, Any]:
        return {"name": self.name, "configured": True, "can_pause": True, "why_not": None}

    async def snapshot(self, ctx: PauseContext) -> SnapshotResult:
        """Snapshot the process (pod) after the checkpoints were written."""
        return SnapshotResult(skipped=True)

    async def release(self, ctx: PauseContext) -> ReleaseResult:
        """Free the accelerator: stop the kernels or the pod."""
        return ReleaseResult(released=False)

    async def resume(self, ctx: ResumeContext) -> ResumeResult:
        """Bring the kernels back; fills ``ctx.kernel_map`` (and ``ctx.other_kernels``)."""
        return ResumeResult()

    async def restored_live(self, ctx: ResumeContext) -> RestoreVerdict:
        """Whether the platform restored the process live, and why not (its ``reason`` is
        added to every notebook that comes back fresh)."""
        return RestoreVerdict(live=None)

    async def attach(self, ctx: ResumeContext) -> None:
        """After verify/restore, before "ready": let the UI reach the kernels (re-point sessions)."""

    async def writes_held(self) -> str | None:
        """Why nothing may be written to the pod's volumes now, else None: the cluster just took
        (or is taking) a pod snapshot and stops the pod after it, and a write after the snapshot
        would make its restore fail. The server's shutdown checkpoint asks before it writes."""
        return None

    async def gc(self, *, keep: int, older_than: float | None, dry_run: bool) -> dict[str, Any]:
        return {"deleted": [], "remaining": []}


def _load_target(target: str) -> type:
    module_name, _, attr = target.partition(":")
    if not attr:  # a dotted path "pkg.mod.Class"
        module_name, _, attr = target.rpartition(".")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def resolve_backend_class(name: str) -> type[Backend]:
    """A backend class by entry-point name ("local"), "module:Class" or "pkg.module.Class"."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            cls = ep.load()
            break
    else:
        if name in BUILTIN_BACKENDS:
            cls = _load_target(BUILTIN_BACKENDS[name])
        elif "." in name or ":" in name:
            cls = _load_target(name)
        else:
            known = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
                           | set(BUILTIN_BACKENDS))
            raise ValueError(f"unknown backend {name!r}; known: {', '.join(known)}")
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"backend {name!r} is not a jupyter_pause.cluster.base.Backend")
    return cls
