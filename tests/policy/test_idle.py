"""Idle rules, profiles and the auto-pause state machine with a fake clock."""

from __future__ import annotations

import pytest

from jupyter_pause.policy.idle import AutoPauser, KernelView, Observation, Profile, evaluate
from jupyter_pause.policy.profiles import (
    DEFAULT_PROFILES,
    IdlePolicy,
    Workload,
    build_profiles,
    detect_workload,
    read_labels_file,
    select_profile,
)

T0 = 1_000_000.0
GPU = DEFAULT_PROFILES["gpu-experiment"]  # pause after 1 h, grace 5 min


def obs(state="idle", last=T0, connections=0, never=None, term=None, n=1):
    ks = [KernelView(id=f"k{i}", execution_state=state, last_activity=last, path=f"nb{i}.ipynb",
                     never_pause=never) for i in range(n)]
    return Observation(kernels=ks, connections=connections, terminal_last_activity=term)


# -- rules --------------------------------------------------------------------------------

def test_idle_after_threshold_only():
    assert not evaluate(obs(), GPU, T0 + 3599, T0).idle
    v = evaluate(obs(), GPU, T0 + 3600, T0)
    assert v.idle and v.idle_for == 3600 and v.eligible_at == T0 + 3600


def test_kernel_activity_restarts_the_clock():
    assert not evaluate(obs(last=T0 + 1800), GPU, T0 + 3600, T0).idle
    assert evaluate(obs(last=T0 + 1800), GPU, T0 + 5400, T0).idle


def test_busy_kernel_is_never_idle_even_after_hours():
    for prof in DEFAULT_PROFILES.values():
        v = evaluate(obs(state="busy"), prof, T0 + 100 * 3600, T0)
        assert not v.idle
        assert "kernel busy: nb0.ipynb" in v.blockers


def test_baseline_protects_a_just_resumed_workspace():
    # kernels' last activity is old (before the pause) but the workspace resumed at T0+10h
    assert not evaluate(obs(), GPU, T0 + 10.5 * 3600, T0 + 10 * 3600).idle


def test_terminals_counted_or_not():
    counted = GPU
    ignored = Profile(name="x", count_terminals=False)
    o = obs(term=T0 + 3000)
    assert not evaluate(o, counted, T0 + 3600, T0).idle
    assert evaluate(o, ignored, T0 + 3600, T0).idle


def test_connected_client_rule_optional():
    strict = Profile(name="strict", require_no_connections=True)
    o = obs(connections=2)
    assert evaluate(o, GPU, T0 + 3600, T0).idle
    v = evaluate(o, strict, T0 + 3600, T0)
    assert not v.idle and "2 client(s) connected" in v.blockers


def test_never_pause_exemption_and_none_profile():
    v = evaluate(obs(never=True), GPU, T0 + 9999, T0)
    assert not v.idle and any("--never" in b for b in v.blockers)
    assert not evaluate(obs(), DEFAULT_PROFILES["never"], T0 + 10**7, T0).idle


def test_no_kernels_idle_from_baseline():
    assert evaluate(Observation(), GPU, T0 + 3600, T0).idle


# -- state machine ------------------------------------------------------------------------

def test_fires_without_announcement_when_nobody_is_connected():
    ap = AutoPauser(GPU, T0)
    assert ap.step(obs(), T0 + 3599).kind == "none"
    d = ap.step(obs(), T0 + 3600)
    assert d.kind == "fire" and "gpu-experiment" in d.reason
    assert ap.step(obs(), T0 + 3700).kind == "none"  # one fire per flight


def test_announces_then_fires_after_grace_period():
    ap = AutoPauser(GPU, T0)
    d = ap.step(obs(connections=1), T0 + 3600)
    assert d.kind == "announce" and d.deadline == T0 + 3900
    assert ap.step(obs(connections=1), T0 + 3899).kind == "none"
    assert ap.step(obs(connections=1), T0 + 3900).kind == "fire"


def test_grace_period_cancelled_by_activity():
    ap = AutoPauser(GPU, T0)
    assert ap.step(obs(connections=1), T0 + 3600).kind == "announce"
    d = ap.step(obs(connections=1, last=T0 + 3700), T0 + 3710)
    assert d.kind == "cancel" and "active" in d.reason
    # the clock restarted: no new announcement until an hour after that activity
    assert ap.step(obs(connections=1, last=T0 + 3700), T0 + 3700 + 3599).kind == "none"
    assert ap.step(obs(connections=1, last=T0 + 3700), T0 + 3710 + 3600).kind == "announce"


def test_grace_period_cancelled_by_a_cell_starting():
    ap = AutoPauser(GPU, T0)
    ap.step(obs(connections=1), T0 + 3600)
    d = ap.step(obs(state="busy", connections=1), T0 + 3650)
    assert d.kind == "cancel" and d.reason.startswith("kernel busy")


def test_grace_period_cancelled_by_the_person():
    ap = AutoPauser(GPU, T0)
    ap.step(obs(connections=1), T0 + 3600)
    assert ap.cancel(T0 + 3700).kind == "cancel"
    assert ap.cancel(T0 + 3701) is None  # nothing left to cancel
    assert ap.step(obs(connections=1), T0 + 3900).kind == "none"  # not at the old deadline
    assert ap.step(obs(connections=1), T0 + 3700 + 3600).kind == "announce"


def test_no_auto_pause_of_a_busy_kernel_at_deadline():
    ap = AutoPauser(DEFAULT_PROFILES["training"], T0)
    for t in range(0, 48 * 3600, 600):
        assert ap.step(obs(state="busy"), T0 + t).kind == "none"


def test_lifecycle_busy_cancels_and_blocks():
    ap = AutoPauser(GPU, T0)
    ap.step(obs(connections=1), T0 + 3600)
    assert ap.step(obs(connections=1), T0 + 3610, can_pause=False).kind == "cancel"
    assert ap.step(obs(), T0 + 99999, can_pause=False).kind == "none"


def test_reset_after_flight_restarts_watch():
    ap = AutoPauser(GPU, T0)
    assert ap.step(obs(), T0 + 3600).kind == "fire"
    ap.reset(T0 + 7200)
    assert ap.step(obs(), T0 + 7200 + 3599).kind == "none"
    assert ap.step(obs(), T0 + 7200 + 3600).kind == "fire"


def test_needs_probe_only_when_about_to_act():
    ap = AutoPauser(GPU, T0)
    assert not ap.needs_probe(obs(), T0 + 100)
    assert ap.needs_probe(obs(), T0 + 3600)
    ap.step(obs(connections=1), T0 + 3600)
    assert not ap.needs_probe(obs(connections=1), T0 + 3700)
    assert ap.needs_probe(obs(connections=1), T0 + 3900)


def test_exempt_kernel_is_never_fired_on():
    ap = AutoPauser(GPU, T0)
    assert ap.step(obs(never=True), T0 + 10 * 3600).kind == "none"
    ap.step(obs(connections=1), T0 + 3600 * 11)  # announced
    d = ap.step(obs(connections=1, never=True), T0 + 3600 * 11 + 300)
    assert d.kind == "cancel" and "--never" in d.reason


def test_stop_profile_fires_as_stop():
    ap = AutoPauser(DEFAULT_PROFILES["cpu-small"], T0)
    assert ap.step(obs(), T0 + 2 * 3600).kind == "fire"
    assert ap.profile.action == "stop" and not ap.profile.snapshot


# -- profiles and selection -----------------------------------------------------------------

RULES = IdlePolicy().rules


@pytest.mark.parametrize("w,expected", [
    (Workload(gpu_count=0), "cpu-small"),
    (Workload(gpu_count=1), "gpu-experiment"),
    (Workload(gpu_count=4, labels={"jupyter-pause/workload": "training"}), "training"),
    (Workload(gpu_count=0, labels={"jupyter-pause/workload": "training"}), "training"),
    (Workload(gpu_count=1, labels={"jupyter-pause/profile": "never"}), "never"),
])
def test_default_selection(w, expected):
    assert select_profile(w, DEFAULT_PROFILES, RULES)[0].name == expected


def test_rules_by_image_and_forced_profile():
    rules = [{"image": "*/pytorch-notebook:*", "min_gpus": 1, "profile": "training"},
             {"max_gpus": 0, "profile": "cpu-small"}, {"profile": "gpu-experiment"}]
    w = Workload(gpu_count=2, image="quay.io/jupyter/pytorch-notebook:cuda12")
    p, why = select_profile(w, DEFAULT_PROFILES, rules)
    assert p.name == "training" and why.startswith("rule 0")
    assert select_profile(Workload(gpu_count=2, image="x"), DEFAULT_PROFILES,
                          rules)[0].name == "gpu-experiment"
    assert select_profile(w, DEFAULT_PROFILES, rules, forced="cpu-small")[1] == "configured"
    with pytest.raises(ValueError, match="unknown profile"):
        select_profile(w, DEFAULT_PROFILES, rules, forced="nope")


def test_profile_overrides_validated():
    ps = build_profiles({"gpu-experiment": {"idle_after": 1800}, "night": {"idle_after": 60}})
    assert ps["gpu-experiment"].idle_after == 1800 and ps["gpu-experiment"].action == "pause"
    assert ps["night"].name == "night" and ps["night"].idle_after == 60
    with pytest.raises(ValueError, match="unknown setting"):
        build_profiles({"x": {"idle": 5}})
    with pytest.raises(ValueError, match="action"):
        build_profiles({"x": {"action": "explode"}})


def test_workload_from_env_and_downward_api(tmp_path):
    labels = tmp_path / "labels"
    labels.write_text('app="nb"\njupyter-pause/workload="training"\nteam="ml\\"x"\n')
    assert read_labels_file(str(labels))["team"] == 'ml"x'
    env = {"JUPYTER_PAUSE_GPU_COUNT": "2", "JUPYTER_IMAGE": "img:1",
           "JUPYTER_PAUSE_LABELS": "tier=gold"}
    w = detect_workload(env, labels_file=str(labels))
    assert w.gpu_count == 2 and w.image == "img:1"
    assert w.labels["jupyter-pause/workload"] == "training" and w.labels["tier"] == "gold"
    assert detect_workload({"NVIDIA_VISIBLE_DEVICES": "0,1,2"}).gpu_count == 3
    assert detect_workload({"NVIDIA_VISIBLE_DEVICES": "all"}, accelerator_count=1).gpu_count == 1
    assert detect_workload({}, labels_file=str(tmp_path / "missing")).labels == {}


def test_idle_policy_resolve_from_env(tmp_path):
    pol = IdlePolicy(labels_file=str(tmp_path / "none"))
    p, why, w = pol.resolve({"JUPYTER_PAUSE_GPU_COUNT": "1"})
    assert p.name == "gpu-experiment" and w.gpu_count == 1
    p, why, _ = pol.resolve({"JUPYTER_PAUSE_PROFILE": "training"})
    assert p.name == "training" and why == "configured"
