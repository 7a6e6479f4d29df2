"""Prometheus metrics, in the default registry so they appear on jupyter_server's ``/metrics``.

Module-level objects: a process registers each metric once, however many servers it runs
(pytest starts several in one process).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Failure reasons are a closed set (the `reason` label stays bounded), shared with the backends.
from ..cluster.reasons import reason_label

_DURATION_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, float("inf"))

PAUSE_DURATION = Histogram(
    "jupyter_pause_pause_duration_seconds",
    "Time from pause requested to accelerator released (successful pauses).",
    ["backend"], buckets=_DURATION_BUCKETS,
)
RESUME_DURATION = Histogram(
    "jupyter_pause_resume_duration_seconds",
    "Time from resume requested to kernels usable.",
    ["backend", "outcome"], buckets=_DURATION_BUCKETS,
)
CHECKPOINT_BYTES = Counter(
    "jupyter_pause_checkpoint_bytes_written",
    "Bytes written by checkpoints at pause (after deduplication).",
    ["backend"],
)
CHECKPOINT_SIZE = Gauge(
    "jupyter_pause_checkpoint_size_bytes",
    "Total size of the kernel state captured by the last pause's checkpoints.",
    ["backend"],
)
ACCELERATOR_SECONDS_RELEASED = Counter(
    "jupyter_pause_accelerator_seconds_released",
    "Accelerator-seconds given back: (resume requested - accelerator released) x count.",
    ["backend", "accelerator"],
)
FALLBACK_RESTORES = Counter(
    "jupyter_pause_fallback_restores",
    "Kernels restored from the application checkpoint because the live process did not come back.",
    ["backend"],
)
FAILURES = Counter(
    "jupyter_pause_failures",
    "Failed pause/resume flights by step and reason.",
    ["backend", "kind", "reason"],
)
RESTORES_AFTER_STOP = Counter(
    "jupyter_pause_restores_after_stop",
    "Notebooks restored (or not: outcome failed) from the checkpoint the last server stop saved.",
    ["backend", "outcome"],
)
FLIGHTS = Counter(
    "jupyter_pause_flights",
    "Pause/resume flights and shutdown checkpoints (kind stop) started, by kind and trigger.",
    ["backend", "kind", "trigger"],
)


# Triggers arrive as free text in request bodies: as a label each new value would be a new time
# series, so only these known ones are kept and anything else counts as "other".
TRIGGERS = frozenset({"manual", "idle", "api", "magic", "startup", "validate", "signal"})


def failure_reason(reason: str | None) -> str:
    return reason_label(reason)


def trigger_label(trigger: str | None) -> str:
    return trigger if trigger in TRIGGERS else "other"
