"""Kubernetes access shared by the gke and kubeflow backends, the out-of-pod resume and doctor.

Everything goes through the official `kubernetes` client's transport (its configuration, auth and
TLS). Every resource this package touches is one row of a small table (`Res`: group, version,
plural, scope, kind), and one generic request path serves them all, core and custom kinds alike.
The client blocks, so each call runs in a worker thread (`asyncio.to_thread`) and the Jupyter
server's event loop never waits on the network. Objects are plain camelCase dicts (the API's own
JSON, with no model validation of fields a newer or older server adds or omits), and API errors
become `KubeError` with a one-line text.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

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


def api_path(group: str, version: str) -> str:
    """The REST root of a group version: /api/v1 for the core group, else /apis/<group>/<version>."""
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


@dataclass(frozen=True)
class Res:
    """One API resource: group ("" for core), version, plural, scope, and its kind."""

    group: str
    version: str
    plural: str
    namespaced: bool = True
    kind: str = ""

    @property
    def resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path of the collection (in `namespace` when namespaced), or of one object."""
        parts = [api_path(self.group, self.version)]
        if self.namespaced and namespace:
            parts += ["namespaces", quote(namespace, safe="")]
        parts.append(self.plural)
        if name:
            parts.append(quote(name, safe=""))
        return "/".join(parts)

    def manifest(self, name: str, *, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None, spec: Any = None) -> dict[str, Any]:
        """A new object of this kind, ready to create."""
        meta: dict[str, Any] = {"name": name}
        if labels is not None:
            meta["labels"] = labels
        if annotations is not None:
            meta["annotations"] = annotations
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": meta, "spec": spec}


# Every resource this package addresses.
PODS = Res("", "v1", "pods", kind="Pod")
EVENTS = Res("", "v1", "events", kind="Event")  # read only: GKE's Warning when it skips a restore
STATEFULSETS = Res("apps", "v1", "statefulsets", kind="StatefulSet")
ACCESS_REVIEWS = Res("authorization.k8s.io", "v1", "selfsubjectaccessreviews", namespaced=False,
                     kind="SelfSubjectAccessReview")
TRIGGERS = Res(SNAPSHOT_GROUP, SNAPSHOT_VERSION, "podsnapshotmanualtriggers",
               kind="PodSnapshotManualTrigger")
SNAPSHOTS = Res(SNAPSHOT_GROUP, SNAPSHOT_VERSION, "podsnapshots", kind="PodSnapshot")
POLICIES = Res(SNAPSHOT_GROUP, SNAPSHOT_VERSION, "podsnapshotpolicies", kind="PodSnapshotPolicy")
STORAGE_CONFIGS = Res(SNAPSHOT_GROUP, SNAPSHOT_VERSION, "podsnapshotstorageconfigs",
                      namespaced=False, kind="PodSnapshotStorageConfig")
WORKSPACES = Res(KUBEFLOW_GROUP, KUBEFLOW_VERSION, "workspaces", kind="Workspace")
WORKSPACEKINDS = Res(KUBEFLOW_GROUP, KUBEFLOW_VERSION, "workspacekinds", namespaced=False,
                     kind="WorkspaceKind")
# The kinds GKE Pod Snapshots serves: all four make the feature usable.
SNAPSHOT_KINDS = frozenset(r.kind for r in (SNAPSHOTS, POLICIES, TRIGGERS, STORAGE_CONFIGS))


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


# The list and watch parameters `_collection` takes, by the client's argument names.
_QUERY = {"label_selector": "labelSelector", "field_selector": "fieldSelector",
          "resource_version": "resourceVersion", "timeout_seconds": "timeoutSeconds",
          "watch": "watch"}


class Kube:
    """Async facade over the client: get/list/create/patch/delete/watch on `Res` resources."""

    def __init__(self, api_client: client.ApiClient | Callable[[], client.ApiClient]) -> None:
        """`api_client`, or a factory for one: loading a kubeconfig can run an auth plugin, so a
        factory is called in a worker thread on first use, never on the event loop."""
        self._factory = None if isinstance(api_client, client.ApiClient) else api_client
        if self._factory is None:
            self.api_client: client.ApiClient = api_client  # type: ignore[assignment]
        self._loading: asyncio.Future | None = None
        # Every request has a deadline, so a hung connection never pins a worker thread forever.
        self.request_timeout: float = 30.0

    async def _ready(self) -> None:
        if self._factory is None:
            return
        # One load for all callers: a second request while the first loads waits for it
        # rather than finding no client yet.
        if self._loading is None:
            self._loading = asyncio.ensure_future(asyncio.to_thread(self._factory))
        loading = self._loading
        try:
            api = await asyncio.shield(loading)
        except Exception as e:  # noqa: BLE001 (no kubeconfig, not in a cluster: one line)
            if self._loading is loading:
                self._loading = None  # the next request tries again
            msg = f"no Kubernetes access: {type(e).__name__}: {e}".splitlines()[0]
            raise KubeError(msg) from None
        self.api_client = api
        self._factory = None

    # -- the one request path (blocking; runs in a worker thread) --
    def _send(self, method: str, path: str, *, query: Iterable[tuple[str, Any]] = (),
              body: Any = None, content_type: str = "application/json", stream: bool = False,
              timeout: float | None = None) -> Any:
        """One request: the response's JSON, or with `stream` the open response (a watch)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self.api_client.param_serialize(
            method, path, query_params=[(k, v) for k, v in query if v not in (None, "")],
            header_params=headers, body=body, auth_settings=["BearerToken"])
        resp = self.api_client.call_api(*request, _request_timeout=timeout or self.request_timeout)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException(http_resp=resp)
        if stream:
            return resp.response
        data = resp.read()
        return json.loads(data) if data else {}

    def _collection(self, res: Res, namespace: str | None, **params: Any) -> Any:
        """GET a collection with the client's snake_case query names: the list, or with
        watch=True the open stream that kubernetes.watch.Watch reads."""
        query = [(name, params.get(arg)) for arg, name in _QUERY.items()]
        return self._send("GET", res.path(namespace), query=query, stream=bool(params.get("watch")),
                          timeout=params.get("_request_timeout"))

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        await self._ready()
        try:
            return await asyncio.to_thread(fn, *args, **kw)
        except ApiException as e:
            raise KubeError.from_api(e, what) from None
        except Exception as e:  # noqa: BLE001 (connection refused, DNS, TLS: one line)
            raise KubeError(f"{what}: {type(e).__name__}: {e}".splitlines()[0]) from None

    # -- discovery --
    async def api_resources(self, group: str, version: str) -> list[dict]:
        res = await self._call(f"discover {group}/{version}", self._send, "GET",
                               api_path(group, version))
        return res.get("resources") or []

    # -- CRUD --
    async def get(self, res: Res, name: str, namespace: str | None = None) -> dict:
        return await self._call(f"get {res.resource} {name}", self._send, "GET",
                                res.path(namespace, name))

    async def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> dict | None:
        try:
            return await self.get(res, name, namespace)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, res: Res, namespace: str | None = None, *, label_selector: str = "",
                   field_selector: str = "") -> dict:
        return await self._call(f"list {res.resource}", self._collection, res, namespace,
                                label_selector=label_selector, field_selector=field_selector)

    async def create(self, res: Res, body: dict, namespace: str | None = None) -> dict:
        what = f"create {res.resource} {body.get('metadata', {}).get('name', '')}".rstrip()
        return await self._call(what, self._send, "POST", res.path(namespace), body=body)

    async def patch(self, res: Res, name: str, body: dict, namespace: str | None = None) -> dict:
        """A merge patch. With `metadata.resourceVersion` in the body it is also a precondition
        (409 Conflict when the object changed since): how the resume lease stays exclusive."""
        return await self._call(f"patch {res.resource} {name}", self._send, "PATCH",
                                res.path(namespace, name), body=body,
                                content_type="application/merge-patch+json")

    async def delete(self, res: Res, name: str, namespace: str | None = None, *,
                     uid: str | None = None) -> dict | None:
        """Delete; None when it was already gone. With `uid`, only that very object (409 else)."""
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            return await self._call(f"delete {res.resource} {name}", self._send, "DELETE",
                                    res.path(namespace, name), body=body)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    # -- the scale subresource (autoscaling/v1 Scale) --
    async def get_scale(self, res: Res, name: str, namespace: str) -> dict:
        """The workload's Scale: spec.replicas, and status.selector, the label selector its
        controller claims pods by (the string form of spec.selector)."""
        return await self._call(f"get {res.resource} {name}/scale", self._send, "GET",
                                res.path(namespace, name) + "/scale")

    async def scale(self, res: Res, name: str, namespace: str, replicas: int) -> dict:
        """Set spec.replicas through the `scale` subresource: a Role can grant exactly that, for
        one named workload, without the right to patch its pod template."""
        return await self._call(f"scale {res.resource} {name} to {replicas}", self._send,
                                "PATCH", res.path(namespace, name) + "/scale",
                                body={"spec": {"replicas": replicas}},
                                content_type="application/merge-patch+json")

    async def access_review(self, verb: str, res: Res, namespace: str | None,
                            name: str | None = None, *,
                            subresource: str | None = None) -> tuple[bool, str]:
        """May this identity do `verb`? With `name`, on that object (a rule with resourceNames
        allows only named requests); with `subresource`, on that subresource ("scale")."""
        body = {"apiVersion": ACCESS_REVIEWS.api_version, "kind": ACCESS_REVIEWS.kind,
                "spec": {"resourceAttributes": {"verb": verb, "group": res.group,
                                                "resource": res.plural,
                                                **({"subresource": subresource}
                                                   if subresource else {}),
                                                **({"namespace": namespace} if namespace else {}),
                                                **({"name": name} if name else {})}}}
        out = await self._call(f"review access {verb} {res.resource}", self._send, "POST",
                               ACCESS_REVIEWS.path(), body=body)
        st = out.get("status") or {}
        return bool(st.get("allowed")), st.get("reason") or ""

    # -- watch --
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
        fn = functools.partial(self._collection, res, namespace)
        rv: str | None = None
        last: dict | None = None
        first = True
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out waiting for {res.resource} {name}")
            if rv is None:  # (re-)list: the current state and a resourceVersion to watch from
                listing = await self._call(f"list {res.resource}", fn, field_selector=fsel)
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
                w = watch.Watch(return_type="object")  # plain dicts, as everywhere here
                events, gone = [], False
                try:
                    for ev in w.stream(fn, field_selector=fsel, resource_version=rv_,
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
