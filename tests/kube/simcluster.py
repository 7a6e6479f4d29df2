"""A simulated GKE cluster that plays scheduler, kubelet, StatefulSet/Workspace controllers and the
Pod Snapshot agent against any Kubernetes API (the test server or a real kube-apiserver).
(One file, over 400 lines, on purpose: the controllers it plays act on one shared cluster state.)

It only talks through the official client with its own (admin) credentials, polling a namespace,
so the same simulation drives both test tiers. Every fault the product must survive is a switch:

- `nodes`: GPU nodes `{name: (model, count)}`; `add_node()` at any time ("capacity appears").
- `trigger_outcome`: "complete" | "failed" | "error"; `upload_outcome`: "ready" | "failed" | "hang";
  `upload_s`: seconds a snapshot stays AwaitingCheckpoint.
- `restore_mode`: "auto" (PodRestored=True when the node's GPU model and the distilled pod spec match
  the snapshot's; otherwise a cold start with GKE's Warning event) | "fail" (PodRestored=False) |
  "crash" (the restore itself crashes: CrashLoopBackOff, as in gke-labs/pod-migration issue 15) |
  "skip" (GKE skips a matching restore, e.g. a newer node version: pod-migration issue 13).
- `image_pull_fails`: containers wait in ImagePullBackOff.
- `stuck_deleting`: snapshots keep their finalizer.
- Pods with `spec.schedulingGates` stay PodScheduled=False/SchedulingGated.

Kubeflow Notebooks v2 and the GKE Workspaces add-on are played as the real controllers behave:

- the Workspace controller runs each Workspace's pod as ServiceAccount `ws-<name>`
  (generateServiceAccountName / generateStatefulSet) and writes the whole WorkspaceStatus
  (generateWorkspaceStatus + Status().Update of the Go struct, kubeflow/notebooks notebooks-v2
  workspace_controller.go), so a status the real CRD requires is always complete;
- the add-on decides who it manages like snapshotEnabled (gke-labs/workspaces
  providers/gke/internal/snapshot/cache.go): an explicit "false" on the Workspace, then a TPU
  podConfig, then the Workspace's opt-in, then the WorkspaceKind's;
- its pod webhook (webhook.go mutatePod, on Pod CREATE) adds the readiness gate
  podsnapshot.gke.kubeflow.org/active once, and `podsnapshot.gke.io/ps-name` from the Workspace's
  last-checkpoint-name, to the pods of the Workspaces it manages; the add-on sets that condition
  True while the pod is active and False at once when a pause begins, and the kubelet keeps the pod
  out of Ready until it is True (`readiness`); its trigger follows `gkw_settle_s` (3 s) later;
- a StatefulSet claims pods by its selector (releases one that stops matching, adopts a matching
  orphan) and re-creates a Succeeded or Failed pod (stateful_set_control.go processReplica);
- a ps-name that names no snapshot is recorded in `pinned_missing`, and the pod starts cold or,
  with `pinned_missing_outcome = "fail"`, fails: GKE's own handling of it is not documented.
- the Workspace's StatefulSet is found by its label and, with `generate_names`, named as
  upstream does (generateStatefulSet: GenerateName "ws-<name>-"); the add-on's trigger targets
  `<statefulset>-0`; its one container is "main" (workspacePodTemplateContainerName).
- the add-on's Workspace webhook answers a pause at admission on the test server (`admit_on`,
  which the tier-1 fixture installs); against a real kube-apiserver (tier 2) it runs in the
  reconcile loop instead, a moment after the pause was stored.
Not modelled by default: `generate_names` is off because older tests name the pod `ws-<name>-0`
before it exists.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import secrets
import threading
import time
from datetime import datetime, timezone
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

G, V = "podsnapshot.gke.io", "v1"
KF, KFV = "kubeflow.org", "v1beta1"
GPU = "nvidia.com/gpu"
TPU = "google.com/tpu"
WS_LABEL = "notebooks.kubeflow.org/workspace-name"
PS_NAME = "podsnapshot.gke.io/ps-name"
FINALIZER = "podsnapshot.gke.io/cleanup"
SIM = "sim.test/"
GKW = "podsnapshot.gke.kubeflow.org/"


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cond(obj: dict, ctype: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def mkcond(ctype: str, status: str, reason: str = "", message: str = "") -> dict:
    c = {"type": ctype, "status": status, "lastTransitionTime": now_iso()}
    if reason:
        c["reason"] = reason
    if message:  # never an empty string: the client sends it as null, which a CRD schema rejects
        c["message"] = message
    return c


def set_cond(conds: list[dict], c: dict) -> list[dict]:
    return [x for x in conds if x.get("type") != c["type"]] + [c]


SA_TOKEN_PREFIX = "kube-api-access-"


def spec_hash(pod: dict) -> str:
    """GKE's distilled pod spec, simulated: what the containers run and mount. The per-pod
    service-account token volume is left out: its name is random per pod (ServiceAccount
    admission), and restores work on real clusters, so GKE cannot be hashing it."""
    spec = pod.get("spec") or {}
    data = [{k: c.get(k) for k in ("image", "command", "args", "workingDir")} |
            {"volumeMounts": [m for m in c.get("volumeMounts") or []
                              if not m.get("name", "").startswith(SA_TOKEN_PREFIX)]}
            for c in spec.get("containers") or []]
    volumes = [v for v in spec.get("volumes") or [] if not v["name"].startswith(SA_TOKEN_PREFIX)]
    return hashlib.sha256(json.dumps([data, volumes], sort_keys=True).encode()
                          ).hexdigest()[:12]


def _cname(pod: dict) -> str:
    return ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name", "main")


def _image(pod: dict) -> str:
    return ((pod.get("spec") or {}).get("containers") or [{}])[0].get("image", "")


def has_gate(pod: dict) -> bool:
    return any(g.get("conditionType") == GKW + "active"
               for g in (pod.get("spec") or {}).get("readinessGates") or [])


def selector_match(sel: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in ((sel or {}).get("matchLabels") or {}).items())


def ws_service_account(workspace: str) -> str:
    """workspace_controller.go generateServiceAccountName (short names: no hash suffix)."""
    return f"ws-{workspace}"


def workspace_status(name: str, old: dict, state: str, message: str, paused: bool,
                     pod: dict | None) -> dict:
    """The whole WorkspaceStatus as generateWorkspaceStatus writes it (workspace_controller.go):
    pauseTime set while paused, podTemplatePod with the ServiceAccount, lastRunningTime on the way
    into Running. The v1.20 test apiserver reads "" in a custom resource as null and rejects it,
    so fields the controller would leave "" (a missing pod's name) get a non-empty value."""
    now_ms = int(time.time() * 1000)
    pod_spec = (pod or {}).get("spec") or {}
    running_since = old.get("lastRunningTime") or 0
    if state == "Running" and (old.get("state") != "Running" or not running_since):
        running_since = now_ms
    return {
        "state": state, "stateMessage": message,
        "pauseTime": (old.get("pauseTime") or now_ms) if paused else 0,
        "lastRunningTime": running_since, "pendingRestart": False,
        "activity": old.get("activity") or {"lastActivity": 0, "lastUpdate": 0},
        "podTemplateOptions": old.get("podTemplateOptions") or {"imageConfig": {},
                                                                "podConfig": {}},
        "podTemplatePod": {"name": (pod or {}).get("metadata", {}).get("name") or f"ws-{name}-0",
                           "nodeName": pod_spec.get("nodeName") or "none",
                           "serviceAccountName": ws_service_account(name),
                           "containers": [{"name": c["name"]}
                                          for c in pod_spec.get("containers") or []]}}


def gpu_request(pod: dict) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        total += int((res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU) or 0)
    return total


class SimCluster:
    def __init__(self, api_client: client.ApiClient, namespace: str = "user-ns",
                 nodes: dict[str, tuple[str, int]] | None = None, tick: float = 0.05) -> None:
        self.api = api_client
        self.ns = namespace
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.nodes: dict[str, tuple[str, int]] = dict(nodes or {})
        self.tick = tick
        self.trigger_outcome = "complete"
        self.trigger_message = "checkpoint failed: CUDA checkpoint returned an error"
        self.upload_outcome = "ready"
        self.upload_s = 0.2
        self.restore_mode = "auto"
        self.stuck_deleting = False
        self.restored_delay = 0.0  # PodRestored comes this long after the pod is Running
        self.image_pull_fails = False
        self.cold_start_events = True  # GKE's Warning event when it skips a restore
        self._pending_restored: dict[str, tuple[float, dict]] = {}
        self.snapshots_created = 0
        self.restores: list[tuple[str, str]] = []  # (pod, snapshot) restored live
        self.pinned_missing: list[str] = []  # pods started with a ps-name of no Ready snapshot
        # what such a pod does (GKE does not say): "cold" (starts without a restore) | "fail"
        self.pinned_missing_outcome = "cold"
        self.failed_creates: list[str] = []  # a StatefulSet's pod name held by a pod it lost
        # Kubeflow names a Workspace's StatefulSet with generateName "ws-<name>-" (so its pod is
        # ws-<name>-<5 random>-0); off, the fixed "ws-<name>" the older tests name pods by
        self.generate_names = False
        self.gkw_settle_s = 3.0  # the add-on's wait between holding a pause and its trigger
        self._gkw_settle: dict[str, float] = {}
        self._gkw_admitted: set[str] = set()  # paused answered at admission (admit_on)
        # The add-on's Workspace webhook takes this long between its own write of the pod's
        # readiness condition and its answer, after which the API server stores the Workspace.
        self.gkw_webhook_latency = 0.3
        # (trigger name, checkpoint-started-at stamp) of every trigger the add-on created
        self.gkw_triggers_made: list[tuple[str, str | None]] = []
        # pauses the webhook held again while the Workspace was already Checkpointing
        self.gkw_held_again = 0
        self.log: list[str] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="simcluster")

    # -- control --
    def start(self) -> SimCluster:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def add_node(self, name: str, model: str, count: int = 1) -> None:
        with self._lock:
            self.nodes[name] = (model, count)

    def node_model(self, node: str | None) -> str | None:
        return self.nodes.get(node or "", (None, 0))[0]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 (keep simulating; tests look at .errors)
                body = getattr(e, "body", None)
                self.errors.append(f"{type(e).__name__}: {body or e}"[:400])
            self._stop.wait(self.tick)

    # -- API helpers (dicts) --
    @staticmethod
    def _raw(fn, *args, **kw) -> Any:
        """Raw JSON (the typed models are strict about fields the servers fill differently)."""
        return json.loads(fn(*args, _preload_content=False, **kw).data)

    def pods(self) -> list[dict]:
        return self._raw(self.core.list_namespaced_pod, self.ns).get("items") or []

    def cr(self, plural: str, group: str = G, version: str = V) -> list[dict]:
        return self.custom.list_namespaced_custom_object(group, version, self.ns, plural)["items"]

    def patch_cr_status(self, plural: str, name: str, status: dict, group: str = G,
                        version: str = V) -> None:
        self.custom.patch_namespaced_custom_object_status(group, version, self.ns, plural, name,
                                                          {"status": status})

    def patch_pod_status(self, name: str, status: dict) -> None:
        # A pod deleted since this step listed it: the kubelet's status manager drops the
        # update ("pod has been deleted"), it is not an error (pkg/kubelet/status).
        try:
            self.core.patch_namespaced_pod_status(name, self.ns, {"status": status})
        except ApiException as e:
            if e.status != 404:
                raise

    def create_pod(self, body: dict) -> bool:
        """Create a pod as the API server admits it (the add-on's webhook first); False when
        its name is taken (409 AlreadyExists)."""
        body = self.gkw_pod_webhook(body)
        try:
            self.core.create_namespaced_pod(self.ns, body)
        except ApiException as e:
            if e.status != 409:
                raise
            return False
        return True

    def delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise

    # -- one simulation step --
    def step(self) -> None:
        self.workspace_controller()
        self.statefulset_controller()
        pods = self.pods()
        self.kubelet(pods)
        self.readiness(self.pods())
        self.scheduler(pods)
        self.snapshot_agent()

    def workspace_controller(self) -> None:
        try:
            workspaces = self.cr("workspaces", KF, KFV)
        except ApiException:
            return
        for ws in workspaces:
            name = ws["metadata"]["name"]
            if self.gkw_addon(ws):
                continue
            paused = bool((ws.get("spec") or {}).get("paused"))
            want = 0 if paused else 1
            sts = self.workspace_statefulset(name)
            if sts is None:
                tmpl = copy.deepcopy(ws.get("metadata", {}).get("annotations", {}).get(
                    SIM + "pod-template") or "{}")
                tmpl = json.loads(tmpl) if isinstance(tmpl, str) else tmpl
                # generateStatefulSet names its one container "main"
                # (workspacePodTemplateContainerName)
                spec = tmpl or {"containers": [{"name": "main", "image": "jupyter:1",
                                                "resources": {"limits": {GPU: "1"}}}]}
                # generateStatefulSet: the pod runs as the Workspace's own ServiceAccount
                spec.setdefault("serviceAccountName", ws_service_account(name))
                # generateStatefulSet: GenerateName generateNamePrefix(name) = "ws-<name>-"
                # (upstream); `generate_names` off: the fixed name "ws-<name>"
                naming = ({"generateName": f"ws-{name}-"} if self.generate_names
                          else {"name": f"ws-{name}"})
                body = {"metadata": {**naming, "labels": {WS_LABEL: name},
                                     "ownerReferences": [{
                                         "apiVersion": f"{KF}/{KFV}", "kind": "Workspace",
                                         "name": name, "uid": ws["metadata"]["uid"],
                                         "controller": True}]},
                        "spec": {"replicas": want, "serviceName": f"ws-{name}",
                                 "selector": {"matchLabels": {WS_LABEL: name}},
                                 "template": {"metadata": {"labels": {WS_LABEL: name}},
                                              "spec": spec}}}
                self.apps.create_namespaced_stateful_set(self.ns, body)
                continue
            sts_name = sts["metadata"]["name"]
            if (sts.get("spec") or {}).get("replicas") != want:
                self.apps.patch_namespaced_stateful_set(sts_name, self.ns,
                                                        {"spec": {"replicas": want}})
            pod = next((p for p in self.pods() if p["metadata"]["name"] == f"{sts_name}-0"), None)
            state, msg = "Paused" if paused else "Pending", ""
            if pod:
                sched = cond(pod, "PodScheduled")
                if sched and sched.get("reason") == "Unschedulable":
                    state, msg = "Error", f"Workspace Pod is unschedulable: {sched.get('message')}"
                elif (pod.get("status") or {}).get("phase") == "Running":
                    state = "Running"
                elif pod["metadata"].get("deletionTimestamp"):
                    state = "Terminating"
            st = ws.get("status") or {}
            msg = msg or f"Workspace is {state}"
            if st.get("state") != state or st.get("stateMessage") != msg:
                self.patch_cr_status("workspaces", name, workspace_status(
                    name, st, state, msg, paused, pod), KF, KFV)

    def gkw_addon(self, ws: dict) -> bool:
        """GKE Workspaces' snapshot add-on: paused false->true while Running becomes a pod
        snapshot first (webhook + reconciler, as in gke-labs/workspaces). True = handled now."""
        ann = ws["metadata"].get("annotations") or {}
        if not self.addon_manages(ws):
            return False
        name, state = ws["metadata"]["name"], ann.get(GKW + "checkpoint-state")
        paused = bool((ws.get("spec") or {}).get("paused"))
        pod_name = self.workspace_pod_name(name)
        running = any(p["metadata"]["name"] == pod_name and
                      (p.get("status") or {}).get("phase") == "Running" for p in self.pods())

        def patch(body: dict) -> None:
            self.custom.patch_namespaced_custom_object(KF, KFV, self.ns, "workspaces", name, body,
                                                       _content_type="application/merge-patch+json")

        # reconcileWorkspace (reconcile.go) ensures the policy (policyNameFor: ws-<name>-policy)
        # on every pass of an enabled Workspace, before any pause.
        policy = {"apiVersion": f"{G}/{V}", "kind": "PodSnapshotPolicy",
                  "metadata": {"name": f"ws-{name}-policy"},
                  "spec": {"selector": {"matchLabels": {WS_LABEL: name}},
                           "storageConfigName": "kubeflow-pod-snapshot-storage-config",
                           "triggerConfig": {"type": "manual", "postCheckpoint": "stop"},
                           "retentionConfig": {"lastAccessTimeout": "7d"}}}
        try:
            self.custom.create_namespaced_custom_object(G, V, self.ns, "podsnapshotpolicies",
                                                        policy)
        except ApiException as e:
            if e.status != 409:
                raise
        pod = next((p for p in self.pods() if p["metadata"]["name"] == pod_name), None)
        if paused and running and state != "Ready":
            # (only the add-on's own paused=true at Ready passes: a pause while Checkpointing is
            # held again and re-stamped, webhook.go mutateWorkspace)
            # the webhook: hold the pod, start checkpointing, and take the pod out of the
            # Service at once (readiness condition active=False); the trigger comes after the
            # settle (reconcile.go waits ~3 s for the pod to drain first)
            patch({"spec": {"paused": False}, "metadata": {"annotations": {
                GKW + "checkpoint-state": "Checkpointing",
                GKW + "checkpoint-started-at": now_iso()}}})
            self._gkw_settle[name] = time.monotonic() + self.gkw_settle_s
            self._set_active(pod, "False", "Checkpointing")
            return True
        if state is None and running and pod is not None and (
                cond(pod, "ContainersReady") or {}).get("status") == "True":
            # reconcileActive (inferred: the add-on is what makes its readiness gate True):
            # a running Workspace with no checkpoint in flight is in the Service
            self._set_active(pod, "True", "Active")
        if state == "Ready" and not paused:  # resume: the webhook marks it Restoring
            patch({"metadata": {"annotations": {GKW + "checkpoint-state": "Restoring"}}})
            return False
        if state == "Restoring" and running and pod is not None and (
                cond(pod, "ContainersReady") or {}).get("status") == "True":
            # reconcileActive: only a pod that is ready (apart from the add-on's own gate)
            # ends the restore; a crashing restore keeps the Workspace pinned to the snapshot
            self._set_active(pod, "True", "Restored")
            # the reconciler: snapshots are single-use; clear the state
            trig = f"ws-{name}-trigger"
            for s in self.cr("podsnapshots"):
                if (s["metadata"].get("labels") or {}).get("gke-pod-snapshot-triggered-by") == trig:
                    self.custom.delete_namespaced_custom_object(G, V, self.ns, "podsnapshots",
                                                                s["metadata"]["name"])
            try:  # then the trigger, then the annotations
                self.custom.delete_namespaced_custom_object(G, V, self.ns,
                                                            "podsnapshotmanualtriggers", trig)
            except ApiException as e:
                if e.status != 404:
                    raise
            patch({"metadata": {"annotations": {GKW + "checkpoint-state": None,
                                                GKW + "last-checkpoint-name": None,
                                                GKW + "checkpoint-started-at": None}}})
            return False
        if state == "Checkpointing" and name in self._gkw_admitted:
            # the Workspace webhook answered the pause at admission (admit_on): the reconciler
            # takes the pod out of the Service and settles before the trigger
            self._gkw_admitted.discard(name)
            self._gkw_settle[name] = time.monotonic() + self.gkw_settle_s
            self._set_active(pod, "False", "Checkpointing")
            return True
        if state == "Checkpointing":
            # reconcileCheckpointing (reconcile.go): after the settle, a missing trigger is
            # created, stamped with the Workspace's checkpoint-started-at and owned by the
            # Workspace; one stamped otherwise is stale (a pause since) and deleted, the next
            # pass creating the new one. Every pass does this, so a trigger deleted while the
            # Workspace is still Checkpointing comes back.
            due = self._gkw_settle.get(name)
            if due is not None:
                if time.monotonic() < due:
                    return True
                del self._gkw_settle[name]
            stamp = ann.get(GKW + "checkpoint-started-at")
            trig_name = f"ws-{name}-trigger"
            try:
                trig = self.custom.get_namespaced_custom_object(
                    G, V, self.ns, "podsnapshotmanualtriggers", trig_name)
            except ApiException as e:
                if e.status != 404:
                    return True
                self.custom.create_namespaced_custom_object(
                    G, V, self.ns, "podsnapshotmanualtriggers", {
                        "apiVersion": f"{G}/{V}", "kind": "PodSnapshotManualTrigger",
                        "metadata": {"name": trig_name, "annotations": {
                            GKW + "checkpoint-started-at": stamp},
                            "ownerReferences": [{
                                "apiVersion": f"{KF}/{KFV}", "kind": "Workspace",
                                "name": name, "uid": ws["metadata"]["uid"],
                                "controller": False, "blockOwnerDeletion": True}]},
                        "spec": {"targetPod": pod_name}})
                self.gkw_triggers_made.append((trig_name, stamp))
                return True
            if (trig["metadata"].get("annotations") or {}).get(
                    GKW + "checkpoint-started-at") != stamp:
                self.custom.delete_namespaced_custom_object(
                    G, V, self.ns, "podsnapshotmanualtriggers", trig_name)
                return True
            snap = ((trig.get("status") or {}).get("snapshotCreated") or {}).get("name")
            ready = snap and any(s["metadata"]["name"] == snap and cond(s, "Ready") and
                                 cond(s, "Ready").get("status") == "True"
                                 for s in self.cr("podsnapshots"))
            if ready:  # no branch for a failed trigger: the add-on's known gap
                patch({"spec": {"paused": True}, "metadata": {"annotations": {
                    GKW + "checkpoint-state": "Ready", GKW + "last-checkpoint-name": snap,
                    GKW + "checkpoint-started-at": None}}})
                # the Workspace controller acts on paused=true at once (this very step), so
                # the StatefulSet is scaled to 0 before it could re-create the stopped pod
                ws.setdefault("spec", {})["paused"] = True
                return False
            return True
        return False

    def workspace_statefulset(self, workspace: str) -> dict | None:
        """The Workspace's StatefulSet, found as the controller finds it: by its label, not by a
        name (upstream names it with generateName)."""
        items = self._raw(self.apps.list_namespaced_stateful_set, self.ns,
                          label_selector=f"{WS_LABEL}={workspace}").get("items") or []
        return items[0] if items else None

    def workspace_pod_name(self, workspace: str) -> str | None:
        """`<statefulset>-0`: the pod the add-on's trigger targets (spec.targetPod)."""
        sts = self.workspace_statefulset(workspace)
        return f"{sts['metadata']['name']}-0" if sts else None

    def admit_on(self, server: Any) -> None:
        """Tier 1: run the add-on's Workspace webhook (webhook.go mutateWorkspace, UPDATE) at
        admission on the test server, as upstream does: a managed Workspace's paused
        false->true while its pod runs is stored as paused=false with checkpoint-state
        Checkpointing, so no client ever reads paused=true before the snapshot is Ready. A real
        kube-apiserver would call the webhook over TLS; tier 2 keeps the reconcile-loop answer."""
        wsk = server.kind_for(KF, KFV, "workspacekinds")
        pods = server.kind_for("", "v1", "pods")

        def held(kind: Any, ns: str | None, old: dict, new: dict, sub: str | None) -> list:
            """The Workspace's running pods when this update is a pause the webhook holds: a
            paused false->true of a managed Workspace (every one but the add-on's own
            paused=true at Ready: one while Checkpointing is held again and re-stamped)."""
            if kind.plural != "workspaces" or sub is not None or ns != self.ns:
                return []
            ann = (new.get("metadata") or {}).get("annotations") or {}
            if (old.get("spec") or {}).get("paused") or not (new.get("spec") or {}).get(
                    "paused") or ann.get(GKW + "checkpoint-state") == "Ready":
                return []
            name = new["metadata"]["name"]
            running = [p for p in server.items(pods, ns, None, None)
                       if (p.get("metadata", {}).get("labels") or {}).get(WS_LABEL) == name
                       and (p.get("status") or {}).get("phase") == "Running"]
            if not running or not self.addon_manages(
                    new, kind_of=lambda n: server.get(wsk, None, n)):
                return []
            return running

        async def before(kind: Any, ns: str | None, old: dict, new: dict,
                         sub: str | None) -> None:
            # webhook.go mutateWorkspace: setPodActiveCondition(False) is the webhook's own
            # UpdateStatus of the pod, done before it answers; the API server stores the
            # Workspace only after the answer. A client watching the pod sees the condition
            # drop while the Workspace still reads as it was.
            for pod in held(kind, ns, old, new, sub):
                if has_gate(pod):
                    body = copy.deepcopy(pod)
                    body["status"]["conditions"] = set_cond(
                        body["status"].get("conditions") or [],
                        mkcond(GKW + "active", "False", "CheckpointingInProgress"))
                    server.update(pods, ns, pod["metadata"]["name"], body, "status",
                                  check_rv=False)
                await asyncio.sleep(self.gkw_webhook_latency)

        def mutate(kind: Any, ns: str | None, old: dict, new: dict, sub: str | None) -> dict:
            if not held(kind, ns, old, new, sub):
                return new
            ann = (new.get("metadata") or {}).get("annotations") or {}
            if ann.get(GKW + "checkpoint-state") == "Checkpointing":
                self.gkw_held_again += 1  # re-stamped: a trigger made already is stale now
            new = copy.deepcopy(new)
            new["spec"]["paused"] = False
            new["metadata"]["annotations"] = {**ann, GKW + "checkpoint-state": "Checkpointing",
                                              GKW + "checkpoint-started-at": now_iso()}
            self._gkw_admitted.add(new["metadata"]["name"])
            return new

        def trigger_deleted(kind: Any, obj: dict) -> None:
            # The add-on's informers re-enqueue the Workspace that owns a deleted trigger at
            # once (informers.go), and reconcileCheckpointing creates a missing trigger while the
            # Workspace reads Checkpointing (reconcile.go): a trigger deleted then comes back
            # before anyone's next request.
            if kind.plural != "podsnapshotmanualtriggers":
                return
            owner = next((r for r in obj["metadata"].get("ownerReferences") or []
                          if r.get("kind") == "Workspace"), None)
            ns = obj["metadata"].get("namespace")
            if owner is None or ns != self.ns:
                return
            try:
                ws = server.get(server.kind_for(KF, KFV, "workspaces"), ns, owner["name"])
            except Exception:  # noqa: BLE001 (the Workspace is gone: nothing to reconcile)
                return
            stamp = ((ws["metadata"].get("annotations") or {}).get(
                GKW + "checkpoint-started-at"))
            if (ws["metadata"].get("annotations") or {}).get(
                    GKW + "checkpoint-state") != "Checkpointing":
                return
            if stamp and (datetime.now(timezone.utc) - datetime.fromisoformat(
                    stamp.replace("Z", "+00:00"))).total_seconds() < self.gkw_settle_s:
                return  # still settling: the reconcile loop creates it after the settle
            body = copy.deepcopy({k: obj[k] for k in ("apiVersion", "kind", "spec")})
            body["metadata"] = {"name": obj["metadata"]["name"], "annotations": {
                GKW + "checkpoint-started-at": stamp},
                "ownerReferences": obj["metadata"]["ownerReferences"]}
            server.create(kind, ns, body)
            self.gkw_triggers_made.append((obj["metadata"]["name"], stamp))

        server.before_update.append(before)
        server.on_delete.append(trigger_deleted)
        server.on_update.append(mutate)

    def _set_active(self, pod: dict | None, status: str, reason: str) -> None:
        """The add-on's pod readiness condition (snapshot.go ReadinessGateConditionType)."""
        if pod is None or not has_gate(pod):
            return
        c = cond(pod, GKW + "active")
        if c is None or c.get("status") != status:
            self.patch_pod_status(pod["metadata"]["name"], {"conditions": set_cond(
                (pod.get("status") or {}).get("conditions") or [],
                mkcond(GKW + "active", status, reason))})

    def readiness(self, pods: list[dict]) -> None:
        """The kubelet's Ready: containers ready and every readiness gate's condition True
        (pkg/kubelet/status/generate.go GeneratePodReadyCondition); a pod that is not Ready is
        left out of its Service's endpoints."""
        for p in pods:
            st = p.get("status") or {}
            if st.get("phase") != "Running" or not (p.get("spec") or {}).get("readinessGates"):
                continue
            containers = cond(p, "ContainersReady")
            want = "True" if containers and containers.get("status") == "True" and all(
                (cond(p, g["conditionType"]) or {}).get("status") == "True"
                for g in p["spec"]["readinessGates"]) else "False"
            ready = cond(p, "Ready")
            if ready is None or ready.get("status") != want:
                reason = "" if want == "True" else "ReadinessGatesNotReady"
                self.patch_pod_status(p["metadata"]["name"], {"conditions": set_cond(
                    st.get("conditions") or [], mkcond("Ready", want, reason))})

    def addon_manages(self, ws: dict, kind_of: Any = None) -> bool:
        """The add-on's snapshotEnabled (cache.go), the kind read live as its cache would
        (`kind_of(name)`: how to read it; default the API)."""
        ann = ws["metadata"].get("annotations") or {}

        def opted(a: dict) -> bool:
            return any(str(a.get(k, "")).lower() == "true"
                       for k in (GKW + "enabled", "pod-migration.gke.io/enabled"))

        if str(ann.get(GKW + "enabled", "")).lower() == "false":
            return False
        kind_name = (ws.get("spec") or {}).get("kind") or ""
        if not kind_name:
            return False
        try:
            kind = (kind_of or (lambda n: self.custom.get_cluster_custom_object(
                KF, KFV, "workspacekinds", n)))(kind_name)
        except Exception:  # noqa: BLE001 (ApiException, or the test server's ApiError)
            return opted(ann)  # the kind unreadable: the Workspace's own annotation
        pc = ((ws.get("spec") or {}).get("podTemplate") or {}).get("options", {}).get("podConfig")
        values = ((kind.get("spec") or {}).get("podTemplate") or {}).get("options", {}).get(
            "podConfig", {}).get("values") or []
        for v in values:  # podConfigRequestsTPU
            res = (v.get("spec") or {}).get("resources") or {}
            if v.get("id") == pc and any(TPU in (res.get(f) or {})
                                         for f in ("limits", "requests")):
                return False
        return opted(ann) or opted(kind["metadata"].get("annotations") or {})

    def gkw_pod_webhook(self, body: dict) -> dict:
        """webhook.go mutatePod on Pod CREATE: a managed Workspace's pod gets runtimeClassName
        gvisor, the readiness gate (once) and ps-name = the Workspace's last-checkpoint-name;
        TPU pods are left alone. (Not modelled: the IPC ConfigMap it mounts.)"""
        meta = body.get("metadata") or {}
        ws_name = (meta.get("labels") or {}).get(WS_LABEL)
        if not ws_name:
            return body
        spec = body.get("spec") or {}
        for c in spec.get("containers") or []:
            res = c.get("resources") or {}
            if any(TPU in (res.get(f) or {}) for f in ("limits", "requests")):
                return body
        try:
            ws = self.custom.get_namespaced_custom_object(KF, KFV, self.ns, "workspaces",
                                                          ws_name)
        except ApiException:
            return body
        if not self.addon_manages(ws):
            return body
        body = copy.deepcopy(body)
        body["spec"]["runtimeClassName"] = "gvisor"  # GKE Sandbox, which pod snapshots need
        gates = body["spec"].setdefault("readinessGates", [])
        if not any(g.get("conditionType") == GKW + "active" for g in gates):
            gates.append({"conditionType": GKW + "active"})
        last = (ws["metadata"].get("annotations") or {}).get(GKW + "last-checkpoint-name")
        if last:
            body["metadata"].setdefault("annotations", {})[PS_NAME] = last
        return body

    def statefulset_controller(self) -> None:
        """kubernetes pkg/controller/statefulset (one replica, ordinal 0): the pods it claims
        (ClaimPods, pkg/controller/controller_ref_manager.go: an owned pod that no longer matches
        the selector is released, its ownerReference removed; a matching orphan is adopted),
        then stateful_set_control.go: create `<name>-0` when missing (AlreadyExists when a pod
        it does not claim holds the name: recorded in `failed_creates`), delete it when scaled
        to 0, and delete a Succeeded or Failed one to re-create it (RecreatingTerminatedPod)."""
        for sts in self._raw(self.apps.list_namespaced_stateful_set, self.ns).get("items") or []:
            name, uid = sts["metadata"]["name"], sts["metadata"]["uid"]
            pod_name = f"{name}-0"
            replicas = (sts.get("spec") or {}).get("replicas", 1)
            sel = (sts.get("spec") or {}).get("selector") or {}
            claimed = []
            for p in self.pods():
                meta = p["metadata"]
                owner = next((r for r in meta.get("ownerReferences") or []
                              if r.get("controller")), None)
                matches = selector_match(sel, meta.get("labels") or {})
                if owner is not None and owner.get("uid") == uid:
                    if matches:
                        claimed.append(p)
                    elif not meta.get("deletionTimestamp"):
                        self.core.patch_namespaced_pod(meta["name"], self.ns, {"metadata": {
                            "ownerReferences": None}})
                        self.log.append(f"sts released {meta['name']}")
                elif owner is None and matches and not meta.get("deletionTimestamp"):
                    self.core.patch_namespaced_pod(meta["name"], self.ns, {"metadata": {
                        "ownerReferences": [self._sts_ref(sts)]}})
                    self.log.append(f"sts adopted {meta['name']}")
                    claimed.append(p)
            existing = [p for p in claimed if p["metadata"]["name"] == pod_name]
            if replicas >= 1 and not existing:
                tmpl = copy.deepcopy(sts["spec"]["template"])
                meta = tmpl.get("metadata") or {}
                meta["name"] = pod_name
                meta.setdefault("labels", {})["statefulset.kubernetes.io/pod-name"] = pod_name
                meta["ownerReferences"] = [self._sts_ref(sts)]
                tmpl["metadata"] = meta
                if self.create_pod({"apiVersion": "v1", "kind": "Pod", **tmpl}):
                    self.log.append(f"sts created {pod_name}")
                elif pod_name not in self.failed_creates:
                    self.failed_creates.append(pod_name)
            elif replicas == 0 and existing:
                self.delete_pod(pod_name)
                self.log.append(f"sts deleted {pod_name}")
            elif existing and (existing[0].get("status") or {}).get("phase") in (
                    "Succeeded", "Failed") and not existing[0]["metadata"].get(
                    "deletionTimestamp"):
                # stateful_set_control.go processReplica: a Failed or Succeeded pod is deleted
                # and re-created (RecreatingTerminatedPod), whatever stopped it
                self.delete_pod(pod_name)
                self.log.append(f"sts re-creating terminated {pod_name}")

    @staticmethod
    def _sts_ref(sts: dict) -> dict:
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"],
                "uid": sts["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    def scheduler(self, pods: list[dict]) -> None:
        used: dict[str, int] = {}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                used[node] = used.get(node, 0) + gpu_request(p)
        for p in pods:
            spec = p.get("spec") or {}
            if spec.get("nodeName") or p["metadata"].get("deletionTimestamp"):
                continue
            if spec.get("schedulingGates"):
                # kube-scheduler's SchedulingGates plugin: core/v1 PodReasonSchedulingGated.
                c = cond(p, "PodScheduled")
                if not c or c.get("reason") != "SchedulingGated":
                    self.patch_pod_status(p["metadata"]["name"], {"conditions": set_cond(
                        (p.get("status") or {}).get("conditions") or [],
                        mkcond("PodScheduled", "False", "SchedulingGated",
                               "Scheduling is blocked due to non-empty scheduling gates"))})
                continue
            need = gpu_request(p)
            want_model = (spec.get("nodeSelector") or {}).get("cloud.google.com/gke-accelerator")
            with self._lock:
                nodes = dict(self.nodes)
            chosen, short, mismatch = None, 0, 0
            for n, (model, count) in sorted(nodes.items()):
                if want_model and model != want_model:
                    mismatch += 1
                elif count - used.get(n, 0) < need:
                    short += 1
                else:
                    chosen = n
                    break
            name = p["metadata"]["name"]
            if chosen:
                try:
                    self.core.create_namespaced_pod_binding(
                        name, self.ns, {"apiVersion": "v1", "kind": "Binding",
                                        "metadata": {"name": name},
                                        "target": {"apiVersion": "v1", "kind": "Node",
                                                   "name": chosen}},
                        _preload_content=False)
                except ApiException as e:
                    if e.status != 404:
                        raise
                    continue  # deleted since the list: the scheduler forgets it
                used[chosen] = used.get(chosen, 0) + need
                conds = set_cond((p.get("status") or {}).get("conditions") or [],
                                 mkcond("PodScheduled", "True"))
                self.patch_pod_status(name, {"conditions": conds})
                self.log.append(f"bound {name} to {chosen}")
                continue
            parts = []
            if short:
                parts.append(f"{short} Insufficient {GPU}")
            if mismatch:
                parts.append(f"{mismatch} node(s) didn't match Pod's node affinity/selector")
            msg = f"0/{len(nodes)} nodes are available: {', '.join(parts) or 'no nodes'}."
            c = cond(p, "PodScheduled")
            if not c or c.get("reason") != "Unschedulable" or c.get("message") != msg:
                conds = set_cond((p.get("status") or {}).get("conditions") or [],
                                 mkcond("PodScheduled", "False", "Unschedulable", msg))
                self.patch_pod_status(name, {"conditions": conds, "phase": "Pending"})

    def kubelet(self, pods: list[dict]) -> None:
        for name, (due, c) in list(self._pending_restored.items()):
            pod = next((p for p in pods if p["metadata"]["name"] == name), None)
            if pod is None:
                del self._pending_restored[name]
            elif time.time() >= due:
                del self._pending_restored[name]
                self.patch_pod_status(name, {"conditions": set_cond(
                    (pod.get("status") or {}).get("conditions") or [], c)})
        for p in pods:
            meta, spec, st = p["metadata"], p.get("spec") or {}, p.get("status") or {}
            name = meta["name"]
            if meta.get("deletionTimestamp"):
                self.delete_pod(name)
                continue
            if not spec.get("nodeName") or st.get("phase") != "Pending":
                continue
            if any((cs.get("state") or {}).get("waiting") for cs in
                   st.get("containerStatuses") or []):
                continue  # reported already; the kubelet keeps backing off
            conds = st.get("conditions") or []
            snap = self.snapshot_for(p)
            if snap is None and name in self.pinned_missing and PS_NAME in (
                    meta.get("annotations") or {}) and self.pinned_missing_outcome == "fail":
                # one reading of GKE's undocumented answer to a ps-name of no snapshot: the
                # sandbox cannot be restored and the pod fails (the text is ours)
                self.patch_pod_status(name, {
                    "phase": "Failed", "reason": "RestoreFailed",
                    "message": f"pod snapshot {meta['annotations'][PS_NAME]} not found"})
                self.log.append(f"{name} failed: pinned snapshot missing")
                continue
            if self.image_pull_fails:
                self._container_waiting(p, conds, "ImagePullBackOff",
                                        f'Back-off pulling image "{_image(p)}"', None)
                continue
            if snap is not None and self.restore_mode == "crash":
                self._container_waiting(
                    p, conds, "CrashLoopBackOff",
                    f"back-off 10s restarting failed container={_cname(p)} pod={name}_{self.ns}"
                    f"({meta['uid']})",
                    {"exitCode": 128, "reason": "StartError",
                     "message": "failed to create containerd task: failed to start shim task: "
                     "OCI runtime restore failed: starting container: failed to load kernel: "
                     "vfs.CompleteRestore() failed: failed to complete restore for filesystem "
                     'type "9p": failed to walk "journal.jsonl" of type 0100000 in mount '
                     '"main:/home/jovyan": no such file or directory',
                     "startedAt": "1970-01-01T00:00:00Z", "finishedAt": now_iso()})
                continue
            if snap is not None:
                sann = snap["metadata"].get("annotations") or {}
                if self.restore_mode == "fail":
                    conds = set_cond(conds, mkcond("PodRestored", "False", "RestoreFailed",
                                                   "restore failed: driver mismatch"))
                elif (self.restore_mode != "skip"
                      and sann.get(SIM + "gpu-model") == self.node_model(spec["nodeName"])
                      and sann.get(SIM + "spec-hash") == spec_hash(p)):
                    sname = snap["metadata"]["name"]
                    restored = mkcond("PodRestored", "True", "Restored",
                                      f"Pod restored from snapshot {sname}")
                    if self.restored_delay > 0:  # memory still loading: the condition comes later
                        self._pending_restored[name] = (time.time() + self.restored_delay,
                                                        restored)
                    else:
                        conds = set_cond(conds, restored)
                    self.restores.append((name, sname))
                    self.patch_cr_status("podsnapshots", sname, {
                        **(snap.get("status") or {}), "lastAccessTime": now_iso()})
                elif self.cold_start_events:
                    # No PodRestored condition; the only API signal is this Warning event
                    # (gke-labs/pod-migration issue 13 quotes reason GKEPodSnapshotting and
                    # "falling back to a cold start of pod: ..."; the rest of the text is ours).
                    self.warn(p, "GKEPodSnapshotting",
                              f"snapshot {snap['metadata']['name']} cannot be restored on "
                              f"this node; falling back to a cold start of pod: "
                              f"{self.ns}/{name}")
            for ctype in ("Initialized", "ContainersReady", "Ready"):
                conds = set_cond(conds, mkcond(ctype, "True"))
            if spec.get("readinessGates"):  # Ready waits for the gates (readiness())
                conds = set_cond(conds, mkcond("Ready", "False", "ReadinessGatesNotReady"))
            self.patch_pod_status(name, {"phase": "Running", "conditions": conds,
                                         "startTime": now_iso(),
                                         "containerStatuses": [{
                                             "name": c["name"], "image": c.get("image", ""),
                                             "imageID": "", "ready": True, "restartCount": 0,
                                             "started": True,
                                             "state": {"running": {"startedAt": now_iso()}}}
                                             for c in spec.get("containers") or []]})
            self.log.append(f"started {name} restore={'yes' if snap else 'no'}")

    def _container_waiting(self, pod: dict, conds: list[dict], reason: str, message: str,
                           last: dict | None) -> None:
        """A container the kubelet cannot get running, as the kubelet reports it: phase Running
        (CrashLoopBackOff) or Pending (image), Ready=False/ContainersNotReady, and
        containerStatuses[].state.waiting (core/v1 ContainerStatus; reasons from kubelet
        pkg/kubelet/container/sync_result.go, pkg/kubelet/images/types.go)."""
        started = last is not None
        msg = f"containers with unready status: [{_cname(pod)}]"
        for ctype in ("ContainersReady", "Ready"):
            conds = set_cond(conds, mkcond(ctype, "False", "ContainersNotReady", msg))
        conds = set_cond(conds, mkcond("Initialized", "True"))
        status = {"name": _cname(pod), "image": _image(pod), "imageID": "", "ready": False,
                  "started": False, "restartCount": 3 if started else 0,
                  "state": {"waiting": {"reason": reason, "message": message}}}
        if last:
            status["lastState"] = {"terminated": last}
        self.patch_pod_status(pod["metadata"]["name"], {
            "phase": "Running" if started else "Pending", "conditions": conds,
            "startTime": now_iso(), "containerStatuses": [status]})
        self.log.append(f"{pod['metadata']['name']} {reason}")

    def warn(self, pod: dict, reason: str, message: str) -> None:
        """A core/v1 Event of type Warning about the pod, as `kubectl describe pod` shows it."""
        meta = pod["metadata"]
        self.core.create_namespaced_event(self.ns, {
            "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}"},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": self.ns, "uid": meta["uid"]},
            "reason": reason, "message": message, "type": "Warning", "count": 1,
            "firstTimestamp": now_iso(), "lastTimestamp": now_iso()}, _preload_content=False)

    def snapshot_for(self, pod: dict) -> dict | None:
        """The snapshot GKE would restore: ps-name, else the newest Ready one of a policy."""
        snaps = [s for s in self.cr("podsnapshots") if cond(s, "Ready")
                 and cond(s, "Ready").get("status") == "True"
                 and not s["metadata"].get("deletionTimestamp")]
        pinned = (pod["metadata"].get("annotations") or {}).get(PS_NAME)
        if pinned:
            found = next((s for s in snaps if s["metadata"]["name"] == pinned), None)
            if found is None and pod["metadata"]["name"] not in self.pinned_missing:
                # What GKE does with a ps-name naming no Ready snapshot is documented nowhere
                # (cold start, a wait, or a failed pod): the sim starts it cold and records it,
                # so a test can assert the product never makes such a pod instead of trusting
                # a clean cold start.
                self.pinned_missing.append(pod["metadata"]["name"])
            return found
        labels = pod["metadata"].get("labels") or {}
        policies = {p["metadata"]["name"] for p in self.cr("podsnapshotpolicies")
                    if selector_match(p["spec"].get("selector"), labels)}
        mine = [s for s in snaps if (s.get("spec") or {}).get("policyName") in policies]
        mine.sort(key=lambda s: s["metadata"].get("annotations", {}).get(SIM + "started", ""))
        return mine[-1] if mine else None

    def snapshot_agent(self) -> None:
        pods = {p["metadata"]["name"]: p for p in self.pods()}
        policies = self.cr("podsnapshotpolicies")
        for t in self.cr("podsnapshotmanualtriggers"):
            if cond(t, "Triggered") is not None or t["metadata"].get("deletionTimestamp"):
                continue
            tname = t["metadata"]["name"]
            target = pods.get((t.get("spec") or {}).get("targetPod", ""))
            if target is None or (target.get("status") or {}).get("phase") != "Running":
                self._trigger_done(tname, "False", "Failed", "target pod not found or not running")
                continue
            pol = next((p for p in policies if (p["spec"].get("triggerConfig") or {}).get("type")
                        == "manual" and selector_match(p["spec"].get("selector"),
                                                       target["metadata"].get("labels") or {})),
                       None)
            if pol is None:
                self._trigger_done(tname, "False", "Failed",
                                   "no PodSnapshotPolicy with a manual trigger selects the pod")
                continue
            if self.trigger_outcome == "hold":  # the agent has not picked it up yet
                continue
            if self.trigger_outcome != "complete":
                reason = "Failed" if self.trigger_outcome == "failed" else "Error"
                self._trigger_done(tname, "False", reason, self.trigger_message)
                continue
            sname = f"{tname[:50]}-{secrets.token_hex(3)}"
            body = {"apiVersion": f"{G}/{V}", "kind": "PodSnapshot",
                    "metadata": {"name": sname, "finalizers": [FINALIZER],
                                 "labels": {"gke-pod-snapshot-triggered-by": tname},
                                 "annotations": {
                                     SIM + "gpu-model": self.node_model(
                                         target["spec"].get("nodeName")) or "",
                                     SIM + "spec-hash": spec_hash(target),
                                     SIM + "pod-uid": target["metadata"]["uid"],
                                     SIM + "pod": target["metadata"]["name"],
                                     SIM + "started": f"{time.time():.3f}",
                                     SIM + "post": pol["spec"]["triggerConfig"].get(
                                         "postCheckpoint", "resume")}},
                    "spec": {"policyName": pol["metadata"]["name"]}}
            self.custom.create_namespaced_custom_object(G, V, self.ns, "podsnapshots", body)
            self.snapshots_created += 1
            self.patch_cr_status("podsnapshots", sname, {"conditions": [
                mkcond("Ready", "False", "AwaitingCheckpoint"),
                mkcond("Checkpoint", "False", "AwaitingCheckpoint")]})
            self._trigger_done(tname, "True", "Complete", "", snapshot=sname)
            self.log.append(f"snapshot {sname} for {tname}")
        for s in self.cr("podsnapshots"):
            meta = s["metadata"]
            ann = meta.get("annotations") or {}
            if meta.get("deletionTimestamp"):
                if not self.stuck_deleting and meta.get("finalizers"):
                    self.custom.patch_namespaced_custom_object(
                        G, V, self.ns, "podsnapshots", meta["name"],
                        {"metadata": {"finalizers": None}},
                        _content_type="application/merge-patch+json")
                continue
            r = cond(s, "Ready")
            if not r or r.get("reason") != "AwaitingCheckpoint":
                continue
            pod = pods.get(ann.get(SIM + "pod", ""))
            if pod is None or pod["metadata"]["uid"] != ann.get(SIM + "pod-uid") or \
                    pod["metadata"].get("deletionTimestamp"):
                msg = "pod was deleted before the checkpoint upload finished"
                self.patch_cr_status("podsnapshots", meta["name"], {"conditions": [
                    mkcond("Ready", "False", "Failed", msg),
                    mkcond("Checkpoint", "False", "Failed", msg)]})
                continue
            if time.time() - float(ann.get(SIM + "started", "0")) < self.upload_s:
                continue
            if self.upload_outcome == "hang":
                continue
            if self.upload_outcome == "failed":
                msg = "upload to gs://bucket failed: 403 Forbidden"
                self.patch_cr_status("podsnapshots", meta["name"], {"conditions": [
                    mkcond("Ready", "False", "Failed", msg),
                    mkcond("Checkpoint", "False", "Failed", msg)]})
                continue
            self.patch_cr_status("podsnapshots", meta["name"], {"conditions": [
                mkcond("Ready", "True", "AllSnapshotsAvailable"),
                mkcond("Checkpoint", "True", "Succeeded")],
                "storageStatus": {"gcs": {"observedGCSPath": f"gs://bucket/{meta['name']}"}}})
            if ann.get(SIM + "post") == "stop":
                self.patch_pod_status(pod["metadata"]["name"], {"phase": "Succeeded"})

    def _trigger_done(self, name: str, status: str, reason: str, message: str,
                      snapshot: str | None = None) -> None:
        st: dict[str, Any] = {"conditions": [mkcond("Triggered", status, reason, message)]}
        if snapshot:
            st["snapshotCreated"] = {"name": snapshot}
        self.patch_cr_status("podsnapshotmanualtriggers", name, st)

    # -- helpers for tests --
    def wait(self, predicate, timeout: float = 10.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = predicate()
            if got:
                return got
            time.sleep(self.tick)
        raise AssertionError(f"timed out waiting for {what}; sim log: {self.log[-10:]} "
                             f"errors: {self.errors[-3:]}")
