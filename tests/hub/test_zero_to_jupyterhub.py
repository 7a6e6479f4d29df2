"""examples/jupyterhub/config.yaml (Zero to JupyterHub) renders, offline, into a KubeSpawner pod
that keeps jupyter_pause's state on the home volume and leaves the shutdown checkpoint its time.

The chart's values become KubeSpawner configuration the way the chart's hub does it
(zero-to-jupyterhub-k8s, jupyterhub/files/hub/jupyterhub_config.py: ``singleuser.storage`` of
type ``dynamic`` -> ``pvc_name_template``, ``volumes``, ``volume_mounts``; ``singleuser.extraFiles``
-> a ``files`` volume from the ``singleuser`` Secret mounted by ``subPath``; ``extraEnv`` ->
``environment``; ``extraPodConfig`` -> ``extra_pod_config``; ``hub.config`` -> the classes'
settings). The pod is then rendered by KubeSpawner itself: ``KubeSpawner.get_pod_manifest()``
(kubespawner/spawner.py), which calls ``kubespawner.objects.make_pod(...)`` with the expanded
settings; ``_mock=True`` is KubeSpawner's own switch for running without a cluster.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("kubespawner")

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import kube_config
from kubespawner import KubeSpawner
from traitlets.config import Config, PyFileConfigLoader

from jupyter_pause.server.app import PauseApp

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jupyterhub"
USER = "alice"
# After the budget the server still shuts its kernels down and exits.
MARGIN_S = 10  # as the README's configuration table says


def values() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLE / "config.yaml").read_text())


def spawner_config(v: dict[str, Any]) -> Config:
    """KubeSpawner's configuration from the chart's values (the chart's jupyterhub_config.py)."""
    su = v["singleuser"]
    c = Config()
    ks = c.KubeSpawner
    ks.image = f"{su['image']['name']}:{su['image']['tag']}"
    ks.cmd = ["jupyterhub-singleuser"]  # the chart's default singleuser.cmd
    ks.start_timeout = su["startTimeout"]
    ks.environment = dict(su.get("extraEnv") or {})
    ks.extra_pod_config = dict(su.get("extraPodConfig") or {})
    storage = su["storage"]
    assert storage["type"] == "dynamic"
    pvc, vol = storage["dynamic"]["pvcNameTemplate"], storage["dynamic"]["volumeNameTemplate"]
    ks.pvc_name_template = pvc
    ks.storage_pvc_ensure = True
    ks.storage_capacity = storage["capacity"]
    ks.storage_access_modes = storage["dynamic"]["storageAccessModes"]
    ks.volumes = [{"name": vol, "persistentVolumeClaim": {"claimName": pvc}}]
    ks.volume_mounts = [{"mountPath": storage["homeMountPath"], "name": vol}]
    files = su.get("extraFiles") or {}
    if files:
        ks.volumes.append({"name": "files", "secret": {
            "secretName": "singleuser",
            "items": [{"key": k, "path": k, **({"mode": f["mode"]} if "mode" in f else {})}
                      for k, f in files.items()]}})
        ks.volume_mounts.extend({"mountPath": f["mountPath"], "subPath": k, "name": "files"}
                                for k, f in files.items())
    if su.get("serviceAccountName"):
        ks.service_account = su["serviceAccountName"]
    cloud_metadata = su.get("cloudMetadata") or {}
    if cloud_metadata.get("blockWithIptables") is True:
        # the chart's privileged init container that drops the pod's traffic to the metadata
        # server (jupyterhub_config.py, `cloud_metadata.get("blockWithIptables") == True`)
        ks.init_containers = [{
            "name": "block-cloud-metadata", "image": "quay.io/jupyterhub/k8s-network-tools",
            "command": ["iptables", "-A", "OUTPUT", "-d",
                        cloud_metadata.get("ip", "169.254.169.254"), "-j", "DROP"],
            "securityContext": {"privileged": True, "runAsUser": 0,
                                "capabilities": {"add": ["NET_ADMIN"]}}}]
    for cls, settings in (v.get("hub", {}).get("config") or {}).items():
        c[cls].update(settings)
    return c


# The chart's own defaults that decide whether a pod reaches the metadata server
# (zero-to-jupyterhub-k8s jupyterhub/values.yaml).
CHART_DEFAULTS = {"singleuser": {
    "cloudMetadata": {"blockWithIptables": True, "ip": "169.254.169.254"},
    "networkPolicy": {"enabled": True, "egressAllowRules": {"cloudMetadataServer": False}}}}


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """helm's values: maps merged key by key, the later file winning."""
    out: dict[str, Any] = {}
    for layer in layers:
        for k, val in layer.items():
            out[k] = merged(out[k], val) if isinstance(val, dict) and isinstance(
                out.get(k), dict) else val
    return out


def render(v: dict[str, Any], tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> tuple[KubeSpawner, dict[str, Any], dict[str, Any]]:
    """The spawner, its pod and its PVC, as the Kubernetes API would receive them. KubeSpawner
    loads a kubeconfig when it is created; this one names an address nothing is asked at."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "offline",
        "clusters": [{"name": "offline", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "offline", "user": {"token": "unused"}}],
        "contexts": [{"name": "offline", "context": {"cluster": "offline", "user": "offline"}}],
    }))
    # Read at import from $KUBECONFIG (kubernetes_asyncio/config/kube_config.py).
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    user = type("User", (), {"name": USER, "id": 1, "url": f"/user/{USER}/"})()

    async def manifests() -> tuple[KubeSpawner, dict[str, Any], dict[str, Any]]:
        spawner = KubeSpawner(_mock=True, user=user, config=spawner_config(v))
        pod = await spawner.get_pod_manifest()
        pvc = spawner.get_pvc_manifest()
        async with ApiClient() as api:
            return (spawner, api.sanitize_for_serialization(pod),
                    api.sanitize_for_serialization(pvc))

    return asyncio.run(manifests())


def server_config(content: str, env: dict[str, str], tmp_path: Path) -> Config:
    """The mounted jupyter_server_config.py, loaded as Jupyter loads it, under the pod's env."""
    path = tmp_path / "jupyter_server_config.py"
    path.write_text(content)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return PyFileConfigLoader(path.name, str(tmp_path)).load_config()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_example_renders_a_pod_that_keeps_the_state_and_the_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    v = values()
    spawner, pod, pvc = render(v, tmp_path, monkeypatch)
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "notebook"]
    home = v["singleuser"]["storage"]["homeMountPath"]

    # The home volume: this user's PVC, mounted at the home.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {vol["name"]: vol for vol in pod["spec"]["volumes"]}
    home_volume = volumes[mounts[home]["name"]]
    assert home_volume["persistentVolumeClaim"]["claimName"] == f"claim-{USER}"
    assert pvc["metadata"]["name"] == f"claim-{USER}"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"

    # The server configuration, mounted from the chart's Secret where Jupyter reads it.
    [(key, spec)] = v["singleuser"]["extraFiles"].items()
    mount = mounts[spec["mountPath"]]
    assert mount["subPath"] == key and mount["mountPath"].endswith("/jupyter_server_config.py")
    assert volumes[mount["name"]]["secret"]["secretName"] == "singleuser"
    assert {"key": key, "path": key} in volumes[mount["name"]]["secret"]["items"]

    # ... which, with the pod's environment, puts the journal, the store and the key on the
    # home volume (the key outside the store), and sets the budget.
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["JUPYTER_PAUSE_HOME"].startswith(home + "/")
    cfg = server_config(spec["stringData"], env, tmp_path)
    assert cfg.ServerApp.jpserver_extensions == {"jupyter_pause": True}
    assert set(cfg.PauseApp) <= set(PauseApp.class_trait_names())
    pause = PauseApp(config=cfg)
    store, key, state = pause.store_url, pause.key_path, pause.state_dir
    for p in (store, key, state):
        assert p.startswith(home + "/"), p
    assert not key.startswith(store.rstrip("/") + "/")
    budget = pause.shutdown_checkpoint_budget
    assert budget == 60.0

    # The time to save them: deleting the pod directly (drain, eviction, kubectl) leaves it
    # terminationGracePeriodSeconds; the hub's own stop (culler, "Stop My Server") deletes it
    # with KubeSpawner.delete_grace_period (KubeSpawner.stop() in kubespawner/spawner.py sets
    # V1DeleteOptions.grace_period_seconds to it), which overrides the pod's.
    assert pod["spec"]["terminationGracePeriodSeconds"] >= budget + MARGIN_S
    assert spawner.delete_grace_period >= budget + MARGIN_S
    # ... and the hub waits for the pod to be gone for start_timeout.
    assert spawner.start_timeout > spawner.delete_grace_period
    assert set(v["hub"]["config"]["KubeSpawner"]) <= set(KubeSpawner.class_trait_names())

    # The image has the extension; the culler is on.
    assert container["image"] == "registry.example.com/jupyter-pause-singleuser:1"
    assert "pip install --no-cache-dir jupyter-pause" in (EXAMPLE / "Dockerfile").read_text()
    assert v["cull"]["enabled"] is True


def test_a_gcs_store_gets_workload_identity_credentials(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart blocks the metadata server for user pods by default, where GKE Workload
    Identity hands out credentials: the gs:// layer must open both blocks and run the pod as the
    account the bucket is granted to; the home-volume example keeps the chart's block."""
    _, pod, _ = render(merged(CHART_DEFAULTS, values()), tmp_path, monkeypatch)
    assert [c["name"] for c in pod["spec"].get("initContainers") or []] == [
        "block-cloud-metadata"]
    gcs = yaml.safe_load((EXAMPLE / "config-gcs.yaml").read_text())
    v = merged(CHART_DEFAULTS, values(), gcs)
    su = v["singleuser"]
    assert su["networkPolicy"]["egressAllowRules"]["cloudMetadataServer"] is True
    _, pod, _ = render(v, tmp_path, monkeypatch)
    assert not pod["spec"].get("initContainers")
    assert pod["spec"]["serviceAccountName"] == su["serviceAccountName"]
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "notebook"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["JUPYTER_PAUSE_STORE"] == f"gs://my-bucket/checkpoints/{USER}"
    cfg = server_config(v["singleuser"]["extraFiles"]["jupyter-pause-config"]["stringData"],
                        {k: val for k, val in env.items() if val}, tmp_path)
    pause = PauseApp(config=cfg)
    assert pause.store_url == env["JUPYTER_PAUSE_STORE"]
    assert pause.key_path.startswith(v["singleuser"]["storage"]["homeMountPath"] + "/")
    assert "gcsfs" in (EXAMPLE / "Dockerfile").read_text()
