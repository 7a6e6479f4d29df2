"""Fixtures for the Kubernetes tests: the API test server, the simulated cluster, and contexts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jupyter_pause.cluster.base import PauseContext, ResumeContext
from jupyter_pause.cluster.kube import api_client_for

from .apiserver import ApiServerThread
from .simcluster import SimCluster

NS = "user-ns"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kube_apiserver: needs a real kube-apiserver + etcd (tests/kube/scripts)")


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []
        self.messages: list[str] = []

    def report(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def progress(self, message: str) -> None:
        self.messages.append(message)


def pause_ctx(rec: Recorder, flight: str = "f1") -> PauseContext:
    return PauseContext(flight_id=flight, trigger="manual", serverapp=None, kernels=[],
                        accelerator={"type": "nvidia-l4", "count": 1}, _report=rec.report,
                        _progress=rec.progress)


def resume_ctx(rec: Recorder, flight: str = "f2") -> ResumeContext:
    return ResumeContext(flight_id=flight, trigger="startup", serverapp=None, kernels=[],
                         accelerator={"type": "nvidia-l4", "count": 1}, _report=rec.report,
                         _progress=rec.progress)


def notebook_pod(name: str, *, labels: dict | None = None, gpu_model: str | None = None,
                 annotations: dict | None = None, image: str = "jupyter/lab:1") -> dict:
    spec: dict[str, Any] = {
        "runtimeClassName": "gvisor",
        "serviceAccountName": "jupyter",
        "containers": [{"name": "jupyterlab", "image": image,
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    if gpu_model:
        spec["nodeSelector"] = {"cloud.google.com/gke-accelerator": gpu_model}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"jupyter-pause.io/workspace": name},
                         "annotations": annotations or {}},
            "spec": spec}


@pytest.fixture
def apiserver():
    srv = ApiServerThread().start()
    yield srv
    srv.stop()


@pytest.fixture
def admin(apiserver):
    return api_client_for(apiserver.url)


@pytest.fixture
def notebook_client(apiserver):
    """The notebook's client (the fake server applies `deny` switches to every caller)."""
    return api_client_for(apiserver.url)


@pytest.fixture
def sim(admin, apiserver):
    cluster = SimCluster(admin, NS, nodes={"gpu-l4-a": ("nvidia-l4", 1)})
    # the add-on's Workspace webhook at admission, as on a real cluster
    apiserver.call(cluster.admit_on, apiserver.server)
    cluster.start()
    yield cluster
    cluster.stop()
    assert not cluster.errors, cluster.errors


@pytest.fixture
def recorder():
    return Recorder()


# -- Kubeflow Notebooks v2 + GKE Workspaces, as the real controllers behave --

KF, KFV = "kubeflow.org", "v1beta1"
GKW_ENABLED = "podsnapshot.gke.kubeflow.org/enabled"
GKW_GATE = "podsnapshot.gke.kubeflow.org/active"


def workspace(name: str, kind: str = "jupyterlab-pause", annotations: dict | None = None) -> dict:
    """A Workspace that the real kubeflow.org/v1beta1 schema accepts (spec.kind and
    spec.podTemplate.{volumes,options} are required; kubeflow/notebooks notebooks-v2
    workspaces/controller/api/v1beta1/workspace_types.go)."""
    return {"apiVersion": f"{KF}/{KFV}", "kind": "Workspace",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"paused": False, "kind": kind,
                     "podTemplate": {"volumes": {},
                                     "options": {"imageConfig": "jupyterlab-pause",
                                                 "podConfig": "gpu-l4"}}}}


# SimCluster itself plays the Workspace controller and the GKE Workspaces add-on as the real ones
# behave (see its module docstring); the name stays for the tests that ask for Kubeflow by name.
KubeflowSim = SimCluster


@pytest.fixture
def kfsim(sim):
    """The same simulated cluster, for the tests that ask for Kubeflow by name."""
    return sim


def kubeconfig(tmp_path, url: str) -> str:
    """A kubeconfig for the test API server, with a bearer token the server accepts."""
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: t, cluster: {{server: "{url}"}}}}]
users: [{{name: u, user: {{token: abc}}}}]
contexts: [{{name: t, context: {{cluster: t, user: u, namespace: {NS}}}}}]
current-context: t
""")
    return str(path)


def gke_server_config(tmp_path, url: str, *, pause: dict[str, Any] | None = None,
                      **gke: Any) -> dict[str, Any]:
    """A real jupyter_server's config with the GKE backend against the test API server; `pause`
    and `gke` add to or override the PauseApp and GKEBackend settings."""
    for name in ("state", "store"):
        (tmp_path / name).mkdir(exist_ok=True)
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_pause": True}},
        "PauseApp": {
            "backend": "gke",
            "state_dir": str(tmp_path / "state"),
            "store_url": str(tmp_path / "store"),
            "key_path": str(tmp_path / "checkpoint.key"),
            "busy_timeout": 2.0,
            "accelerator": {"type": "nvidia-l4", "count": 1},
            "activity_interval": 0,
            **(pause or {}),
        },
        "GKEBackend": {
            "kubeconfig": kubeconfig(tmp_path, url),
            "pod_name": "nb", "namespace": NS, "gpu_model": "nvidia-l4",
            "trigger_timeout": 20.0, "snapshot_timeout": 20.0, "restored_condition_wait": 0.0,
            **gke,
        },
    }


@pytest.fixture
def api(jp_fetch):
    """Call the extension's REST API of the test server: (method, route, body) -> JSON."""

    async def call(method: str, route: str, body: dict | None = None) -> Any:
        r = await jp_fetch("jupyter-pause", "api", route, method=method,
                           body=None if method == "GET" else json.dumps(body or {}))
        return json.loads(r.body) if r.body else None

    return call
