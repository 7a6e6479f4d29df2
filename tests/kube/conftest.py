"""Fixtures for the Kubernetes tests: the API test server, the simulated cluster, and contexts."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import pytest
from kubernetes.client.rest import ApiException

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
def sim(admin):
    cluster = SimCluster(admin, NS, nodes={"gpu-l4-a": ("nvidia-l4", 1)}).start()
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


class KubeflowSim(SimCluster):
    """SimCluster whose Workspace controller and GKE Workspaces add-on follow the real ones where
    the simple model differs:

    - the Workspace controller writes the whole WorkspaceStatus (Status().Update of the Go struct,
      workspace_controller.go), so a status the real CRD requires is always complete;
    - the add-on decides who it manages like snapshotEnabled (gke-labs/workspaces
      providers/gke/internal/snapshot/cache.go): an explicit "false" on the Workspace, then a TPU
      podConfig, then the Workspace's opt-in, then the WorkspaceKind's;
    - its pod webhook (webhook.go mutatePod) adds the readiness gate
      podsnapshot.gke.kubeflow.org/active to the pods of the Workspaces it manages.
    """

    STATUS_DEFAULTS: ClassVar[dict[str, Any]] = {
        "activity": {"lastActivity": 0, "lastUpdate": 0}, "lastRunningTime": 0, "pauseTime": 0,
        "pendingRestart": False, "podTemplateOptions": {"imageConfig": {}, "podConfig": {}}}

    def patch_cr_status(self, plural: str, name: str, status: dict,
                        group: str = "podsnapshot.gke.io", version: str = "v1") -> None:
        if plural == "workspaces" and group == KF:
            # The test apiserver (v1.20) reads an empty string in a custom resource as null and
            # rejects it, so the fields the controller would leave "" get a non-empty value.
            state = status.get("state") or "Unknown"
            pod = f"ws-{name}-0"
            node = next((p["spec"].get("nodeName") for p in self.pods()
                         if p["metadata"]["name"] == pod), None)
            status = {**self.STATUS_DEFAULTS, "state": state,
                      "stateMessage": status.get("stateMessage") or f"Workspace is {state}",
                      "podTemplatePod": {"name": pod, "nodeName": node or "none"}}
        super().patch_cr_status(plural, name, status, group, version)

    def addon_manages(self, ws: dict) -> bool:
        ann = ws["metadata"].get("annotations") or {}
        if ann.get(GKW_ENABLED, "").lower() == "false":
            return False
        kind_name = (ws.get("spec") or {}).get("kind") or ""
        try:
            kind = self.custom.get_cluster_custom_object(KF, KFV, "workspacekinds", kind_name)
        except ApiException:
            return ann.get(GKW_ENABLED, "").lower() == "true"
        pc = ((ws.get("spec") or {}).get("podTemplate") or {}).get("options", {}).get("podConfig")
        for v in kind["spec"]["podTemplate"]["options"]["podConfig"]["values"]:
            res = (v.get("spec") or {}).get("resources") or {}
            if v["id"] == pc and any("google.com/tpu" in (res.get(f) or {})
                                     for f in ("limits", "requests")):
                return False
        return (ann.get(GKW_ENABLED, "").lower() == "true" or
                (kind["metadata"].get("annotations") or {}).get(GKW_ENABLED, "").lower() == "true")

    def gkw_addon(self, ws: dict) -> bool:
        ws = copy.deepcopy(ws)
        ann = ws["metadata"].setdefault("annotations", {})
        if self.addon_manages(ws):
            ann[GKW_ENABLED] = "true"
        else:
            ann.pop(GKW_ENABLED, None)
        return super().gkw_addon(ws)

    def create_pod(self, body: dict) -> None:
        ws_name = (body.get("metadata", {}).get("labels") or {}).get(
            "notebooks.kubeflow.org/workspace-name")
        if ws_name:
            try:
                ws = self.custom.get_namespaced_custom_object(KF, KFV, self.ns, "workspaces",
                                                              ws_name)
            except ApiException:
                ws = None
            gates = (body.get("spec") or {}).get("readinessGates") or []
            if ws is not None and self.addon_manages(ws) and not any(
                    g.get("conditionType") == GKW_GATE for g in gates):
                body = copy.deepcopy(body)
                body["spec"].setdefault("readinessGates", []).append({"conditionType": GKW_GATE})
        super().create_pod(body)
