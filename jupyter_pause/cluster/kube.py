"""Kubernetes access shared by the gke and kubeflow backends, the out-of-pod resume and doctor.

Everything goes through the official `kubernetes` client. Its calls block, so each one runs in a
worker thread (`asyncio.to_thread`) and the Jupyter server's event loop never waits on the network.
Objects are handled as plain camelCase dicts (custom objects already are; typed core objects are
converted with the client's own serializer), and API errors become `KubeError` with a one-line text.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

# GKE Pod Snapshots and Kubeflow Workspaces: see the CRD manifests in examples/kubernetes/crds/.
SNAPSHOT_GROUP, SNAPSHOT_VERSION = "podsnapshot.gke.io", "v1"
PS_NAME_ANNOTATION = "podsnapshot.gke.io/ps-name"
TRIGGERED_BY_LABEL = "gke-pod-snapshot-triggered-by"
KUBEFLOW_GROUP, KUBEFLOW_VERSION = "kubeflow.org", "v1beta1"
WORKSPACE_LABEL = "notebooks.kubeflow.org/workspace-name"
GKW_STATE_ANNOTATION = "podsnapshot.gke.kubeflow.org/checkpoint-state"
GKW_LAST_CHECKPOINT_ANNOTATION = "podsnapshot.gke.kubeflow.org/last-checkpoint-name"
# Ours: the stable per-workspace selector label, the resume lease and snapshot provenance.
WORKSPACE_SELECTOR_LABEL = "jupyter-pause.io/workspace"
LEASE_ANNOTATION = "jupyter-pause.io/resume-lease"
GPU_MODEL_ANNOTATION = "jupyter-pause.io/gpu-model"
SPEC_HASH_ANNOTATION = "jupyter-pause.io/spec-hash"
FLIGHT_ANNOTATION = "jupyter-pause.io/flight"


@dataclass(frozen=True)
class Res:
    """One API resource: group ("" for core), version, plural, scope."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


PODS = Res("", "v1", "pods")
EVENTS = Res("", "v1", "events")  # read only: GKE's Warning when it skips a restore
STATEFULSETS = Res("apps", "v1", "statefulsets")
TRIGGERS = Res(SNAPSHOT_GROUP, SNAPSHOT_VERSION, "podsnapshotmanualtriggers")
SNAPSHOTS = Res(SNAPSHOT_GROUP, SNAPSHOT_VERSION, "podsnapshots")
POLICIES = Res(SNAPSHOT_GROUP, SNAPSHOT_VERSION, "podsnapshotpolicies")
STORAGE_CONFIGS = Res(SNAPSHOT_GROUP, SNAPSHOT_VERSION, "podsnapshotstorageconfigs",
                      namespaced=False)
WORKSPACES = Res(KUBEFLOW_GROUP, KUBEFLOW_VERSION, "workspaces")
WORKSPACEKINDS = Res(KUBEFLOW_GROUP, KUBEFLOW_VERSION, "workspacekinds", namespaced=False)


class KubeError(Exception):
    """An API call failed. `str()` is one line for a person; `status` is the HTTP code (0 = none)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status, self.reason = status, reason

    @classmethod
    def from_api(cls, e: ApiException, what: str) -> KubeError:
        msg = e.reason or "error"
        reason = ""
        try:
            body = json.loads(e.body or "{}")
            msg, reason = body.get("message") or msg, body.get("reason") or ""
        except (ValueError, TypeError):
            pass
        hint = " (the notebook's service account lacks this permission)" if e.status == 403 else ""
        return cls(f"{what}: {msg}{hint}", e.status or 0, reason)


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """In a pod: the service account; elsewhere: the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    return client.ApiClient(cfg)


def api_client_for(host: str, token: str | None = None, verify_ssl: bool = True) -> client.ApiClient:
    """An ApiClient for a plain address (tests, proxies)."""
    cfg = client.Configuration(host=host)
    cfg.verify_ssl = verify_ssl
    if token:
        cfg.api_key = {"authorization": "Bearer " + token}
    return client.ApiClient(cfg)


def own_pod_identity() -> tuple[str | None, str | None]:
    """(pod name, namespace) from the downward API, else hostname + service-account namespace."""
    name = os.environ.get("POD_NAME") or None
    ns = os.environ.get("POD_NAMESPACE") or None
    if ns is None:
        try:
            ns = Path(SA_NAMESPACE_FILE).read_text().strip() or None
        except OSError:
            ns = None
    if name is None and (ns is not None or os.environ.get("KUBERNETES_SERVICE_HOST")):
        name = socket.gethostname()  # a pod's hostname is its name unless spec.hostname is set
    return name, ns


def condition(obj: dict | None, ctype: str) -> dict | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def is_true(obj: dict | None, ctype: str) -> bool:
    c = condition(obj, ctype)
    return bool(c and c.get("status") == "True")


class Kube:
    """Async facade over the client: get/list/create/patch/delete/watch on `Res` resources."""

    def __init__(self, api_client: client.ApiClient | Callable[[], client.ApiClient]) -> None:
        """`api_client`, or a factory for one: loading a kubeconfig can run an auth plugin, so a
        factory is called in a worker thread on first use, never on the event loop."""
        self._factory = None if isinstance(api_client, client.ApiClient) else api_client
        if self._factory is None:
            self._bind(api_client)  # type: ignore[arg-type]
        # Every request has a deadline, so a hung connection never pins a worker thread forever.
        self.request_timeout: float = 30.0

    def _bind(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.authz = client.AuthorizationV1Api(api_client)

    async def _ready(self) -> None:
        if self._factory is not None:
            factory, self._factory = self._factory, None
            try:
                self._bind(await asyncio.to_thread(factory))
            except Exception as e:  # noqa: BLE001 (no kubeconfig, not in a cluster: one line)
                self._factory = factory
                msg = f"no Kubernetes access: {type(e).__name__}: {e}".splitlines()[0]
                raise KubeError(msg) from None

    @staticmethod
    def _json(resp: Any) -> Any:
        data = resp.data if hasattr(resp, "data") else resp
        return json.loads(data) if data else {}

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        # Raw JSON instead of the client's typed models: the same dicts for core and custom kinds,
        # and no strict model validation of fields a newer or older server adds or omits.
        kw.setdefault("_request_timeout", self.request_timeout)
        kw["_preload_content"] = False
        try:
            return self._json(await asyncio.to_thread(fn, *args, **kw))
        except ApiException as e:
            raise KubeError.from_api(e, what) from None
        except Exception as e:  # noqa: BLE001 (connection refused, DNS, TLS: one line)
            raise KubeError(f"{what}: {type(e).__name__}: {e}".splitlines()[0]) from None

    # -- discovery --
    async def api_resources(self, group: str, version: str) -> list[dict]:
        await self._ready()
        res = await self._call(f"discover {group}/{version}", self.custom.get_api_resources,
                               group, version)
        return res.get("resources") or []

    # -- CRUD --
    async def get(self, res: Res, name: str, namespace: str | None = None) -> dict:
        await self._ready()
        what = f"get {res.resource} {name}"
        if res == PODS:
            return await self._call(what, self.core.read_namespaced_pod, name, namespace)
        if res == STATEFULSETS:
            return await self._call(what, self.apps.read_namespaced_stateful_set, name, namespace)
        if res.namespaced:
            return await self._call(what, self.custom.get_namespaced_custom_object, res.group,
                                    res.version, namespace, res.plural, name)
        return await self._call(what, self.custom.get_cluster_custom_object, res.group,
                                res.version, res.plural, name)

    async def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> dict | None:
        try:
            return await self.get(res, name, namespace)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, res: Res, namespace: str | None = None, *, label_selector: str = "",
                   field_selector: str = "") -> dict:
        await self._ready()
        fn, args = self._list_fn(res, namespace)
        return await self._call(f"list {res.resource}", fn, *args, label_selector=label_selector,
                                field_selector=field_selector)

    async def create(self, res: Res, body: dict, namespace: str | None = None) -> dict:
        await self._ready()
        what = f"create {res.resource} {body.get('metadata', {}).get('name', '')}".rstrip()
        if res == PODS:
            return await self._call(what, self.core.create_namespaced_pod, namespace, body)
        if res.namespaced:
            return await self._call(what, self.custom.create_namespaced_custom_object, res.group,
                                    res.version, namespace, res.plural, body)
        return await self._call(what, self.custom.create_cluster_custom_object, res.group,
                                res.version, res.plural, body)

    async def patch(self, res: Res, name: str, body: dict, namespace: str | None = None) -> dict:
        """A merge patch. With `metadata.resourceVersion` in the body it is also a precondition
        (409 Conflict when the object changed since): how the resume lease stays exclusive."""
        await self._ready()
        what = f"patch {res.resource} {name}"
        if res == PODS:
            return await self._call(what, self.core.patch_namespaced_pod, name, namespace, body,
                                    _content_type="application/merge-patch+json")
        if res == STATEFULSETS:
            return await self._call(what, self.apps.patch_namespaced_stateful_set, name,
                                    namespace, body,
                                    _content_type="application/merge-patch+json")
        return await self._call(what, self.custom.patch_namespaced_custom_object, res.group,
                                res.version, namespace, res.plural, name, body,
                                _content_type="application/merge-patch+json")

    async def delete(self, res: Res, name: str, namespace: str | None = None, *,
                     uid: str | None = None) -> dict | None:
        """Delete; None when it was already gone. With `uid`, only that very object (409 else)."""
        await self._ready()
        what = f"delete {res.resource} {name}"
        kw: dict[str, Any] = {}
        if uid:
            kw["body"] = {"preconditions": {"uid": uid}}
        try:
            if res == PODS:
                return await self._call(what, self.core.delete_namespaced_pod, name, namespace,
                                        **kw)
            if res.namespaced:
                return await self._call(what, self.custom.delete_namespaced_custom_object,
                                        res.group, res.version, namespace, res.plural, name, **kw)
            return await self._call(what, self.custom.delete_cluster_custom_object, res.group,
                                    res.version, res.plural, name, **kw)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def access_review(self, verb: str, res: Res, namespace: str | None) -> tuple[bool, str]:
        await self._ready()
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"verb": verb, "group": res.group,
                                                "resource": res.plural,
                                                **({"namespace": namespace} if namespace else {})}}}
        out = await self._call(f"review access {verb} {res.resource}",
                               self.authz.create_self_subject_access_review, body)
        st = out.get("status") or {}
        return bool(st.get("allowed")), st.get("reason") or ""

    # -- watch --
    def _list_fn(self, res: Res, namespace: str | None) -> tuple[Callable[..., Any], tuple]:
        if res == PODS:
            return self.core.list_namespaced_pod, (namespace,)
        if res == STATEFULSETS:
            return self.apps.list_namespaced_stateful_set, (namespace,)
        if res == EVENTS:
            return self.core.list_namespaced_event, (namespace,)
        if res.namespaced:
            return self.custom.list_namespaced_custom_object, (res.group, res.version, namespace,
                                                               res.plural)
        return self.custom.list_cluster_custom_object, (res.group, res.version, res.plural)

    async def wait_for(self, res: Res, name: str, namespace: str | None,
                       done: Callable[[dict | None], Any], *, timeout: float,
                       on_change: Callable[[dict | None], None] | None = None,
                       watch_window: float = 30.0) -> Any:
        """Watch one object until `done(obj)` returns something truthy and return that.

        `obj` is None while the object does not exist (or after it was deleted). Dropped watches
        resume from the last resourceVersion; a 410 Gone (history compacted) re-lists first.
        Raises TimeoutError after `timeout` seconds.
        """
        await self._ready()
        deadline = time.monotonic() + timeout
        fsel = f"metadata.name={name}"
        fn, args = self._list_fn(res, namespace)
        rv: str | None = None
        last: dict | None = None
        first = True
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out waiting for {res.resource} {name}")
            if rv is None:  # (re-)list: the current state and a resourceVersion to watch from
                listing = await self._call(f"list {res.resource}", fn, *args, field_selector=fsel)
                items = listing.get("items") or []
                last = items[0] if items else None
                rv = (listing.get("metadata") or {}).get("resourceVersion")
                if on_change and (first or last is not None):
                    on_change(last)
                first = False
                result = done(last)
                if result:
                    return result
            window = max(1, min(int(left) + 1, int(watch_window)))

            def _watch(rv_: str | None = rv, window_: int = window) -> tuple[list, str | None, bool]:
                w = watch.Watch()
                events, gone = [], False
                try:
                    for ev in w.stream(fn, *args, field_selector=fsel, resource_version=rv_,
                                       timeout_seconds=window_,
                                       _request_timeout=window_ + 10):
                        events.append((ev["type"], ev["raw_object"]))
                        if ev["type"] == "ERROR":
                            break
                        if done(None if ev["type"] == "DELETED" else ev["raw_object"]):
                            w.stop()
                            break
                except ApiException as e:
                    if e.status == 410:
                        gone = True
                    else:
                        raise
                except (urllib3.exceptions.HTTPError, OSError):
                    # The connection dropped: resume from the last version seen.
                    return events, w.resource_version, gone
                return events, w.resource_version, gone

            try:
                events, new_rv, gone = await asyncio.to_thread(_watch)
            except ApiException as e:
                raise KubeError.from_api(e, f"watch {res.resource} {name}") from None
            if gone:
                rv = None
                continue
            for etype, obj in events:
                if etype == "ERROR":
                    if (obj or {}).get("code") == 410:
                        rv = None
                    break
                last = None if etype == "DELETED" else obj
                if on_change:
                    on_change(last)
                result = done(last)
                if result:
                    return result
            else:
                rv = new_rv or rv


# Every API verb the notebook's service account uses, per (group, resource). ClusterRole
# jupyter-pause-notebook in examples/kubernetes/rbac.yaml grants exactly these (a test checks; a
# RoleBinding or a WorkspaceKind's serviceAccount.clusterRoles binds it), and doctor reviews them.
NOTEBOOK_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): ("get", "list", "watch"),  # the own pod: identity, PodRestored
    # GKE's Warning event when it cold-starts a pod instead of restoring it (read-only; without
    # it the cold-start reason comes from what the pause recorded)
    ("", "events"): ("list",),
    ("apps", "statefulsets"): ("patch",),  # release(): scale the own StatefulSet to 0
    (KUBEFLOW_GROUP, "workspaces"): ("get", "list", "watch", "patch"),  # spec.paused
    (SNAPSHOT_GROUP, "podsnapshotpolicies"): ("get", "create"),
    (SNAPSHOT_GROUP, "podsnapshotmanualtriggers"): ("get", "list", "watch", "create", "delete"),
    (SNAPSHOT_GROUP, "podsnapshots"): ("get", "list", "watch", "delete"),
}
# Cluster-scoped and read-only: doctor checks that the policy's storage config is Ready.
NOTEBOOK_CLUSTER_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    (SNAPSHOT_GROUP, "podsnapshotstorageconfigs"): ("get",),
}
# Cluster-scoped and read-only: the kubeflow backend reads the Workspace's WorkspaceKind for GKE
# Workspaces' opt-in annotation (it falls back to the pod's own evidence when this is denied).
KUBEFLOW_CLUSTER_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    (KUBEFLOW_GROUP, "workspacekinds"): ("get",),
}
# What `jupyter pause resume --namespace NS WORKSPACE` needs (a person or a portal, not the pod).
RESUMER_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): ("get", "list", "create", "delete"),
    ("apps", "statefulsets"): ("get", "patch"),
    (KUBEFLOW_GROUP, "workspaces"): ("get", "patch"),
    (SNAPSHOT_GROUP, "podsnapshotmanualtriggers"): ("list",),
    # delete: a snapshot whose restore crashes is dropped before the pod is started cold
    (SNAPSHOT_GROUP, "podsnapshots"): ("get", "delete"),
}
