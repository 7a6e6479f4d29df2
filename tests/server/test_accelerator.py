"""Accelerator detection for accelerator-seconds: the driver's view, never a torch import."""

from __future__ import annotations

import os
import stat

import pytest
from traitlets.config import Config

from jupyter_pause.cluster import accelerator as acc
from jupyter_pause.server.app import PauseApp


def fake_smi(bin_dir, body):
    path = bin_dir / "nvidia-smi"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def gpu_env(tmp_path, monkeypatch):
    """PATH with only our fake nvidia-smi's folder, no /proc GPUs, a fresh cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setattr(acc, "_PROC_GPUS", str(tmp_path / "no-proc"))
    for var in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    acc.detected_accelerator.cache_clear()
    acc.detected_gpu_model.cache_clear()
    yield bin_dir
    acc.detected_accelerator.cache_clear()
    acc.detected_gpu_model.cache_clear()


def test_nvidia_smi_names_and_count(gpu_env):
    fake_smi(gpu_env, 'if [ "$1" = "--query-gpu=name" ] && [ "$2" = "--format=csv,noheader" ];'
             ' then printf "NVIDIA L4\\nNVIDIA L4\\n"; else exit 2; fi')
    assert acc.detect_accelerator({}) == {"type": "nvidia-l4", "count": 2}
    # kernels inherit CUDA_VISIBLE_DEVICES: they can use only the GPUs it lets through
    assert acc.detect_accelerator({"CUDA_VISIBLE_DEVICES": "1"}) == {"type": "nvidia-l4",
                                                                    "count": 1}
    assert acc.detect_accelerator({"CUDA_VISIBLE_DEVICES": ""}) == acc.NONE


def test_gpu_type_names():
    assert acc.gpu_type("Tesla T4") == "nvidia-tesla-t4"
    assert acc.gpu_type("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert acc.parse_gpu_names(["", " "]) == acc.NONE


def test_failing_nvidia_smi_falls_back_to_proc_then_env(gpu_env, tmp_path, monkeypatch):
    fake_smi(gpu_env, 'echo "NVIDIA-SMI has failed" >&2; exit 9')
    assert acc.detect_accelerator({}) == acc.NONE
    assert acc.detect_accelerator({"NVIDIA_VISIBLE_DEVICES": "0,1,2"}) == {"type": "nvidia",
                                                                          "count": 3}
    assert acc.detect_accelerator({"NVIDIA_VISIBLE_DEVICES": "all"}) == acc.NONE  # no proof
    gpus = tmp_path / "proc"
    (gpus / "0000:00:04.0").mkdir(parents=True)
    (gpus / "0000:00:04.0" / "information").write_text("Model: \t\t Tesla T4\nIRQ: 42\n")
    monkeypatch.setattr(acc, "_PROC_GPUS", str(gpus))
    assert acc.detect_accelerator({}) == {"type": "nvidia-tesla-t4", "count": 1}


def test_pause_app_defaults_to_detection_and_config_wins(gpu_env):
    fake_smi(gpu_env, 'printf "NVIDIA H200\\n"')
    assert PauseApp().accelerator == {"type": "nvidia-h200", "count": 1}
    c = Config()
    c.PauseApp.accelerator = {"type": "nvidia-l4", "count": 4}
    assert PauseApp(config=c).accelerator == {"type": "nvidia-l4", "count": 4}
    fake_smi(gpu_env, "exit 1")  # cached: nvidia-smi runs once per process
    assert PauseApp().accelerator == {"type": "nvidia-h200", "count": 1}


def test_no_gpu_at_all(gpu_env):
    assert acc.detect_accelerator({}) == acc.NONE


def test_gke_gpu_model_uses_the_same_detection(gpu_env, tmp_path, monkeypatch):
    """The GKE backend's GPU model comes from this one detection: nvidia-smi, then /proc (which
    its own nvidia-smi call never read), then the pod's node selector; same model, same key."""
    from jupyter_pause.cluster.kube import GPU_MODEL_ANNOTATION
    from jupyter_pause.cluster.pod import ACCELERATOR_SELECTOR, detect_gpu_model
    from jupyter_pause.cluster.verdict import restore_reason

    pod = {"spec": {"nodeSelector": {ACCELERATOR_SELECTOR: "nvidia-l4"}}}
    assert detect_gpu_model(pod) == "nvidia-l4"  # no driver answer: the node selector
    assert detect_gpu_model(None) is None
    gpus = tmp_path / "proc"
    (gpus / "0000:00:04.0").mkdir(parents=True)
    (gpus / "0000:00:04.0" / "information").write_text("Model: \t\t Tesla T4\n")
    monkeypatch.setattr(acc, "_PROC_GPUS", str(gpus))
    acc.detected_gpu_model.cache_clear()
    assert detect_gpu_model(pod) == "nvidia-tesla-t4"
    fake_smi(gpu_env, 'printf "NVIDIA L4\\nNVIDIA L4\\n"')
    acc.detected_gpu_model.cache_clear()
    assert detect_gpu_model(pod) == "nvidia-l4"
    fake_smi(gpu_env, "exit 1")  # cached: nvidia-smi runs once per process
    assert detect_gpu_model(pod) == "nvidia-l4"
    # a snapshot recorded with the driver's name matches the type the node selector gives
    assert acc.gpu_model_key("NVIDIA L4") == acc.gpu_model_key("nvidia-l4")
    trigger = {"metadata": {"annotations": {GPU_MODEL_ANNOTATION: "NVIDIA L4"}}}
    live, why = restore_reason({"spec": {}, "metadata": {}}, trigger, "nvidia-l4")
    assert live is False and "another GPU model" not in why
    live, why = restore_reason({"spec": {}, "metadata": {}}, trigger, "nvidia-tesla-t4")
    assert live is False and "another GPU model" in why
