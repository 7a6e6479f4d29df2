"""What a backend's calls return: the contract between the backends and the server's flights.

Every :class:`~.base.Backend` returns these from :meth:`~.base.Backend.snapshot`,
:meth:`~.base.Backend.release`, :meth:`~.base.Backend.resume` and
:meth:`~.base.Backend.restored_live`; the server reads them by attribute (``server/pause.py``,
``server/resume.py``). They are frozen: a result says what happened, nobody edits it after.
``to_dict()`` is the JSON form (logs, test output); fields left at their defaults are left out
there, so it names only what the backend did.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

_R = TypeVar("_R")


def _compact(obj: Any) -> dict[str, Any]:
    """The fields that differ from their defaults (``released`` always: it is the answer)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value == f.default and f.name != "released":
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


@dataclasses.dataclass(frozen=True)
class SnapshotResult:
    """What :meth:`~.base.Backend.snapshot` did, after the checkpoints were written."""

    # No process snapshot was taken by this call (local: none at all; Kubeflow: the platform's
    # add-on takes it during release()).
    skipped: bool = False
    # The pod snapshot's name, once it is Ready (or known).
    snapshot: str | None = None
    # The cluster stops this pod right after its snapshot (GKE ``postCheckpoint: stop``, GKE
    # Workspaces): the server writes nothing more to the pod's volumes (a write after the
    # snapshot makes its restore fail).
    hold_writes: bool = False
    # A pod-snapshot restore resumed this very process inside the call: the pause is over, the
    # server goes on with a resume.
    woke_up: bool = False
    reason: str | None = None  # one line for a person: why woke_up or skipped
    backend: str | None = None  # which platform took it ("gke", "kubeflow")
    # GKE Pod Snapshots
    trigger: str | None = None  # the PodSnapshotManualTrigger
    policy: str | None = None  # the PodSnapshotPolicy that selects the pod
    stop_via: str | None = None  # how release() stops the pod: workspace|statefulset|policy|none
    gpu_model: str | None = None
    # Kubeflow Workspaces
    workspace: str | None = None
    gke_workspaces: bool | None = None  # GKE Workspaces' add-on snapshots this Workspace

    def to_dict(self) -> dict[str, Any]:
        return _compact(self)


@dataclasses.dataclass(frozen=True)
class ReleaseResult:
    """What :meth:`~.base.Backend.release` did to free the accelerator."""

    released: bool = False  # the accelerator is (being) freed: kernels or pod stopped
    woke_up: bool = False  # see SnapshotResult.woke_up: a restored pod is never stopped
    reason: str | None = None
    stopped_via: str | None = None  # workspace | statefulset | policy | none
    owner: str | None = None  # the Workspace or StatefulSet that stopped the pod
    stopped_kernels: tuple[str, ...] = ()  # kernel ids shut down (local backend)
    # GKE Workspaces: the pod snapshot the add-on took, and its last checkpoint-state seen.
    snapshot: str | None = None
    checkpoint_state: str | None = None
    snapshot_opt_out: bool = False  # a stop opted the Workspace out of the add-on's snapshot

    def to_dict(self) -> dict[str, Any]:
        return _compact(self)


@dataclasses.dataclass(frozen=True)
class ResumeResult:
    """What :meth:`~.base.Backend.resume` did; the kernels themselves are in ``ctx.kernel_map``."""

    started_kernels: tuple[str, ...] = ()  # kernel ids started anew (the others were running)

    def to_dict(self) -> dict[str, Any]:
        return _compact(self)


@dataclasses.dataclass(frozen=True)
class RestoreVerdict:
    """What :meth:`~.base.Backend.restored_live` found: did the platform bring the process back
    with its memory?"""

    live: bool | None = None  # True: restored live; False: cold-started; None: cannot tell
    # Why, in one line for a person: the server adds it to every notebook that comes back
    # fresh (e.g. "pod was cold-started: snapshot for another GPU model ...").
    reason: str | None = None
    snapshot: str | None = None  # the pod snapshot the pause made (or the platform restored)
    checkpoint_state: str | None = None  # GKE Workspaces' checkpoint-state annotation

    @property
    def restore_reason(self) -> str | None:
        """The reason the live process did not come back (None unless ``live is False``)."""
        return self.reason if self.live is False else None

    def to_dict(self) -> dict[str, Any]:
        return {"live": self.live, **_compact(self)}


def checked_result(value: Any, kind: type[_R], call: str) -> _R:
    """``value`` when it is a ``kind``; else a clear error naming the backend call (a backend
    written against the old contract returned a dict)."""
    if isinstance(value, kind):
        return value
    from .base import BackendError

    raise BackendError(
        f"the backend's {call}() returned {type(value).__name__}, not {kind.__name__} "
        "(jupyter_pause.cluster.results)", reason="backend_error")
