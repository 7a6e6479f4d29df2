"""How long the server really has after SIGTERM, against the shutdown checkpoint's budget.

Two clocks run when a pod is deleted: the kubelet's `terminationGracePeriodSeconds` (30 s when
unset, core/v1 PodSpec; Kubeflow's Workspace controller sets none) and, in images that run the
server as an s6-overlay service (Kubeflow's example notebook images,
components/example-notebook-servers, `s6/services.d/jupyterlab/run`), s6's own shutdown:
`S6_SERVICES_GRACETIME` for the services to exit, then `S6_KILL_GRACETIME` before SIGKILL to
whatever is left (just-containers/s6-overlay README, both default 3000 ms). The first to run out
ends the checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DEFAULT_POD_GRACE_S = 30.0  # core/v1 PodSpec terminationGracePeriodSeconds when unset
S6_DEFAULTS_MS = {"S6_SERVICES_GRACETIME": 3000, "S6_KILL_GRACETIME": 3000}
# PauseApp.shutdown_checkpoint_budget's default (the doctor reads the configured value).
DEFAULT_BUDGET_S = 20.0
# What the server needs after the checkpoint: stop the kernels and exit.
MARGIN_S = 3.0


def under_s6() -> bool:
    """Does this container run s6-overlay (its scandir, or s6-svscan as PID 1)?"""
    try:
        pid1 = Path("/proc/1/comm").read_text().strip()
    except OSError:
        pid1 = ""
    return pid1 == "s6-svscan" or Path("/run/s6").is_dir()


def s6_grace_s(env: Mapping[str, str]) -> tuple[float, list[str]]:
    """s6's time from SIGTERM to SIGKILL for a service, and the problems with its settings."""
    total, problems = 0.0, []
    for name, default in S6_DEFAULTS_MS.items():
        raw = env.get(name)
        try:
            ms = int(raw) if raw not in (None, "") else default
        except ValueError:
            problems.append(f"{name}={raw!r} is not a number of milliseconds")
            ms = default
        total += ms / 1000
    return total, problems


def effective_grace(pod: dict | None, env: Mapping[str, str] | None = None, *,
                    s6: bool | None = None) -> tuple[float, str]:
    """(seconds from SIGTERM to SIGKILL, what decides it)."""
    env = os.environ if env is None else env
    spec = (pod or {}).get("spec") or {}
    raw = spec.get("terminationGracePeriodSeconds")
    pod_grace = float(raw) if raw is not None else DEFAULT_POD_GRACE_S
    why = f"terminationGracePeriodSeconds {pod_grace:g} s" + ("" if raw is not None
                                                              else " (unset: the default)")
    if s6 if s6 is not None else under_s6():
        s6s, _ = s6_grace_s(env)
        if s6s < pod_grace:
            return s6s, (f"s6-overlay: S6_SERVICES_GRACETIME + S6_KILL_GRACETIME = {s6s:g} s "
                         f"(below the pod's {pod_grace:g} s)")
    return pod_grace, why


def grace_finding(pod: dict | None, budget: float, env: Mapping[str, str] | None = None, *,
                  s6: bool | None = None) -> tuple[bool, str, str]:
    """(enough, detail, fix) for the doctor: does the shutdown checkpoint get its budget?"""
    grace, why = effective_grace(pod, env, s6=s6)
    need = budget + MARGIN_S
    detail = f"{grace:g} s after SIGTERM ({why}); the shutdown checkpoint needs {need:g} s"
    if grace >= need:
        return True, detail, ""
    fix = (f"give the server at least {need:g} s: set S6_SERVICES_GRACETIME={int(need * 1000)} "
           "in the container's env (examples/kubernetes/workspacekind.yaml does) and keep "
           "terminationGracePeriodSeconds above it, or lower "
           "c.PauseApp.shutdown_checkpoint_budget")
    return False, detail, fix
