"""The same experiment after a restore: in real kernels, a checkpoint, a fresh kernel, a restore,
and the next cell prints what it printed in the kernel that was never interrupted."""

from __future__ import annotations

import json
import random

import pytest

from .bridge_util import bridge

pytestmark = pytest.mark.timeout(240)

SETUP = """\
import logging, os, random, sys, warnings
import numpy as np, pandas as pd, torch, matplotlib
random.seed(1); np.random.seed(2); torch.manual_seed(3)
random.random(); np.random.rand(); torch.rand(4)   # mid-stream, not at a seed
os.makedirs('lib', exist_ok=True)
open('lib/jp_helper.py', 'w').write('VALUE = 17\\n')
os.makedirs('data', exist_ok=True)
open('data/x.csv', 'w').write('a,b\\n1,2\\n')
sys.path.insert(0, os.path.abspath('lib'))
os.chdir('data')
os.environ['MY_FLAG'] = 'on'
torch.set_default_dtype(torch.float64)
torch.set_printoptions(precision=2)
np.set_printoptions(precision=3)
pd.set_option('display.max_rows', 7)
matplotlib.rcParams['lines.linewidth'] = 4.5
logging.getLogger('jp.notebook').setLevel(logging.ERROR)
warnings.filterwarnings('error', message='boom')
"""
IPYTHON = (
    "%load_ext autoreload\n%autoreload 2\n"
    "%config ZMQInteractiveShell.ast_node_interactivity = 'last_expr_or_assign'\n"
    "%matplotlib agg"
)
NEXT = """\
import jp_helper
def _probe():
    try:
        warnings.warn('boom', UserWarning)
        return 'passed'
    except UserWarning:
        return 'raised'
ip = get_ipython()
print(json.dumps([random.random(), np.random.rand(2).tolist(), torch.rand(2).tolist(),
    torch.nn.functional.dropout(torch.ones(8), 0.5, training=True).tolist(),
    open('x.csv').read(), str(torch.tensor(1.0).dtype), repr(np.array([1 / 3, 2 / 3])),
    str(torch.tensor([1 / 3])), pd.get_option('display.max_rows'), jp_helper.VALUE,
    os.environ.get('MY_FLAG'), matplotlib.rcParams['lines.linewidth'],
    logging.getLogger('jp.notebook').level, _probe(), Out[4], _4, In[4],
    ip.ast_node_interactivity, 'IPython.extensions.autoreload' in ip.extension_manager.loaded,
    ip.magics_manager.registry['AutoreloadMagics']._reloader.check_all,
    matplotlib.get_backend()]))
"""


def _next(kernel) -> tuple[int, list]:
    out = kernel.ok("import json\n" + NEXT)
    return out.reply["content"]["execution_count"], json.loads(out.stdout)


def _rows(out) -> dict[str, str]:
    """Process-state rows of a %checkpoint / %restore report: name -> status (reason)."""
    rows = {}
    for d in out.displays:
        report = d.get("application/vnd.jupyter-pause.report+json")
        for r in (report or {}).get("rows", []):
            if r["kind"] == "process state":
                rows[r["name"]] = f"{r['status']} ({r['reason']})"
    return rows


def test_next_cells_continue_as_if_never_interrupted(kernel):
    kernel.ok(SETUP, timeout=120)  # cell [2]: imports numpy, pandas, torch, matplotlib
    kernel.ok(IPYTHON)  # [3]
    kernel.ok("6 * 7")  # [4]
    saved = _rows(kernel.ok("%checkpoint"))  # [5]
    assert {"RNG: random", "RNG: numpy", "RNG: torch", "working directory", "sys.path",
            "os.environ", "torch settings", "IPython execution count"} <= set(saved), saved
    expected = _next(kernel)  # [6], uninterrupted
    assert expected[0] == 6

    kernel.restart()
    kernel.ok("%load_ext jupyter_pause")
    restored = _rows(kernel.ok("%restore"))
    assert all(s.startswith("restored") for s in restored.values()), restored
    assert restored["IPython execution count"] == "restored (the next cell is [6])"
    got = _next(kernel)
    assert got == expected


def test_user_variables_vs_the_new_environments(kernel_factory):
    """What the user set comes back; what the new pod set for itself (its own value at start)
    wins, and so does its choice of devices; the report names them, never their values."""
    old = kernel_factory(SERVICE_ADDR="10.0.0.1", REGION="eu")
    old.ok("%load_ext jupyter_pause")
    old.ok("import os\nos.environ.update(MY_FLAG='on', SERVICE_ADDR='user-choice', REGION='us',"
           " CUDA_VISIBLE_DEVICES='7')")
    old.ok("%checkpoint")
    new = kernel_factory(SERVICE_ADDR="10.9.9.9", REGION="eu")
    new.ok("%load_ext jupyter_pause")
    rows = _rows(new.ok("%restore"))
    env = new.eval("{k: os.environ.get(k) for k in "
                   "('MY_FLAG', 'SERVICE_ADDR', 'REGION', 'CUDA_VISIBLE_DEVICES')}")
    assert env == {"MY_FLAG": "on", "SERVICE_ADDR": "10.9.9.9", "REGION": "us",
                   "CUDA_VISIBLE_DEVICES": None}
    why = rows["os.environ"]
    assert why.startswith("restored") and "differs from the new environment" in why
    assert "SERVICE_ADDR" in why and "CUDA_VISIBLE_DEVICES" in why
    assert "user-choice" not in why and "10.9" not in why


def test_partial_restore_leaves_the_process_unless_asked(kernel):
    kernel.ok("import random\nrandom.seed(4)\nx = 1")
    kernel.ok("%checkpoint")
    expected = kernel.eval("random.random()")
    kernel.restart()
    kernel.ok("%load_ext jupyter_pause\nimport random\nrandom.seed(99)")
    out = kernel.ok("%restore --only x")
    assert "partial restore" in out.text and _rows(out) == {}
    assert kernel.eval(f"(x, random.random() != {expected!r})") == (1, True)
    kernel.ok("%restore --only x --process-state")
    assert kernel.eval("random.random()") == expected


def test_bridge_between_cells_keeps_counter_and_rows_apart(kernel):
    """The server's path: silent execution between cells, a fresh kernel restored before any
    cell ran; process rows come in their own list, the variables' counts stay as they were."""
    kernel.ok("import numpy as np\nnp.random.seed(8)\ny = 2")
    kernel.ok("y * 3")
    res = bridge(kernel, "checkpoint", store_url=None, key_path=None, stream="analysis.ipynb")
    assert res["ok"] and [v["name"] for v in res["variables"]] == ["y"], res
    kinds = {r["kind"] for r in res["process_state"]}
    assert kinds == {"process state"} and "RNG: numpy" in {r["name"] for r in res["process_state"]}
    expected = kernel.run("print(np.random.rand(), Out[3])")
    kernel.restart()
    out = bridge(kernel, "restore", store_url=None, key_path=None, stream="analysis.ipynb")
    assert out["ok"] and [v["name"] for v in out["variables"]] == ["y"], out
    assert {r["name"]: r["status"] for r in out["process_state"]}["RNG: numpy"] == "restored"
    got = kernel.run("print(np.random.rand(), Out[3])")
    assert got.stdout == expected.stdout
    assert got.reply["content"]["execution_count"] == expected.reply["content"]["execution_count"]


def test_clients_asking_kernel_info_do_not_draw_from_the_notebooks_random_stream(kernel):
    """ipykernel answers every kernel_info request with IPython's banner, whose tip is drawn
    with the global ``random.choice`` (IPython/core/tips.py): each client that connected or
    probed (a browser tab, the server's liveness checks before a pause) took a number from the
    notebook's seeded stream, so the draws after a pause were not those of a run never paused.
    The kernel side is installed when the server starts a kernel (its autosave call)."""
    assert bridge(kernel, "autosave", settings={"enabled": False})["ok"] is True
    kernel.ok("import random\nrandom.seed(7)")
    for _ in range(3):  # each call asks kernel_info before it runs
        assert "token" in bridge(kernel, "liveness")
    assert bridge(kernel, "checkpoint", store_url=None, key_path=None,
                  stream="probed.ipynb")["ok"] is True
    kernel.restart()
    assert bridge(kernel, "restore", store_url=None, key_path=None,
                  stream="probed.ipynb")["ok"] is True
    assert "token" in bridge(kernel, "liveness")  # the reconnecting tab's ask
    never_paused = random.Random(7)
    assert kernel.eval("[random.random() for _ in range(3)]") == [
        never_paused.random() for _ in range(3)]


IPY_HOSTILE = """\
import json
from jupyter_pause.checkpoint import procstate
from jupyter_pause.kernel import ipystate
ip = get_ipython()
before = (ip.execution_count, len(In), sorted(ip.extension_manager.loaded), ip.config.copy())
bad = [None, 1, 'x', [], {'next': -1}, {'next': 10**12, 'first': 1, 'inputs': []},
       {'next': 5, 'first': 1, 'inputs': [1, 2, 3, 4]}, {'next': 3, 'first': 9, 'inputs': []},
       {'loaded': ['os; x']}, {'loaded': 'autoreload'}, {'enabled': 'yes'}, {'bogus': True},
       {'Shell': {'x y': 1}}, {'not a section': {}}, {'backend': ''}, {'backend': 5},
       {'backend': 'module://../../evil'}]
out = []
for e in procstate.registered():
    if e.name.startswith('ipython.'):
        for b in bad:
            for r in procstate.restore({'format': 1, 'entries': {e.name: b}}):
                out.append([e.name, r.status, bool(r.reason)])
after = (ip.execution_count, len(In), sorted(ip.extension_manager.loaded), ip.config.copy())
print(json.dumps([out, before == after]))
"""


def test_ipython_entries_refuse_hostile_state(kernel):
    out = kernel.ok(IPY_HOSTILE)
    rows, unchanged = json.loads(out.stdout)
    names = {r[0] for r in rows}
    assert names == {"ipython.count", "ipython.extensions", "ipython.autoreload",
                     "ipython.config", "ipython.matplotlib"}
    assert all(status in ("skipped", "failed") and why for _, status, why in rows), rows
    assert unchanged


def test_grad_mode_seen_from_the_autosave_thread(kernel):
    """torch's grad mode is per thread: an autosave (a background thread) must save the mode
    the notebook's cells run with, not a new thread's default."""
    kernel.ok("import threading, torch\ntorch.set_grad_enabled(False)")
    kernel.ok("from jupyter_pause.checkpoint import procstate as _ps\n_got = []\n"
              "_t = threading.Thread(target=lambda: _got.append("
              "_ps.get('settings.torch').capture()))\n_t.start()\n_t.join(30)")
    assert kernel.eval("_got") == [{"grad_enabled": False}]
