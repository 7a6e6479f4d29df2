"""What each shipped example makes of the server it starts: the address it listens on, the process
the container runs, and the time the shutdown checkpoint gets after SIGTERM.

Modelled on the images the examples name:
- docker-stacks (jupyter/docker-stacks): `images/docker-stacks-foundation/Dockerfile` has
  `ENTRYPOINT ["tini", "-g", "--", "start.sh"]`, `images/base-notebook/Dockerfile` has
  `CMD ["start-notebook.py"]`, and `images/base-notebook/jupyter_server_config.py` (installed as
  /etc/jupyter/jupyter_server_config.py) sets `c.ServerApp.ip = ""` ("Listen on all interfaces");
- Kubeflow's example notebook images (kubeflow/kubeflow components/example-notebook-servers) run
  JupyterLab as an s6-overlay service whose run script passes `--ip=0.0.0.0`; s6's shutdown
  timings are just-containers/s6-overlay README's S6_SERVICES_GRACETIME / S6_KILL_GRACETIME;
- Kubernetes (core/v1 Container): `command` replaces the image's ENTRYPOINT, `args` its CMD, and
  a `command` without `args` drops the CMD too.
The configuration is loaded the way Jupyter does (traitlets Application.load_config_file over
jupyter_core.paths.SYSTEM_CONFIG_PATH, first is highest priority), in a subprocess since the
examples' settings install an event loop policy when loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jupyter_core.paths
import yaml

from jupyter_pause.cluster.grace import DEFAULT_BUDGET_S, grace_finding

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
DOCKER_STACKS_CONFIG = 'c = get_config()  # noqa\nc.ServerApp.ip = ""\nc.ServerApp.open_browser = False\n'
DOCKER_STACKS_ENTRYPOINT = ["tini", "-g", "--", "start.sh"]
DOCKER_STACKS_CMD = ["start-notebook.py"]

LOAD = """
import json, sys
from jupyter_server.serverapp import ServerApp
from traitlets.config.application import Application
app = ServerApp()
# what JupyterApp.load_config_file does with its config_file_paths
Application.load_config_file(app, "jupyter_server_config", path=sys.argv[1:])
eff = ServerApp(config=app.config)
cfg = app.config
print(json.dumps({"ip": eff.ip,
                  "transport": cfg.KernelManager.get("transport"),
                  "backend": cfg.PauseApp.get("backend")}))
"""


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def effective_server(root: Path, files: dict[str, str]) -> dict:
    """The server's settings in a container whose filesystem holds `files` (path -> text; a
    volume mount at a path replaces what the image had there)."""
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    paths = [str(root / p.lstrip("/")) for p in jupyter_core.paths.SYSTEM_CONFIG_PATH]
    out = subprocess.run([sys.executable, "-c", LOAD, *paths], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def argv(container: dict, entrypoint: list[str], cmd: list[str]) -> list[str]:
    command, args = container.get("command"), container.get("args")
    if command:
        return [*command, *(args or [])]
    return [*entrypoint, *(args if args is not None else cmd)]


def test_statefulset_listens_everywhere_runs_tini_and_gets_its_grace(tmp_path):
    (sts,) = [d for d in docs("notebook-statefulset.yaml") if d["kind"] == "StatefulSet"]
    (cm,) = docs("jupyter-server-config.yaml")
    spec = sts["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "server-config"]
    [volume] = [v for v in spec["volumes"] if v["name"] == "server-config"]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    files = {"/etc/jupyter/jupyter_server_config.py": DOCKER_STACKS_CONFIG,
             mount["mountPath"]: cm["data"][mount["subPath"]]}
    server = effective_server(tmp_path, files)
    # before: the mount replaced docker-stacks' file and the server listened on localhost only
    assert server["ip"] == "", server
    assert server["transport"] == "ipc" and server["backend"] == "gke"
    # before: command: [start-notebook.py] replaced tini, and nothing forwarded SIGTERM
    assert argv(container, DOCKER_STACKS_ENTRYPOINT, DOCKER_STACKS_CMD)[0] == "tini"
    enough, detail, _ = grace_finding(sts["spec"]["template"], DEFAULT_BUDGET_S, {}, s6=False)
    assert enough, detail


def test_workspacekind_builds_its_settings_in_and_gives_s6_the_budget(tmp_path):
    (wsk,) = docs("workspacekind.yaml")
    tmpl = wsk["spec"]["podTemplate"]
    # cluster-scoped: no ConfigMap, which would exist in one namespace only
    assert not any("configMap" in v for v in tmpl.get("extraVolumes") or [])
    dockerfile = (EXAMPLES / "kubeflow" / "Dockerfile").read_text()
    [(src, dst)] = [line.split()[1:3] for line in dockerfile.splitlines()
                    if line.startswith("COPY ")]
    (image,) = [v["spec"]["image"] for v in tmpl["options"]["imageConfig"]["values"]]
    assert image.startswith("registry.example.com/jupyter-pause-kubeflow")
    assert "pip install --no-cache-dir jupyter-pause" in dockerfile
    server = effective_server(tmp_path, {dst: (EXAMPLES / "kubeflow" / src).read_text()})
    # the image's s6 run script passes --ip=0.0.0.0, which only a config of ours could undo
    assert server["ip"] == "localhost", "the built-in settings must leave ServerApp.ip alone"
    assert server["transport"] == "ipc" and server["backend"] == "kubeflow"
    # s6: before, the image's defaults (3 s + 3 s) cut the 20 s checkpoint to about 6 s
    env = {e["name"]: e["value"] for e in tmpl["extraEnv"] if "value" in e}
    pod = {"spec": {}}  # Kubeflow's controller sets no terminationGracePeriodSeconds
    enough, detail, _ = grace_finding(pod, DEFAULT_BUDGET_S, env, s6=True)
    assert enough, detail
    enough, detail, fix = grace_finding(pod, DEFAULT_BUDGET_S, {}, s6=True)
    assert not enough and "6 s after SIGTERM" in detail and "S6_SERVICES_GRACETIME" in fix


def test_workspacekind_gpu_option_fits_a_g2_standard_8():
    """GKE's node allocatable (docs "Standard cluster architecture", reserved resources): CPU
    6 % of the first core, 1 % of the next, 0.5 % of the next 2, 0.25 % above 4; memory 25 % of
    the first 4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of the next 112, plus a 100 MiB
    eviction threshold; a g2-standard-8 has 8 vCPUs and 32 GB. GPU and gVisor DaemonSets take
    their share of what is left (1 CPU, 2 GiB kept for them here)."""
    cpu_alloc = 8 - (0.06 + 0.01 + 2 * 0.005 + 4 * 0.0025)
    mem_alloc = 32 - (4 * 0.25 + 4 * 0.20 + 8 * 0.10 + 16 * 0.06) - 0.1
    (wsk,) = docs("workspacekind.yaml")
    for v in wsk["spec"]["podTemplate"]["options"]["podConfig"]["values"]:
        req = (v["spec"].get("resources") or {}).get("requests") or {}
        if "cpu" in req:
            assert float(req["cpu"]) <= cpu_alloc - 1, v["id"]
        if "memory" in req:
            assert req["memory"].endswith("Gi") and float(req["memory"][:-2]) <= mem_alloc - 2


def test_doctor_warns_when_the_server_gets_less_than_the_budget():
    """`jupyter pause doctor`'s "shutdown grace": the first of the pod's grace period and s6's
    two waits to run out is what the shutdown checkpoint gets."""
    from traitlets.config import Config

    from jupyter_pause.cluster.doctor import check_shutdown_grace

    kubeflow_default = check_shutdown_grace({"spec": {}}, Config(), {}, s6=True)
    assert kubeflow_default.status == "warn" and "s6-overlay" in kubeflow_default.detail
    short_pod = check_shutdown_grace({"spec": {"terminationGracePeriodSeconds": 15}}, Config(),
                                     {}, s6=False)
    assert short_pod.status == "warn" and "terminationGracePeriodSeconds 15 s" in short_pod.detail
    # a larger budget needs a larger grace: the configured budget is the one compared
    raised = Config({"PauseApp": {"shutdown_checkpoint_budget": 60.0}})
    assert check_shutdown_grace({"spec": {}}, raised, {}, s6=False).status == "warn"
    ok = check_shutdown_grace({"spec": {"terminationGracePeriodSeconds": 90}}, raised,
                              {"S6_SERVICES_GRACETIME": "70000"}, s6=True)
    assert ok.status == "ok", ok
