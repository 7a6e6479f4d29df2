"""The platform team's tools: idle policy and auto-pause, the cost/capacity report, gc, validate.

Modules (each one job):
  idle      what "idle" means; the auto-pause state machine (pure, clock injected)
  profiles  workload profiles (cpu-small, gpu-experiment, training, never) and how one is chosen
  monitor   IdleMonitor: runs the rules inside the server, pauses through the Lifecycle
  activity  keeps the extension's own kernel calls out of the server's activity record
  handlers  GET policy, POST policy/cancel, GET report; the server's start/stop hooks
  report, whatif, stats, render, plot   the report and the what-if (read from the journal)
  gc        retention clean-up in an order that orphans nothing
  validate  the upgrade check (live / restored / fresh)

Working with other cullers
--------------------------
Both read the server's activity, so this extension keeps it truthful: reading ``policy``,
``report`` (and, on the server side, ``status``) is not activity, and a checkpoint, restore or
liveness probe run inside a kernel by this extension is not activity either
(:func:`jupyter_pause.server.activity.not_activity`). A person's request (Pause, Resume,
cancelling an announced auto-pause) is activity.

* Kubeflow Workspaces (``activityProbe.jupyter.lastActivity`` polls ``/api/status``) and the
  Notebooks v1 culler (``CULL_IDLE_TIME`` minutes over ``/api/kernels``): let this extension act
  first, so a checkpoint exists before the pod goes: set the cull time (``secondsSinceActive`` /
  ``CULL_IDLE_TIME``) above the profile's ``idle_after + grace_period`` plus the p90 time to
  pause from ``jupyter pause report``. After an auto-pause the workspace is truly idle and the
  culler may stop the pod; resume then restores from the checkpoint.
* jupyterhub-idle-culler: its ``--timeout`` must exceed ``idle_after + grace_period`` + p90 time
  to pause + JupyterHub's ``last_activity_interval`` (300 s) + the websocket ping (30 s);
  otherwise the culler deletes the server, and the kernels' memory, before the checkpoint. E.g.
  the default gpu-experiment profile (1 h + 5 min grace) needs ``--timeout`` >= 4500.
"""
