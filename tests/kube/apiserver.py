"""A small Kubernetes API test server (aiohttp) for the kinds jupyter-pause uses.

(One file, over 400 lines, on purpose: it is one server; its routing, storage, watches and faults
share one state and are read together against the Kubernetes API conventions.)

It speaks enough of the REST API for the official `kubernetes` client and kubectl: routing for core,
grouped and cluster-scoped kinds, discovery, metadata (resourceVersion, uid, generation,
generateName), `kind: Status` errors, merge/JSON patch, label and field selectors, finalizers,
status subresources and watches with history replay, `timeoutSeconds` and 410 Gone.
Faults are switches on the server (`deny`, `fail_next`, `drop_watches_after`, `expire_watches`,
`hide_group`, `muted_watches`), so a test can reproduce RBAC denials, flaky watches and outages;
`grant` gives one identity (a bearer token) exactly the verbs a Role binds to it.

It runs in its own thread with its own event loop (`ApiServerThread`), so that blocking client
calls made from a test's event loop or worker threads never deadlock with it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    status: bool = True  # has a status subresource
    verbs: tuple[str, ...] = (
        "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch",
    )

    @property
    def gv(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


KINDS: list[Kind] = [
    Kind("", "v1", "Pod", "pods"),
    Kind("", "v1", "Namespace", "namespaces", namespaced=False),
    Kind("", "v1", "ConfigMap", "configmaps", status=False),
    Kind("", "v1", "Secret", "secrets", status=False),
    Kind("", "v1", "Event", "events", status=False),
    Kind("apps", "v1", "StatefulSet", "statefulsets"),
    Kind("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews",
         namespaced=False, status=False, verbs=("create",)),
    Kind("podsnapshot.gke.io", "v1", "PodSnapshotStorageConfig", "podsnapshotstorageconfigs",
         namespaced=False),
    Kind("podsnapshot.gke.io", "v1", "PodSnapshotPolicy", "podsnapshotpolicies"),
    Kind("podsnapshot.gke.io", "v1", "PodSnapshotManualTrigger", "podsnapshotmanualtriggers"),
    Kind("podsnapshot.gke.io", "v1", "PodSnapshot", "podsnapshots"),
    Kind("kubeflow.org", "v1beta1", "Workspace", "workspaces"),
    Kind("kubeflow.org", "v1beta1", "WorkspaceKind", "workspacekinds", namespaced=False),
]

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- selectors -------------------------------------------------------------------------------------

def _split_selector(sel: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def label_match(selector: str | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for req in _split_selector(selector):
        m = re.match(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$", req)
        if m:
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (labels.get(key) in vals):
                return False
            continue
        if "!=" in req:
            k, v = req.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in req:
            k, v = req.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif req not in labels:
            return False
    return True


def _field(obj: dict, path: str) -> Any:
    cur: Any = obj
    for p in path.split("."):
        cur = cur.get(p) if isinstance(cur, dict) else None
    return cur


def field_match(selector: str | None, obj: dict) -> bool:
    if not selector:
        return True
    for req in _split_selector(selector):
        neg = "!=" in req
        k, v = req.replace("!=", "=").replace("==", "=").split("=", 1)
        val = _field(obj, k.strip())
        val = "" if val is None else str(val)
        if (val == v.strip()) == neg:
            return False
    return True


# -- patches ---------------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(doc: Any, ops: list[dict]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        kind = op["op"]
        if kind == "test":
            cur = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if cur != op.get("value"):
                raise ValueError(f"test failed at {op['path']}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif kind == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                if kind == "replace" and last not in parent:
                    raise ValueError(f"replace of missing path {op['path']}")
                parent[last] = op["value"]
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                if last not in parent:
                    raise ValueError(f"remove of missing path {op['path']}")
                del parent[last]
        else:
            raise ValueError(f"unsupported op {kind}")
    return doc


SA_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def _admit_service_account(pod: dict) -> None:
    """What the ServiceAccount admission plugin does to every new pod (kubernetes
    plugin/pkg/admission/serviceaccount/admission.go): default the account to "default" and,
    unless automount is off or a mount at the token path exists, add the projected volume
    `kube-api-access-<5 random chars>` (token, kube-root-ca.crt, namespace) and mount it read-only
    in every container. The random suffix makes every pod's `spec.volumes` different."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("serviceAccountName", "default")
    if spec.get("automountServiceAccountToken") is False:
        return
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    if any(m.get("mountPath") == SA_MOUNT_PATH for c in containers
           for m in c.get("volumeMounts") or []):
        return
    name = "kube-api-access-" + uuid.uuid4().hex[:5]
    spec.setdefault("volumes", []).append({"name": name, "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}})
    for c in containers:
        c.setdefault("volumeMounts", []).append(
            {"name": name, "readOnly": True, "mountPath": SA_MOUNT_PATH})


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details,
                "code": self.code}


class _Watcher:
    def __init__(self, kind: Kind, ns: str | None, labels: str | None, fields: str | None):
        self.kind, self.ns, self.labels, self.fields = kind, ns, labels, fields
        self.queue: asyncio.Queue = asyncio.Queue()
        self.sent = 0

    def wants(self, kind: Kind, obj: dict) -> bool:
        meta = obj.get("metadata", {})
        return (kind == self.kind and (self.ns is None or meta.get("namespace") == self.ns)
                and label_match(self.labels, meta.get("labels") or {})
                and field_match(self.fields, obj))


class FakeApiServer:
    """State and HTTP handlers. Access the state only from the server's loop (see `call`)."""

    def __init__(self, user: str = "system:serviceaccount:user-ns:jupyter") -> None:
        self.user = user
        self.kinds = list(KINDS)
        self.store: dict[Kind, dict[tuple[str | None, str], dict]] = {k: {} for k in self.kinds}
        self.rv = 100
        self.history: list[tuple[int, Kind, str, dict]] = []
        self.compacted = 0
        self.watchers: list[_Watcher] = []
        self.requests: list[tuple[str, str]] = []  # (verb, resource) for assertions
        # fault switches
        self.denied: set[tuple[str, str]] = set()  # (verb, plural) ; verb "*" = all
        # Per-identity RBAC: token -> user, user -> the (verb, resource) it was granted. A user
        # with no grants entry is an admin (the simulated cluster's own controllers).
        self.tokens: dict[str, str] = {}
        self.grants: dict[str, set[tuple[str, str]]] = {}
        self.failures: list[dict] = []
        self.drop_after: int | None = None
        self.hidden_groups: set[str] = set()
        self.max_watch_s = 60.0
        # Watches of these plurals deliver nothing (a stream that stays silent, as through a
        # stalled proxy, while the object changes): only a fresh list or get sees the change.
        self.muted_watches: set[str] = set()
        # Called on the server loop with (kind, object) after each create: a test observes the
        # exact moment an object appears (as an admission webhook would).
        self.on_create: list[Any] = []
        # Mutating admission of an update, on the server loop: (kind, ns, old, new, sub) -> the
        # object to store (a mutating webhook on UPDATE, such as GKE Workspaces' Workspace
        # webhook). It reads other objects from `self.store`, never over HTTP.
        self.on_update: list[Any] = []
        # Called on the server loop with (kind, object) after each delete: a controller whose
        # informer reacts to the deletion before any other client's next request.
        self.on_delete: list[Any] = []
        # Awaited before an update is admitted, with the same arguments: what a webhook does
        # through the API before it answers (its own writes land before the object is stored).
        self.before_update: list[Any] = []
        # The ServiceAccount admission plugin is on in every real cluster.
        self.service_account_admission = True

    # -- faults (call from any thread through ApiServerThread.call) --
    def deny(self, verb: str, plural: str) -> None:
        self.denied.add((verb, plural))

    def allow(self, verb: str, plural: str) -> None:
        self.denied.discard((verb, plural))

    def fail_next(self, verb: str, plural: str, code: int = 500, count: int = 1,
                  reason: str = "InternalError", message: str = "injected failure") -> None:
        self.failures.append({"verb": verb, "plural": plural, "code": code, "count": count,
                              "reason": reason, "message": message})

    def drop_watches_after(self, n: int | None) -> None:
        """Close every watch stream after it has sent n events (None: never)."""
        self.drop_after = n

    def expire_watches(self) -> None:
        """Compact history to now and end open watches with a 410 Expired ERROR event."""
        self.compacted = self.rv
        for w in list(self.watchers):
            w.queue.put_nowait(("ERROR", ApiError(410, "Expired", "too old resource version: "
                                                  "expired by test").status()))

    # -- helpers --
    def kind_for(self, group: str, version: str, plural: str) -> Kind:
        for k in self.kinds:
            if k.group == group and k.version == version and k.plural == plural:
                if group in self.hidden_groups:
                    break
                return k
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, kind: Kind, etype: str, obj: dict) -> None:
        self.history.append((self.rv, kind, etype, copy.deepcopy(obj)))
        if len(self.history) > 5000:
            self.compacted = self.history[-4000][0]
            del self.history[:-4000]
        if kind.plural in self.muted_watches:
            return
        for w in self.watchers:
            if w.wants(kind, obj):
                w.queue.put_nowait((etype, copy.deepcopy(obj)))

    def user_of(self, request: web.Request) -> str:
        """The caller, from its bearer token (the token authenticator). Unknown or no token:
        `self.user`, which has every permission unless a deny switch or a grant limits it."""
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        return self.tokens.get(token, self.user)

    def grant(self, user: str, token: str,
              rules: dict[tuple[str, str], tuple[str, ...]]) -> None:
        """Give `user` (who authenticates with `token`) exactly these (group, resource) -> verbs,
        as a Role bound to that identity does; everything else is 403 for that user."""
        self.tokens[token] = user
        self.grants[user] = {(verb, res) for (_, res), verbs in rules.items() for verb in verbs}

    def allowed_for(self, user: str, verb: str, resource: str) -> bool:
        if (verb, resource) in self.denied or ("*", resource) in self.denied:
            return False
        rules = self.grants.get(user)
        return rules is None or (verb, resource) in rules or ("*", resource) in rules

    def _check(self, verb: str, kind: Kind, ns: str | None, name: str | None = None,
               sub: str | None = None, user: str | None = None) -> None:
        """RBAC-like: a subresource is its own resource ("workspaces/status"), as in RBAC."""
        resource = f"{kind.plural}/{sub}" if sub else kind.plural
        self.requests.append((verb, resource))
        who = user or self.user
        # Every authenticated user may ask what it may do (system:basic-user's
        # selfsubjectaccessreviews create); only a global deny switch takes that away.
        ssar = kind.kind == "SelfSubjectAccessReview" and (verb, resource) not in self.denied
        if not ssar and not self.allowed_for(who, verb, resource):
            where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
            raise ApiError(403, "Forbidden",
                           f'{kind.resource}{" " + repr(name) if name else ""} is forbidden: '
                           f'User "{who}" cannot {verb} resource "{resource}" in API '
                           f'group "{kind.group}"{where}',
                           {"kind": kind.plural, "group": kind.group, **({"name": name} if name
                                                                           else {})})
        for f in self.failures:
            if f["count"] > 0 and f["verb"] in (verb, "*") and f["plural"] == kind.plural:
                f["count"] -= 1
                raise ApiError(f["code"], f["reason"], f["message"])

    def _not_found(self, kind: Kind, name: str) -> ApiError:
        return ApiError(404, "NotFound", f'{kind.resource} "{name}" not found',
                        {"name": name, "group": kind.group, "kind": kind.plural})

    def allowed(self, verb: str, plural: str) -> bool:
        return (verb, plural) not in self.denied and ("*", plural) not in self.denied

    # -- CRUD on the store (server loop only) --
    def create(self, kind: Kind, ns: str | None, body: dict, user: str | None = None) -> dict:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if kind.kind == "SelfSubjectAccessReview":  # not stored: answered from the deny switches
            ra = (obj.get("spec") or {}).get("resourceAttributes") or {}
            resource = ra.get("resource", "") + (f"/{ra['subresource']}"
                                                 if ra.get("subresource") else "")
            ok = self.allowed_for(user or self.user, ra.get("verb", ""), resource)
            obj["status"] = {"allowed": ok, **({} if ok else {"reason": "denied by test"})}
            obj["apiVersion"], obj["kind"] = kind.gv, kind.kind
            return obj
        name = meta.get("name") or ""
        if not name or len(name) > 253 or not NAME_RE.match(name):
            raise ApiError(422, "Invalid",
                           f'{kind.kind} "{name}" is invalid: metadata.name: Invalid value: '
                           f'"{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                           "alphanumeric characters, '-' or '.'",
                           {"name": name, "group": kind.group, "kind": kind.kind})
        if kind.kind == "PodSnapshotManualTrigger" and not (obj.get("spec") or {}).get("targetPod"):
            raise ApiError(422, "Invalid", f'{kind.kind} "{name}" is invalid: spec.targetPod: '
                           "Required value")
        key = (ns if kind.namespaced else None, name)
        if key in self.store[kind]:
            raise ApiError(409, "AlreadyExists", f'{kind.resource} "{name}" already exists',
                           {"name": name, "group": kind.group, "kind": kind.plural})
        if kind.namespaced:
            meta["namespace"] = ns
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1,
                    resourceVersion=self._next_rv())
        obj["apiVersion"], obj["kind"] = kind.gv, kind.kind
        if kind.kind == "Pod":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            if self.service_account_admission:
                _admit_service_account(obj)
        if kind.kind == "StatefulSet":
            obj["status"] = {"replicas": 0}
        self.store[kind][key] = obj
        self._emit(kind, "ADDED", obj)
        for hook in self.on_create:
            hook(kind, obj)
        return obj

    def get(self, kind: Kind, ns: str | None, name: str) -> dict:
        obj = self.store[kind].get((ns if kind.namespaced else None, name))
        if obj is None:
            raise self._not_found(kind, name)
        return obj

    def update(self, kind: Kind, ns: str | None, name: str, new: dict, sub: str | None,
               check_rv: bool) -> dict:
        old = self.get(kind, ns, name)
        rv = (new.get("metadata") or {}).get("resourceVersion")
        if check_rv and rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict",
                           f'Operation cannot be fulfilled on {kind.resource} "{name}": the object '
                           "has been modified; please apply your changes to the latest version "
                           "and try again", {"name": name, "group": kind.group,
                                             "kind": kind.plural})
        for hook in self.on_update:
            new = hook(kind, ns, old, new, sub)
        obj = copy.deepcopy(new)
        if sub == "status":
            keep = copy.deepcopy(old)
            keep["status"] = obj.get("status", {})
            obj = keep
        elif kind.status:
            obj["status"] = copy.deepcopy(old.get("status", {}))
        meta = obj.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
        meta["generation"] = old["metadata"].get("generation", 1)
        strip = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
        strip_old = {k: v for k, v in old.items() if k not in ("metadata", "status")}
        if strip != strip_old:
            meta["generation"] += 1
        obj["apiVersion"], obj["kind"] = kind.gv, kind.kind
        if obj == old:
            return old
        meta["resourceVersion"] = self._next_rv()
        key = (ns if kind.namespaced else None, name)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.store[kind][key]
            self._emit(kind, "DELETED", obj)
            return obj
        self.store[kind][key] = obj
        self._emit(kind, "MODIFIED", obj)
        return obj

    def delete(self, kind: Kind, ns: str | None, name: str) -> dict:
        old = self.get(kind, ns, name)
        key = (ns if kind.namespaced else None, name)
        if old["metadata"].get("finalizers"):
            if not old["metadata"].get("deletionTimestamp"):
                obj = copy.deepcopy(old)
                obj["metadata"]["deletionTimestamp"] = now_iso()
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self.store[kind][key] = obj
                self._emit(kind, "MODIFIED", obj)
                return obj
            return old
        del self.store[kind][key]
        obj = copy.deepcopy(old)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(kind, "DELETED", obj)
        for hook in self.on_delete:
            hook(kind, obj)
        return obj

    def items(self, kind: Kind, ns: str | None, labels: str | None, fields: str | None) -> list:
        out = []
        for (ons, _), obj in sorted(self.store[kind].items(), key=lambda kv: str(kv[0])):
            if ns is not None and ons != ns:
                continue
            if label_match(labels, obj["metadata"].get("labels") or {}) and field_match(fields, obj):
                out.append(obj)
        return out

    # -- HTTP --
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors])
        r = app.router
        r.add_get("/version", self._version)
        r.add_get("/api", self._api_versions)
        r.add_get("/apis", self._api_groups)
        r.add_get("/api/v1", self._core_resources)
        r.add_get("/apis/{group}/{version}", self._group_resources)
        r.add_route("*", "/api/v1/{rest:.*}", self._core)
        r.add_route("*", "/apis/{group}/{version}/{rest:.*}", self._grouped)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except ApiError as e:
            return web.json_response(e.status(), status=e.code)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
            err = ApiError(422, "Invalid", f"invalid request: {e}")
            return web.json_response(err.status(), status=422)

    async def _version(self, request):
        return web.json_response({"major": "1", "minor": "31", "gitVersion": "v1.31.0-test",
                                  "platform": "linux/amd64"})

    async def _api_versions(self, request):
        return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                  "serverAddressByClientCIDRs": []})

    async def _api_groups(self, request):
        groups: dict[str, list[str]] = {}
        for k in self.kinds:
            if k.group and k.group not in self.hidden_groups:
                groups.setdefault(k.group, [])
                if k.version not in groups[k.group]:
                    groups[k.group].append(k.version)
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
             "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
            for g, vs in groups.items()]})

    def _resource_list(self, group: str, version: str) -> dict:
        res = []
        for k in self.kinds:
            if k.group == group and k.version == version:
                res.append({"name": k.plural, "singularName": k.kind.lower(),
                            "namespaced": k.namespaced, "kind": k.kind, "verbs": list(k.verbs)})
                if k.status:
                    res.append({"name": k.plural + "/status", "singularName": "",
                                "namespaced": k.namespaced, "kind": k.kind,
                                "verbs": ["get", "patch", "update"]})
        if not res:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                "resources": res}

    async def _core_resources(self, request):
        return web.json_response(self._resource_list("", "v1"))

    async def _group_resources(self, request):
        g = request.match_info["group"]
        if g in self.hidden_groups:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return web.json_response(self._resource_list(g, request.match_info["version"]))

    async def _core(self, request):
        return await self._dispatch(request, "", "v1", request.match_info["rest"])

    async def _grouped(self, request):
        return await self._dispatch(request, request.match_info["group"],
                                    request.match_info["version"], request.match_info["rest"])

    async def _dispatch(self, request: web.Request, group: str, version: str, rest: str):
        parts = [p for p in rest.split("/") if p]
        ns = None
        if len(parts) >= 3 and parts[0] == "namespaces":
            ns, parts = parts[1], parts[2:]
        kind = self.kind_for(group, version, parts[0])
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        if kind.namespaced and ns is None and name is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        q = request.query
        m = request.method
        user = self.user_of(request)
        if m == "GET" and name is None:
            if q.get("watch") in ("true", "1"):
                self._check("watch", kind, ns, user=user)
                return await self._watch(request, kind, ns)
            self._check("list", kind, ns, user=user)
            items = self.items(kind, ns, q.get("labelSelector"), q.get("fieldSelector"))
            return web.json_response({"kind": kind.kind + "List", "apiVersion": kind.gv,
                                      "metadata": {"resourceVersion": str(self.rv)},
                                      "items": items})
        if sub == "scale" and kind.kind == "StatefulSet":
            return await self._scale(request, kind, ns, name, user)
        if m == "GET":
            self._check("get", kind, ns, name, user=user)
            return web.json_response(self.get(kind, ns, name))
        if m == "POST" and name is None:
            self._check("create", kind, ns, user=user)
            body = await request.json()
            obj = self.create(kind, ns, body, user=user)
            return web.json_response(obj, status=201)
        if m == "POST" and kind.plural == "pods" and sub == "binding":
            self._check("create", kind, ns, name, sub, user=user)
            body = await request.json()
            pod = copy.deepcopy(self.get(kind, ns, name))
            if pod["spec"].get("nodeName"):
                raise ApiError(409, "Conflict", f'pod {name} is already assigned to node '
                               f'"{pod["spec"]["nodeName"]}"')
            pod["spec"]["nodeName"] = body["target"]["name"]
            old = self.get(kind, ns, name)
            old_spec_status = copy.deepcopy(old)
            old_spec_status["spec"] = pod["spec"]
            old_spec_status["metadata"]["resourceVersion"] = self._next_rv()
            self.store[kind][(ns, name)] = old_spec_status
            self._emit(kind, "MODIFIED", old_spec_status)
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success",
                                      "code": 201}, status=201)
        if m == "PUT" and name:
            self._check("update", kind, ns, name, sub, user=user)
            body = await request.json()
            for hook in self.before_update:
                await hook(kind, ns, self.get(kind, ns, name), body, sub)
            return web.json_response(self.update(kind, ns, name, body, sub, check_rv=True))
        if m == "PATCH" and name:
            self._check("patch", kind, ns, name, sub, user=user)
            body = await request.json()
            ctype = request.headers.get("Content-Type", "")

            def patched() -> tuple[dict, bool]:
                old = self.get(kind, ns, name)
                if "json-patch" in ctype:
                    return json_patch(old, body), False
                new = merge_patch(old, body)
                check = bool((body.get("metadata") or {}).get("resourceVersion"))
                if not check:
                    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                return new, check

            new, _ = patched()
            for hook in self.before_update:
                await hook(kind, ns, self.get(kind, ns, name), new, sub)
            new, check = patched()  # on the object as it is once the hooks are done
            return web.json_response(self.update(kind, ns, name, new, sub, check_rv=check))
        if m == "DELETE" and name:
            self._check("delete", kind, ns, name, user=user)
            body = (await request.json()) if request.can_read_body else {}
            want_uid = ((body or {}).get("preconditions") or {}).get("uid")
            if want_uid and self.get(kind, ns, name)["metadata"]["uid"] != want_uid:
                raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: "
                               f"{want_uid}, UID in object meta: "
                               f"{self.get(kind, ns, name)['metadata']['uid']}")
            return web.json_response(self.delete(kind, ns, name))
        if m == "DELETE":
            self._check("deletecollection", kind, ns, user=user)
            for obj in self.items(kind, ns, q.get("labelSelector"), q.get("fieldSelector")):
                self.delete(kind, ns, obj["metadata"]["name"])
            return web.json_response({"kind": kind.kind + "List", "apiVersion": kind.gv,
                                      "metadata": {"resourceVersion": str(self.rv)},
                                      "items": []})
        raise ApiError(405, "MethodNotAllowed", f"{m} is not supported on {rest}")

    async def _scale(self, request: web.Request, kind: Kind, ns: str | None, name: str,
                     user: str | None):
        """The `scale` subresource: an autoscaling/v1 Scale whose status.selector is the
        workload's selector as a string (kubernetes pkg/registry/apps/statefulset/storage
        scaleFromStatefulSet); GET and merge-PATCH of spec.replicas."""
        if request.method not in ("GET", "PATCH"):
            raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported on scale")
        verb = request.method.lower()
        self._check(verb, kind, ns, name, "scale", user=user)
        sts = self.get(kind, ns, name)
        if verb == "patch":
            body = await request.json()
            replicas = ((body.get("spec") or {}).get("replicas"))
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: '
                               "spec.replicas: Invalid value")
            new = copy.deepcopy(sts)
            new["spec"]["replicas"] = replicas
            sts = self.update(kind, ns, name, new, None, check_rv=False)
        sel = ((sts.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        meta = sts["metadata"]
        return web.json_response({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                              "creationTimestamp") if k in meta},
            "spec": {"replicas": sts["spec"].get("replicas", 1)},
            "status": {"replicas": (sts.get("status") or {}).get("replicas", 0),
                       "selector": ",".join(f"{k}={v}" for k, v in sorted(sel.items()))}})

    async def _watch(self, request: web.Request, kind: Kind, ns: str | None):
        q = request.query
        w = _Watcher(kind, ns, q.get("labelSelector"), q.get("fieldSelector"))
        rv = q.get("resourceVersion")
        timeout = min(float(q.get("timeoutSeconds") or self.max_watch_s), self.max_watch_s)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        backlog: list[tuple[str, dict]] = []
        if rv and rv != "0":
            if int(rv) < self.compacted:
                backlog.append(("ERROR", ApiError(
                    410, "Expired", f"too old resource version: {rv} ({self.compacted})").status()))
            else:
                backlog += [(t, o) for (r, k, t, o) in self.history
                            if r > int(rv) and w.wants(k, o)
                            and k.plural not in self.muted_watches]
        else:
            backlog += [("ADDED", o) for o in self.items(kind, ns, w.labels, w.fields)]
        self.watchers.append(w)
        for ev in backlog:
            w.queue.put_nowait(ev)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    etype, obj = await asyncio.wait_for(w.queue.get(), left)
                except asyncio.TimeoutError:
                    break
                await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                w.sent += 1
                if etype == "ERROR" or (self.drop_after is not None and w.sent >= self.drop_after):
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(w)
        try:
            await resp.write_eof()
        except ConnectionResetError:
            pass
        return resp


class ApiServerThread:
    """Runs a FakeApiServer on 127.0.0.1 in a daemon thread; `url` is its base address."""

    def __init__(self, server: FakeApiServer | None = None) -> None:
        self.server = server or FakeApiServer()
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-apiserver")
        self.url = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = web.AppRunner(self.server.app(), handle_signals=False)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._runner = runner
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def start(self) -> ApiServerThread:
        self._thread.start()
        self._ready.wait(10)
        return self

    def call(self, fn, *args, **kwargs):
        """Run fn(*args) on the server's loop (state is only touched there) and return its result."""
        async def _do():
            return fn(*args, **kwargs)
        return asyncio.run_coroutine_threadsafe(_do(), self.loop).result(10)

    def stop(self) -> None:
        for w in list(self.server.watchers):
            self.loop.call_soon_threadsafe(w.queue.put_nowait, ("ERROR", ApiError(
                410, "Expired", "server stopping").status()))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
