"""Kubernetes commands: ``doctor``, ``snapshots``, and ``resume --namespace NS WORKSPACE``.

``resume`` with --namespace/WORKSPACE resumes the workspace from outside its pod
(jupyter_pause.cluster.resume) and shows the state while it waits for capacity; without them it
asks the local Jupyter server (:mod:`jupyter_pause.cli.workspace`). ``snapshots`` lists or cleans
a workspace's pod snapshots in the safe order. The Kubernetes client is imported by each command:
it is an optional dependency and slow to import.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from .argtypes import count, number
from .client import server_options
from .config import pause_app
from .exits import EXIT_FAIL, EXIT_OK, EXIT_USAGE

_STATE_TEXT = {
    "resuming": "resuming",
    "joined": "joined",
    "starting": "starting",
    "stopping": "stopping",
    "waiting_for_capacity": "waiting for capacity",
    "pending": "pending",
    "scheduled": "scheduled on",
    "running": "running, checking whether the pod snapshot was restored",
    "restored_live": "restored live",
    "cold_started": "cold-started",
    "started": "started",
    "failed": "failed",
}


def _kube(args: argparse.Namespace) -> Any:
    from ..cluster.kube import Kube, load_api_client

    return Kube(load_api_client(getattr(args, "kubeconfig", None), getattr(args, "context", None)))


def cmd_resume(args: argparse.Namespace) -> int:
    """``resume --namespace NS WORKSPACE``: from outside the pod, through the cluster."""
    from ..cluster.kube import KubeError
    from ..cluster.resume import resume_workspace

    if not (args.namespace and args.workspace):
        print("jupyter pause: resume needs both --namespace NS and WORKSPACE", file=sys.stderr)
        return EXIT_USAGE

    def show(update: dict) -> None:
        if args.json:
            print(json.dumps(update), flush=True)
            return
        text = _STATE_TEXT.get(update["state"], update["state"])
        reason = update.get("reason")
        print(f"{text}: {reason}" if reason else text, flush=True)

    try:
        result = asyncio.run(resume_workspace(
            _kube(args), args.namespace, args.workspace, on_update=show,
            timeout=args.timeout, poll=args.poll))
    except KubeError as e:
        print(f"jupyter pause: {e}", file=sys.stderr)
        return EXIT_FAIL
    except Exception as e:  # noqa: BLE001 (no kubeconfig, unreachable cluster: one line)
        print(f"jupyter pause: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        print(json.dumps(result))
    elif result["state"] == "cold_started":
        print("The notebook server restores the kernels from the last checkpoint.")
    elif result["state"] == "timeout":
        print(f"Still not back after {args.timeout:.0f} s ({result['reason']}); the resume "
              "continues in the cluster.")
    return EXIT_OK if result["state"] in ("restored_live", "cold_started", "started") else EXIT_FAIL


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..cluster.doctor import MISSING, Check, format_table, run_checks
    from ..cluster.kube import own_pod_identity

    name, ns = own_pod_identity()
    name, ns = args.pod or name, args.namespace or ns
    kube = None
    pre: list[Check] = []
    try:
        kube = _kube(args)
    except Exception as e:  # noqa: BLE001 (no kubeconfig: reported as a check)
        pre.append(Check("kubernetes", MISSING, f"no Kubernetes access: {e}".splitlines()[0],
                         "run inside the notebook pod or pass --kubeconfig"))
    checks = pre + asyncio.run(run_checks(kube, pod_name=name, namespace=ns, backend=args.backend,
                                          storage_config=args.storage_config,
                                          policy_name=getattr(args, "policy", None)))
    checks.append(store_check())
    if args.json:
        print(json.dumps([c.to_dict() for c in checks], indent=1))
    else:
        print(format_table(checks))
    return EXIT_FAIL if any(c.status == MISSING for c in checks) else EXIT_OK


def store_check() -> Any:
    """The checkpoint store the server would use, and the credentials it is opened with
    (each ecosystem's default chain: nothing is configured by jupyter-pause)."""
    from ..checkpoint.credentials import describe_credentials
    from ..checkpoint.store import default_store_url
    from ..cluster.doctor import OK, WARN, Check

    url = os.environ.get("JUPYTER_PAUSE_STORE_URL", "")
    if not url:
        try:
            url = pause_app().store_url
        except Exception:  # noqa: BLE001 (reported by the "server config" check)
            url = ""
    url = url or default_store_url()
    how = describe_credentials(url)
    if "no credentials found" in how or "not installed" in how:
        return Check("checkpoint store", WARN, f"{url}: {how}",
                     "see the README's object store credentials")
    return Check("checkpoint store", OK, f"{url}: {how}")


def cmd_snapshots(args: argparse.Namespace) -> int:
    from ..cluster.cleanup import collect_garbage
    from ..cluster.kube import KubeError
    from ..cluster.snapshots import dns_name

    try:
        out = asyncio.run(collect_garbage(
            _kube(args), args.namespace, args.workspace, keep=args.keep,
            older_than=args.older_than, dry_run=args.dry_run, teardown=args.teardown,
            policy=args.policy or dns_name("jp", args.workspace)))
    except KubeError as e:
        print(f"jupyter pause: {e}", file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        print(json.dumps(out))
    else:
        if args.dry_run:
            print("would delete: " + (", ".join(out["would_delete"]) or "nothing"))
        else:
            print("deleted: " + (", ".join(out["deleted"]) or "nothing"))
        print("left: " + (", ".join(out["remaining"]) or "nothing"))
        if out["stuck"]:
            print("stuck deleting (a finalizer still runs): " + ", ".join(out["stuck"]))
    return EXIT_FAIL if out["stuck"] else EXIT_OK


# ---------------------------------------------------------------------- parser


def _kube_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster "
                   "service account, else KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", default=None, help="kubeconfig context")


def add_resume_arguments(resume: argparse.ArgumentParser) -> None:
    """The out-of-pod arguments of ``resume`` (the command itself is the workspace module's)."""
    resume.add_argument("workspace", nargs="?", default=None,
                        help="Kubeflow Workspace, StatefulSet or pod to resume from outside it "
                        "(with --namespace)")
    resume.add_argument("--namespace", "-n", default=None, help="the workspace's namespace")
    resume.add_argument("--poll", type=number(positive=True), default=1.0, help=argparse.SUPPRESS)
    _kube_options(resume)


def register(sub: Any) -> None:
    """Add doctor and snapshots to the ``jupyter pause`` subparsers."""
    p = sub.add_parser("doctor", parents=[server_options(argparse.SUPPRESS)],
                       help="check what a pod-snapshot pause needs, in the pod")
    p.add_argument("--backend", choices=["gke", "kubeflow"], default="gke")
    p.add_argument("--namespace", "-n", default=None, help="default: POD_NAMESPACE")
    p.add_argument("--pod", default=None, help="default: POD_NAME or the hostname")
    p.add_argument("--storage-config", default="jupyter-pause-snapshots")
    p.add_argument("--policy", default=None,
                   help="PodSnapshotPolicy name (default jp-<workspace>, or GKE Workspaces')")
    _kube_options(p)
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("snapshots", parents=[server_options(argparse.SUPPRESS)], help="clean a workspace's pod snapshots (snapshots, "
                       "then triggers, the policy last)")
    p.add_argument("workspace", help="the workspace label value (jupyter-pause.io/workspace)")
    p.add_argument("--namespace", "-n", required=True)
    p.add_argument("--keep", type=count, default=1,
                   help="Ready snapshots kept, newest first (0: no count limit)")
    p.add_argument("--older-than", type=number(), default=None, metavar="SECONDS",
                   help="keep snapshots younger than this")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--teardown", action="store_true",
                   help="delete every snapshot (pinned and young ones excepted), then the policy "
                        "once nothing is left")
    p.add_argument("--policy", default=None, help="policy name (default jp-<workspace>)")
    _kube_options(p)
    p.set_defaults(func=cmd_snapshots)
