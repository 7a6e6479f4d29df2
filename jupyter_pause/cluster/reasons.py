"""Why a pause or resume step failed: the one vocabulary of machine-readable failure reasons.

The backends (``BackendError(reason=...)``), the lifecycle (``StepError(reason=...)`` and the
journal's ``failed`` events) and the ``reason`` label of the failures metric all use these
names. A reason outside this set is counted as ``other``, so a new one must be added here
(a test scans the package for ``reason=`` literals that are missing).
"""

from __future__ import annotations

# name -> what it means (for whoever reads a failed event or the metric).
FAILURE_REASONS: dict[str, str] = {
    # lifecycle
    "kernel_busy": "a kernel was running a cell when the pause began",
    "checkpoint_error": "a kernel's checkpoint failed",
    "kernel_side": "a kernel's environment lacks jupyter-pause-kernel, or has one of another "
                   "bridge protocol",
    "storage_full": "the checkpoint store ran out of space",
    "integrity_error": "a checkpoint did not verify",
    "not_found": "a checkpoint the step needed is missing",
    "kernel_died": "a kernel died during its checkpoint",
    "kernel_stalled": "a kernel made no progress and answered no heartbeat (stopped or frozen)",
    "uncheckpointable": "a kernel cannot be checkpointed (another language, or no kernel side) "
                        "and the pause was not allowed to lose its state",
    "restore_error": "restoring a kernel from its checkpoint failed",
    "timeout": "a step ran past its time limit",
    "interrupted": "the server stopped during the flight",
    # backends
    "backend_error": "a backend step failed (no finer reason)",
    "kernel_start": "a kernel did not start on resume",
    "capacity": "no accelerator capacity to resume on",
    "snapshot_failed": "the pod snapshot failed",
    "snapshot_not_wanted": "the platform took a pod snapshot of a stop that opted out of one",
    "snapshot_timeout": "the pod snapshot was not taken or not ready in time",
    "policy_mismatch": "the pod snapshot policy does not select this pod",
    "trigger_conflict": "a pod snapshot trigger of that name already exists",
    "no_selector": "the pod has no stable label for a snapshot policy",
    "no_owner": "the pod has no owner to bring it back",
    "not_in_pod": "not running in a Kubernetes pod",
    "not_workspace": "the pod is not part of a workspace",
    "rbac": "the service account may not do what the step needs",
    "kubernetes": "the Kubernetes API refused or failed a request",
    # anything else
    "other": "a failure without a known reason",
}


def reason_label(reason: str | None) -> str:
    """``reason`` when it is in the vocabulary, else ``"other"`` (a bounded metrics label)."""
    return reason if reason in FAILURE_REASONS else "other"
