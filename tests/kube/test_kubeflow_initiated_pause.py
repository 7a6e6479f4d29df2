"""A pause that Kubeflow starts by itself (the dashboard's pause, `activityRules` culling) under
GKE Workspaces: a real Jupyter server with `c.PauseApp.backend = "kubeflow"` (tier 1).

Kubeflow only patches the Workspace's spec.paused (kubeflow/notebooks notebooks-v2: the pause
action, PR 340; the culler, workspace_activity.go). The add-on's webhook then holds the pause, sets
the pod's readiness condition podsnapshot.gke.kubeflow.org/active=False at once and creates its
trigger after a ~3 s settle (gke-labs/workspaces webhook.go, reconcile.go), which freezes the
pod: no application checkpoint would exist unless the server, seeing the condition drop, takes it
in those seconds. The simulator plays the add-on with that settle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import NS, gke_server_config
from .test_e2e_server import _run
from .test_kubeflow_gke_workspaces import KF, KFV, STATE, example_kind, start_workspace

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def workspace_pod(kfsim):
    """The Workspace's pod, Running and in its Service, before the server in it starts."""
    pod = start_workspace(kfsim, example_kind())
    kfsim.wait(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                           for p in kfsim.pods() for c in p["status"].get("conditions", [])),
               10, "pod Ready")
    return kfsim, pod


@pytest.fixture
def jp_server_config(tmp_path, apiserver):
    cfg = gke_server_config(tmp_path, apiserver.url)
    cfg["PauseApp"]["backend"] = "kubeflow"
    gke = cfg.pop("GKEBackend")
    cfg["KubeflowBackend"] = {"kubeconfig": gke["kubeconfig"], "pod_name": "ws-ws1-0",
                              "namespace": NS, "gpu_model": "nvidia-l4",
                              "restored_condition_wait": 0.0, "checkpoint_timeout": 60.0}
    return cfg


async def dashboard_pause(sim, jp_serverapp, jp_fetch) -> tuple[Any, Callable[[], list[dict]]]:
    """A notebook with a variable, then Kubeflow's dashboard pause (spec.paused only); returns
    the lifecycle and a reader of its journal once the checkpoint is written."""
    lifecycle = jp_serverapp.web_app.settings["jupyter_pause_lifecycle"]
    await lifecycle.start()  # what the server's start runs (pytest-jupyter's does not)
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "nb.ipynb", "name": "nb.ipynb", "type": "notebook",
         "kernel": {"name": "python3"}}))
    await _run(jp_serverapp, json.loads(r.body)["kernel"]["id"], "x = 41 + 1")
    await asyncio.to_thread(sim.custom.patch_namespaced_custom_object, KF, KFV, NS,
                            "workspaces", "ws1", {"spec": {"paused": True}})

    def journal() -> list[dict]:
        path = lifecycle.journal.journal_path
        return [json.loads(line) for line in path.read_text().splitlines()] if \
            path.exists() else []

    await asyncio.to_thread(sim.wait, lambda: any(
        e["event"] == "checkpoint_written" for e in journal()), 20, "a checkpoint")
    return lifecycle, journal


async def test_a_kubeflow_pause_is_checkpointed_before_the_snapshot(
        workspace_pod, jp_serverapp, jp_fetch, api):
    sim, _ = workspace_pod
    # The order, not the speed: on a loaded 2-core runner the server's part (hear the
    # condition, check the kernels, write) can take longer than the add-on's ~3 s.
    sim.gkw_settle_s = 10.0
    lifecycle, journal = await dashboard_pause(sim, jp_serverapp, jp_fetch)
    events = journal()
    (asked,) = [e for e in events if e["event"] == "pause_requested"]
    assert asked["trigger"] == "gke-workspaces", asked
    # written in the add-on's settle, before its trigger froze the pod
    written = next(e for e in events if e["event"] == "checkpoint_written")
    for trigger in sim.cr("podsnapshotmanualtriggers"):  # both to the second
        assert written["at"][:19] <= trigger["metadata"]["creationTimestamp"][:19], trigger
    await lifecycle.wait()
    ws = sim.custom.get_namespaced_custom_object(KF, KFV, NS, "workspaces", "ws1")
    assert ws["metadata"]["annotations"][STATE] == "Ready" and ws["spec"]["paused"] is True
    st = await api("GET", "status")
    assert st["state"] == "paused", st


async def test_a_kubeflow_pause_takes_one_pod_snapshot(workspace_pod, jp_serverapp, jp_fetch,
                                                       api):
    """The pause the add-on holds already is followed, not asked for again. Before, the
    server's own paused=true reached the add-on's webhook while the Workspace read
    Checkpointing; the webhook holds every paused false->true but the one at Ready and
    re-stamps checkpoint-started-at (webhook.go mutateWorkspace), and the reconciler replaces a
    trigger of another stamp (reconcile.go reconcileCheckpointing): a second pod snapshot."""
    sim, _ = workspace_pod
    sim.gkw_settle_s = 0.0  # the add-on's trigger exists before the checkpoint is written
    sim.trigger_outcome = "hold"  # and GKE has not picked it up yet
    lifecycle, _ = await dashboard_pause(sim, jp_serverapp, jp_fetch)
    # (held writes: after the checkpoint, the pause's events are in memory only)
    await asyncio.to_thread(sim.wait, lambda: lifecycle.state["state"] == "releasing", 20,
                            "the release")
    # the release's first reads and (before) its paused=true: time enough for them to land
    with contextlib.suppress(AssertionError):  # a second hold must not come
        await asyncio.to_thread(sim.wait, lambda: sim.gkw_held_again, 2.0, "a second hold")
    sim.trigger_outcome = "complete"
    await lifecycle.wait()
    assert sim.gkw_held_again == 0
    assert [t for t, _ in sim.gkw_triggers_made] == ["ws-ws1-trigger"], sim.gkw_triggers_made
    assert sim.snapshots_created == 1
    st = await api("GET", "status")
    assert st["state"] == "paused", st
