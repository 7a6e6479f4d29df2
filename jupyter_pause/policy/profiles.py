"""Workload profiles and how one is chosen (GPU request, image, pod labels).

The facts come from the environment, the way a pod sees itself:

* ``JUPYTER_PAUSE_GPU_COUNT`` (set it from the container's ``nvidia.com/gpu`` limit with the
  downward API ``resourceFieldRef``), else the number of ``NVIDIA_VISIBLE_DEVICES``;
* ``JUPYTER_IMAGE`` / ``JUPYTER_IMAGE_SPEC`` (JupyterHub and Kubeflow set them);
* pod labels from the downward API labels file (``key="value"`` per line, default
  ``/etc/podinfo/labels``, or ``JUPYTER_PAUSE_LABELS_FILE``), plus ``JUPYTER_PAUSE_LABELS``
  (``k=v,k2=v2``).

Selection order: ``IdlePolicy.profile`` (or ``JUPYTER_PAUSE_PROFILE``), then the pod label
``jupyter-pause/profile``, then the first matching rule of ``IdlePolicy.rules``.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from traitlets import Bool, Dict, Float, List, Unicode, validate
from traitlets.config import LoggingConfigurable

from .. import configcheck as cc
from .idle import UNCHECKPOINTABLE, Profile

PROFILE_LABEL = "jupyter-pause/profile"

DEFAULT_PROFILES: dict[str, Profile] = {
    "cpu-small": Profile(
        name="cpu-small", action="stop", idle_after=2 * 3600.0, grace_period=300.0,
        snapshot=False,
        description="small CPU notebook: stop without a snapshot after 2 h; the files remain"),
    "gpu-experiment": Profile(
        name="gpu-experiment", action="pause", idle_after=3600.0, grace_period=300.0,
        description="GPU experiment: checkpoint + snapshot and free the accelerator after 1 h"),
    "training": Profile(
        name="training", action="pause", idle_after=4 * 3600.0, grace_period=900.0,
        description="long training: never while a cell runs; pause 4 h after the last cell"),
    "never": Profile(name="never", action="none", description="never auto-pause"),
}

# Autosave per profile, under c.PauseApp.autosave's own keys: a training run whose every cell
# changes the whole model autosaves at most every 5 minutes (each one writes what changed,
# off the cell's path, but a write of a whole model competes for the disk); the others after
# each cell. Overridden by ``c.IdlePolicy.autosave``.
PROFILE_AUTOSAVE: dict[str, dict[str, Any]] = {
    "cpu-small": {}, "gpu-experiment": {}, "training": {"every_s": 300.0}, "never": {},
}

DEFAULT_RULES: list[dict[str, Any]] = [
    {"labels": {"jupyter-pause/workload": "training"}, "profile": "training"},
    {"min_gpus": 1, "profile": "gpu-experiment"},
    {"profile": "cpu-small"},
]


@dataclass
class Workload:
    """What the pod says about itself: GPUs, image, labels."""

    gpu_count: int = 0
    image: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"gpu_count": self.gpu_count, "image": self.image, "labels": dict(self.labels)}


def read_labels_file(path: str) -> dict[str, str]:
    """Downward-API labels file: ``key="value"`` per line (values are JSON-style quoted)."""
    out: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.strip().partition("=")
                if sep and key:
                    value = value.strip()
                    if len(value) >= 2 and value[0] == value[-1] == '"':
                        value = value[1:-1].encode().decode("unicode_escape")
                    out[key.strip()] = value
    except OSError:
        pass
    return out


def _gpu_count_from_env(env: Mapping[str, str]) -> int | None:
    raw = env.get("JUPYTER_PAUSE_GPU_COUNT")
    if raw not in (None, ""):
        try:
            return max(0, int(float(raw)))
        except ValueError:
            return None
    vis = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if vis and vis.lower() not in ("void", "none", "all"):
        return len([d for d in vis.split(",") if d.strip()])
    return None


def detect_workload(env: Mapping[str, str] | None = None, *, labels_file: str | None = None,
                    accelerator_count: int | None = None) -> Workload:
    env = os.environ if env is None else env
    gpus = _gpu_count_from_env(env)
    if gpus is None:
        gpus = accelerator_count or 0
    labels = read_labels_file(labels_file) if labels_file else {}
    for pair in env.get("JUPYTER_PAUSE_LABELS", "").split(","):
        k, sep, v = pair.partition("=")
        if sep and k.strip():
            labels[k.strip()] = v.strip()
    image = env.get("JUPYTER_IMAGE") or env.get("JUPYTER_IMAGE_SPEC") or ""
    return Workload(gpu_count=gpus, image=image, labels=labels)


def rule_matches(rule: Mapping[str, Any], w: Workload) -> bool:
    """All conditions of a rule must hold: ``min_gpus``, ``max_gpus``, ``image`` (glob),
    ``labels`` ({key: glob}). A rule with no condition matches everything (the catch-all)."""
    if "min_gpus" in rule and w.gpu_count < int(rule["min_gpus"]):
        return False
    if "max_gpus" in rule and w.gpu_count > int(rule["max_gpus"]):
        return False
    if "image" in rule and not fnmatch.fnmatchcase(w.image, str(rule["image"])):
        return False
    for key, pattern in (rule.get("labels") or {}).items():
        if key not in w.labels or not fnmatch.fnmatchcase(w.labels[key], str(pattern)):
            return False
    return True


_PROFILE_FIELDS = set(Profile.__dataclass_fields__) - {"name"}


def build_profiles(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, Profile]:
    """Defaults updated field by field from config (a new name starts from gpu-experiment)."""
    profiles = dict(DEFAULT_PROFILES)
    for name, fields in overrides.items():
        unknown = set(fields) - _PROFILE_FIELDS
        if unknown:
            raise ValueError(f"profile {name}: unknown setting(s) {', '.join(sorted(unknown))}")
        if fields.get("action", "pause") not in ("pause", "stop", "none"):
            raise ValueError(f"profile {name}: action must be pause, stop or none")
        if fields.get("uncheckpointable", "skip") not in UNCHECKPOINTABLE:
            raise ValueError(f"profile {name}: uncheckpointable must be skip or pause_anyway")
        base = profiles.get(name, replace(DEFAULT_PROFILES["gpu-experiment"], description=""))
        profiles[name] = replace(base, name=name, **fields)
    return profiles


def select_profile(w: Workload, profiles: Mapping[str, Profile],
                   rules: Sequence[Mapping[str, Any]],
                   forced: str = "") -> tuple[Profile, str]:
    """(profile, why it was chosen)."""
    if forced:
        if forced not in profiles:
            raise ValueError(f"unknown profile {forced!r} (known: {', '.join(sorted(profiles))})")
        return profiles[forced], "configured"
    labelled = w.labels.get(PROFILE_LABEL)
    if labelled is not None and labelled in profiles:
        return profiles[labelled], f"pod label {PROFILE_LABEL}={labelled}"
    for i, rule in enumerate(rules):
        if rule_matches(rule, w):
            name = rule.get("profile", "")
            if name not in profiles:
                raise ValueError(f"rule {i} names unknown profile {name!r}")
            conds = {k: v for k, v in rule.items() if k != "profile"}
            return profiles[name], f"rule {i} {conds or '(catch-all)'}"
    return profiles["never"], "no rule matched"


class IdlePolicy(cc.ValidatedConfig, LoggingConfigurable):
    """Configuration of auto-pause: ``c.IdlePolicy.<trait>`` in jupyter_server_config.py."""

    enabled = Bool(
        False, config=True,
        help="Auto-pause idle workspaces. Off by default (a laptop should not stop its kernels); "
             "platform images turn it on.")
    profile = Unicode(
        "", config=True,
        help="Force this profile (default: $JUPYTER_PAUSE_PROFILE, else label, else rules).")
    profiles = Dict(
        config=True,
        help="Profile overrides by name, e.g. {'gpu-experiment': {'idle_after': 1800}}. Fields: "
             "action (pause|stop|none), idle_after, grace_period (s), require_no_connections, "
             "count_terminals, snapshot, description, uncheckpointable (skip|pause_anyway: "
             "what an auto-pause does when a kernel cannot be checkpointed, e.g. another "
             "language; skip, the default, does not auto-pause such a workspace).")
    rules = List(
        Dict(), default_value=DEFAULT_RULES, config=True,
        help="Ordered selection rules; first match wins. Keys: min_gpus, max_gpus, image (glob), "
             "labels ({key: glob}), profile.")
    labels_file = Unicode(
        "/etc/podinfo/labels", config=True,
        help="Downward-API pod labels file ($JUPYTER_PAUSE_LABELS_FILE overrides).")
    autosave = Dict(
        config=True,
        help="Autosave settings by profile, e.g. {'training': {'every_s': 600}} (the keys of "
             "c.PauseApp.autosave, which wins over these).")
    interval = Float(60.0, config=True, help="Seconds between idle checks.")
    probe_timeout = Float(
        10.0, config=True, help="Seconds to wait for a kernel to answer the %pause --never probe.")
    # A refused value disables auto-pause (IdleMonitor says why); pause and resume stay.
    config_checks: ClassVar[dict[str, cc.Check]] = {"interval": cc.seconds(positive=True),
                     "probe_timeout": cc.seconds(positive=True)}

    @validate(*config_checks)
    def _validate_config(self, proposal: Any) -> Any:
        return self._checked(proposal)

    def autosave_for(self, profile: str) -> dict[str, Any]:
        """The autosave settings of ``profile``: the defaults, then ``autosave``'s."""
        own = self.autosave.get(profile)
        return {**PROFILE_AUTOSAVE.get(profile, {}), **(own if isinstance(own, dict) else {})}

    def resolve(self, env: Mapping[str, str] | None = None,
                accelerator_count: int | None = None) -> tuple[Profile, str, Workload]:
        env = os.environ if env is None else env
        w = detect_workload(env, labels_file=env.get("JUPYTER_PAUSE_LABELS_FILE")
                            or self.labels_file, accelerator_count=accelerator_count)
        forced = self.profile or env.get("JUPYTER_PAUSE_PROFILE", "")
        profile, why = select_profile(w, build_profiles(self.profiles), self.rules, forced)
        return profile, why, w
