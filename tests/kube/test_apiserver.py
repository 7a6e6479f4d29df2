"""The Kubernetes API test server speaks what the real client expects (tier 1 foundation)."""

from __future__ import annotations

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from .conftest import NS

G, V = "podsnapshot.gke.io", "v1"


def trigger(name: str, pod: str = "nb", labels: dict | None = None) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "PodSnapshotManualTrigger",
            "metadata": {"name": name, "labels": labels or {}}, "spec": {"targetPod": pod}}


def status_of(fn, *a, **kw) -> tuple[int, str]:
    try:
        fn(*a, **kw)
    except ApiException as e:
        import json
        return e.status, json.loads(e.body)["reason"]
    return 200, ""


def test_crud_errors_and_metadata(admin):
    c = client.CustomObjectsApi(admin)
    obj = c.create_namespaced_custom_object(G, V, NS, "podsnapshotmanualtriggers", trigger("t1"))
    meta = obj["metadata"]
    assert meta["namespace"] == NS and meta["uid"] and meta["generation"] == 1
    assert status_of(c.create_namespaced_custom_object, G, V, NS, "podsnapshotmanualtriggers",
                     trigger("t1")) == (409, "AlreadyExists")
    assert status_of(c.create_namespaced_custom_object, G, V, NS, "podsnapshotmanualtriggers",
                     trigger("Bad_Name")) == (422, "Invalid")
    assert status_of(c.get_namespaced_custom_object, G, V, NS, "podsnapshotmanualtriggers",
                     "nope") == (404, "NotFound")
    # stale resourceVersion in a merge patch is a 409 Conflict
    c.patch_namespaced_custom_object(G, V, NS, "podsnapshotmanualtriggers", "t1",
                                     {"metadata": {"labels": {"a": "1"}}})
    assert status_of(c.patch_namespaced_custom_object, G, V, NS, "podsnapshotmanualtriggers",
                     "t1", {"metadata": {"resourceVersion": meta["resourceVersion"],
                                         "labels": {"a": "2"}}}) == (409, "Conflict")
    # spec change bumps generation; status writes go through /status only
    upd = c.patch_namespaced_custom_object(G, V, NS, "podsnapshotmanualtriggers", "t1",
                                           {"spec": {"targetPod": "other"},
                                            "status": {"x": 1}})
    assert upd["metadata"]["generation"] == 2 and "x" not in upd.get("status", {})
    st = c.patch_namespaced_custom_object_status(G, V, NS, "podsnapshotmanualtriggers", "t1",
                                                 {"status": {"x": 1}})
    assert st["status"] == {"x": 1} and st["metadata"]["generation"] == 2
    # JSON patch
    jp = c.patch_namespaced_custom_object(G, V, NS, "podsnapshotmanualtriggers", "t1",
                                          [{"op": "replace", "path": "/spec/targetPod",
                                            "value": "nb2"}],
                                          _content_type="application/json-patch+json")
    assert jp["spec"]["targetPod"] == "nb2"


def test_selectors_and_discovery(admin, apiserver):
    c = client.CustomObjectsApi(admin)
    for i, lab in enumerate(({"ws": "a"}, {"ws": "b"}, {"other": "x"})):
        c.create_namespaced_custom_object(G, V, NS, "podsnapshotmanualtriggers",
                                          trigger(f"t{i}", labels=lab))
    names = lambda **kw: [o["metadata"]["name"] for o in c.list_namespaced_custom_object(
        G, V, NS, "podsnapshotmanualtriggers", **kw)["items"]]
    assert names(label_selector="ws=a") == ["t0"]
    assert names(label_selector="ws in (a,b)") == ["t0", "t1"]
    assert names(label_selector="!ws") == ["t2"]
    assert names(field_selector="metadata.name=t1") == ["t1"]
    kinds = {r.kind for r in c.get_api_resources(G, V).resources}
    assert {"PodSnapshot", "PodSnapshotManualTrigger"} <= kinds
    apiserver.call(apiserver.server.deny, "get", "podsnapshots")
    assert status_of(c.get_namespaced_custom_object, G, V, NS, "podsnapshots", "x")[0] == 403


def test_watch_replays_history_and_expires(admin, apiserver):
    c = client.CustomObjectsApi(admin)
    lst = c.list_namespaced_custom_object(G, V, NS, "podsnapshotmanualtriggers")
    rv = lst["metadata"]["resourceVersion"]
    c.create_namespaced_custom_object(G, V, NS, "podsnapshotmanualtriggers", trigger("w1"))
    c.delete_namespaced_custom_object(G, V, NS, "podsnapshotmanualtriggers", "w1")
    events = [(e["type"], e["object"]["metadata"]["name"]) for e in watch.Watch().stream(
        c.list_namespaced_custom_object, G, V, NS, "podsnapshotmanualtriggers",
        resource_version=rv, timeout_seconds=1)]
    assert events == [("ADDED", "w1"), ("DELETED", "w1")]
    apiserver.call(apiserver.server.expire_watches)
    with pytest.raises(ApiException) as ei:
        list(watch.Watch().stream(c.list_namespaced_custom_object, G, V, NS,
                                  "podsnapshotmanualtriggers", resource_version=rv,
                                  timeout_seconds=1))
    assert ei.value.status == 410


def test_finalizers_hold_deletion(admin):
    c = client.CustomObjectsApi(admin)
    body = {"apiVersion": f"{G}/{V}", "kind": "PodSnapshot",
            "metadata": {"name": "s1", "finalizers": ["x/y"]}, "spec": {"policyName": "p"}}
    c.create_namespaced_custom_object(G, V, NS, "podsnapshots", body)
    c.delete_namespaced_custom_object(G, V, NS, "podsnapshots", "s1")
    held = c.get_namespaced_custom_object(G, V, NS, "podsnapshots", "s1")
    assert held["metadata"]["deletionTimestamp"]
    c.patch_namespaced_custom_object(G, V, NS, "podsnapshots", "s1",
                                     {"metadata": {"finalizers": None}},
                                     _content_type="application/merge-patch+json")
    assert status_of(c.get_namespaced_custom_object, G, V, NS, "podsnapshots", "s1")[0] == 404
