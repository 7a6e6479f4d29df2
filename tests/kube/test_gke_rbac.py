"""Per-identity RBAC in tier 1: the notebook's service account and the resumer each get exactly
the verbs their Roles grant (jupyter_pause/cluster/permissions.py NOTEBOOK_PERMISSIONS and
RESUMER_PERMISSIONS, which examples/kubernetes/rbac.yaml and resumer-rbac.yaml ship), while the
simulated cluster's controllers keep acting as an admin, as on a real cluster."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_pause.cluster.gke import GKEBackend
from jupyter_pause.cluster.kube import PODS, Kube, KubeError, Res, api_client_for
from jupyter_pause.cluster.permissions import (
    NOTEBOOK_CLUSTER_PERMISSIONS,
    NOTEBOOK_PERMISSIONS,
    RESUMER_PERMISSIONS,
    STATEFULSET_PERMISSIONS,
    union,
)
from jupyter_pause.cluster.resume import resume_workspace

from .conftest import NS, pause_ctx, resume_ctx
from .test_gke_restore_faults import make_statefulset

NOTEBOOK_SA = f"system:serviceaccount:{NS}:jupyter"


@pytest.fixture
def identities(apiserver):
    srv = apiserver.server
    # Callers without a token (the simulated cluster's controllers) act as the cluster admin.
    apiserver.call(setattr, srv, "user", "system:admin")
    apiserver.call(srv.grant, NOTEBOOK_SA, "nb-token",
                   union(NOTEBOOK_PERMISSIONS, NOTEBOOK_CLUSTER_PERMISSIONS,
                         STATEFULSET_PERMISSIONS))
    apiserver.call(srv.grant, "resumer@example.com", "resumer-token", RESUMER_PERMISSIONS)
    return (api_client_for(apiserver.url, token="nb-token"),
            api_client_for(apiserver.url, token="resumer-token"))


async def test_pause_and_crash_fallback_with_the_shipped_roles(identities, sim, recorder):
    notebook, resumer = identities
    pod = make_statefulset(sim)
    b = GKEBackend(api_client=notebook, pod_name=pod, namespace=NS, gpu_model="nvidia-l4",
                   trigger_timeout=10, snapshot_timeout=10, restored_condition_wait=0)
    ctx = pause_ctx(recorder)
    assert (await b.describe())["can_pause"] is True
    snap = await b.snapshot(ctx)
    assert (await b.release(ctx)).stopped_via == "statefulset"
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 10, "pod stopped")
    sim.restore_mode = "crash"
    # The resumer drops the crashing snapshot (podsnapshots delete) and restarts the pod.
    out = await resume_workspace(Kube(resumer), NS, "nb", poll=0.05, timeout=20,
                                 restored_condition_wait=0.3, discard_wait=5)
    assert out["state"] == "cold_started", out
    verdict = await b.restored_live(resume_ctx(recorder))
    assert verdict.live is False, verdict
    assert snap.snapshot


@pytest.mark.parametrize("events", [True, False])
async def test_gkes_cold_start_warning_is_readable_with_the_shipped_role(
        apiserver, sim, recorder, events):
    """GKE's only API signal of a skipped restore is a Warning event on the pod (reason
    GKEPodSnapshotting, "falling back to a cold start of pod", gke-labs/pod-migration issue 13).
    The shipped Role grants `list` on events so the notebook can quote it; a Role without it
    (an older rbac.yaml) gets 403 and still gets a verdict, from its own records."""
    srv = apiserver.server
    apiserver.call(setattr, srv, "user", "system:admin")
    perms = union(NOTEBOOK_PERMISSIONS, NOTEBOOK_CLUSTER_PERMISSIONS, STATEFULSET_PERMISSIONS)
    if not events:
        perms.pop(("", "events"), None)
    apiserver.call(srv.grant, NOTEBOOK_SA, "nb-token", perms)
    apiserver.call(srv.grant, "resumer@example.com", "resumer-token", RESUMER_PERMISSIONS)
    notebook = api_client_for(apiserver.url, token="nb-token")
    resumer = api_client_for(apiserver.url, token="resumer-token")
    pod = make_statefulset(sim)
    b = GKEBackend(api_client=notebook, pod_name=pod, namespace=NS, gpu_model="nvidia-l4",
                   trigger_timeout=10, snapshot_timeout=10, restored_condition_wait=0)
    ctx = pause_ctx(recorder)
    await b.snapshot(ctx)
    await b.release(ctx)
    await asyncio.to_thread(sim.wait, lambda: not sim.pods(), 10, "pod stopped")
    sim.restore_mode = "skip"  # GKE skips the matching restore and warns
    out = await resume_workspace(Kube(resumer), NS, "nb", poll=0.05, timeout=20,
                                 restored_condition_wait=0.3)
    assert out["state"] == "cold_started", out
    verdict = await b.restored_live(resume_ctx(recorder))
    assert verdict.live is False, verdict
    assert verdict.reason.startswith("pod was cold-started")
    assert ("falling back to a cold start" in verdict.reason) is events, verdict.reason


async def test_each_identity_is_refused_what_its_role_lacks(identities, apiserver, sim):
    notebook, resumer = identities
    with pytest.raises(KubeError) as e:
        await Kube(notebook).delete(PODS, "nb-0", NS)
    assert e.value.status == 403 and f'User "{NOTEBOOK_SA}" cannot delete' in str(e.value)
    with pytest.raises(KubeError) as e:
        await Kube(resumer).list(Res("podsnapshot.gke.io", "v1", "podsnapshots"), NS)
    assert e.value.status == 403 and 'User "resumer@example.com" cannot list' in str(e.value)
    allowed, _ = await Kube(notebook).access_review(
        "create", Res("podsnapshot.gke.io", "v1", "podsnapshotmanualtriggers"), NS)
    denied, _ = await Kube(notebook).access_review("delete", PODS, NS)
    assert (allowed, denied) == (True, False)
    # the cluster's own controllers are not limited by the notebook's Role
    assert sim.pods() == []
