"""%checkpoint / %restore end to end in real kernels (needs the checkpoint engine)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)

TORCH_SETUP = (
    "import torch\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Linear(4, 2)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "view = model.weight[0]"
)
TORCH_FINGERPRINT = (
    "(model.weight.detach().tolist(), model.bias.detach().tolist(), "
    "opt.param_groups[0]['params'][0] is model.weight, "
    "opt.param_groups[0]['params'][1] is model.bias, opt.param_groups[0]['lr'], "
    "view.untyped_storage().data_ptr() == model.weight.untyped_storage().data_ptr())"
)
SETUP = [
    "import numpy as np\nimport pandas as pd",
    (
        "arr = np.arange(1000, dtype='float32').reshape(10, 100)\n"
        "df = pd.DataFrame({'a': range(5), 'b': list('abcde')})"
    ),
    (
        "sq = lambda v: v * v\n"
        "class Point:\n    def __init__(self, x):\n        self.x = x\n"
        "    def norm(self):\n        return abs(self.x)\n"
        "p = Point(-3)"
    ),
    "gen = (i * i for i in range(10))",
    "next(gen)",
]
FINGERPRINT = (
    "(arr.sum().item(), arr.shape, str(arr.dtype), df.to_dict(), "
    "sq(3), type(p).__name__, p.norm(), p.x, isinstance(p, Point))"
)


def _progress_seen(out, label: str) -> bool:
    return any(label in d.get("text/plain", "") for d in out.displays)


def _report(out) -> str:
    return "\n".join(d.get("text/plain", "") for d in out.displays)


def test_torch_model_and_optimizer_across_restart(kernel):
    kernel.ok(TORCH_SETUP)
    before = kernel.eval(TORCH_FINGERPRINT)
    assert before[2:4] == (True, True) and before[5]
    kernel.ok("%checkpoint")
    kernel.restart()
    kernel.ok("%load_ext jupyter_pause")
    kernel.ok("%restore --device cpu")
    assert kernel.eval(TORCH_FINGERPRINT) == before
    kernel.ok("opt.zero_grad()\nmodel(torch.ones(1, 4)).sum().backward()\nopt.step()")
    assert kernel.eval("view.tolist() == model.weight[0].tolist()")  # still one storage


def test_roundtrip_across_restart_and_recompute(kernel):
    for cell in SETUP:
        kernel.ok(cell)
    before = kernel.eval(FINGERPRINT)

    out = kernel.ok("%checkpoint")
    assert _progress_seen(out, "Checkpointing")
    assert any("text/html" in d and "<progress" in d["text/html"] for d in out.displays)
    report = _report(out)
    assert "Checkpoint " in report and "of analysis.ipynb" in report
    for name in ("arr", "df", "sq", "Point", "p"):
        assert f"\n{name} " in report, report
    assert "gen" in report and "skipped" in report
    assert "\nnp " not in report and "\npd " not in report  # modules are not variables

    kernel.restart()
    assert kernel.eval("'arr' in globals()") is False
    kernel.ok("%load_ext jupyter_pause")
    out = kernel.ok("%restore")
    assert _progress_seen(out, "Restoring")
    report = _report(out)
    assert "restored" in report and "%restore --recompute" in report
    assert kernel.eval(FINGERPRINT) == before
    assert kernel.eval("np.ones(2).tolist()") == [1.0, 1.0]  # module re-imported
    assert kernel.eval("'gen' in globals()") is False
    # provenance of restored variables is the original cell, not the %restore cell
    prov = kernel.eval(
        "{k: v['execution_count'] for k, v in "
        "get_ipython()._jupyter_pause_provenance.cells.items()}"
    )
    assert prov["arr"] == 3 and prov["sq"] == 4

    out = kernel.ok("%restore --recompute")
    report = _report(out)
    assert "recomputed" in report, report
    assert kernel.eval("next(gen)") == 0  # a fresh generator from the cell that defined it
    assert kernel.eval(FINGERPRINT) == before
    prov = kernel.eval(
        "{k: v['execution_count'] for k, v in "
        "get_ipython()._jupyter_pause_provenance.cells.items()}"
    )
    assert prov["gen"] == 5  # still the original cell, so the next checkpoint can rebuild it


def test_include_exclude_max_size_only(kernel):
    kernel.ok("import numpy as np\na = 1\nb = 'two'\nbig = np.zeros(300_000)")  # 2.3 MiB
    out = kernel.ok("%checkpoint --include a,big --max-size 1M")
    report = _report(out)
    assert "\na " in report and "saved" in report
    assert "big" in report and "skipped" in report
    kernel.ok("del a, b, big")
    kernel.ok("%restore")
    assert kernel.eval("('a' in globals(), 'b' in globals(), 'big' in globals())") == (
        True,
        False,
        False,
    )

    kernel.ok("b = 'two'\nbig = np.zeros(300_000)")
    kernel.ok("%checkpoint --exclude b")
    kernel.ok("del a, b, big")
    kernel.ok("%restore --only a")
    assert kernel.eval("('a' in globals(), 'b' in globals(), 'big' in globals())") == (
        True,
        False,
        False,
    )
    kernel.ok("%restore")
    assert kernel.eval("('a' in globals(), 'b' in globals(), big.shape)") == (
        True,
        False,
        (300_000,),
    )

    msg = kernel.run("%checkpoint --include nosuchvar")
    assert msg.status == "error" and "nosuchvar" in msg.stderr and "Traceback" not in msg.text


def test_recompute_failure_is_one_line_and_keeps_newer_values(kernel):
    kernel.ok("import pathlib\npath = 'data.txt'\npathlib.Path(path).write_text('hi')")
    kernel.ok("counter = 0\nnums = (i for i in range(3))")
    kernel.ok("counter = 5")
    kernel.ok("fh = open(path)")
    kernel.ok("%checkpoint")
    kernel.restart()
    kernel.ok("%load_ext jupyter_pause")
    kernel.ok("import os\nos.remove('data.txt')")
    out = kernel.ok("%restore --recompute")  # ok() also asserts no "Traceback" anywhere
    report = _report(out)
    fh_row = next(line for line in report.splitlines() if line.startswith("fh "))
    assert "failed" in fh_row and "No such file or directory: data.txt" in fh_row
    nums_row = next(line for line in report.splitlines() if line.startswith("nums "))
    assert "recomputed" in nums_row
    # re-running "counter = 0; nums = ..." must not undo the restored counter == 5
    assert kernel.eval("(counter, list(nums), 'fh' in globals())") == (5, [0, 1, 2], False)


def test_unrestored_variable_survives_a_second_pause(kernel):
    kernel.ok("base = 10")
    kernel.ok("gen = (base + i for i in range(3))")
    kernel.ok("%checkpoint")
    kernel.restart()
    kernel.ok("%load_ext jupyter_pause")
    kernel.ok("%restore")  # gen is not stored and not recomputed here ...
    kernel.ok("more = 1")
    kernel.ok("%checkpoint")  # ... and this checkpoint must still know how to rebuild it
    kernel.restart()
    kernel.ok("%load_ext jupyter_pause")
    out = kernel.ok("%restore --recompute")
    gen_row = next(ln for ln in _report(out).splitlines() if ln.startswith("gen "))
    assert "recomputed" in gen_row and "cell [3]" in gen_row
    assert kernel.eval("(list(gen), more)") == ([10, 11, 12], 1)


def _row(out, name: str) -> str:
    return next(ln for ln in _report(out).splitlines() if ln.startswith(f"{name} "))


def test_autograd_result_is_not_claimed_restored_and_recompute_rebuilds_it(kernel):
    kernel.ok(
        "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(3, 1)\n"
        "xb = torch.ones(4, 3)\nyb = torch.zeros(4, 1)"
    )
    kernel.ok("loss = torch.nn.functional.mse_loss(net(xb), yb)\nrow = net.weight[0]")
    value = kernel.eval("loss.item()")
    kernel.ok("%checkpoint")
    kernel.restart()
    kernel.ok("%load_ext jupyter_pause")
    out = kernel.ok("%restore")
    row = _row(out, "loss")
    assert "stale" in row and "without its autograd graph (grad_fn=MseLossBackward0)" in row
    assert "restored" in _row(out, "row")  # a view of a parameter: rebuilt with its graph
    assert kernel.eval("(loss.item(), loss.requires_grad)") == (value, False)
    assert kernel.eval("row._base is net.weight and row.grad_fn is not None") is True
    out = kernel.ok("%restore --recompute")
    assert "recomputed" in _row(out, "loss"), _report(out)
    kernel.ok("loss.backward()")
    assert kernel.eval("net.weight.grad is not None and loss.item()") == value


def test_open_files_reopened_when_unchanged_and_named_when_not(kernel):
    kernel.ok(
        "import pathlib\npathlib.Path('in.txt').write_text('a\\nb\\nc\\n')\n"
        "pathlib.Path('in.bin').write_bytes(bytes(range(64)))"
    )
    kernel.ok("rf = open('in.txt')\nfirst = rf.readline()\nbf = open('in.bin', 'rb')\nbf.read(5)")
    kernel.ok("log = open('out.txt', 'a')\nlog.write('once\\n')\nlog.flush()")
    out = kernel.ok("%checkpoint")
    assert "open for writing (mode 'a')" in _row(out, "log"), _report(out)
    kernel.restart()
    kernel.ok("%load_ext jupyter_pause")
    out = kernel.ok("%restore")
    assert "restored" in _row(out, "rf") and "restored" in _row(out, "bf")
    assert "stale" in _row(out, "log")
    assert kernel.eval("(rf.name, rf.mode, rf.readline(), bf.read(2), 'log' in globals())") == (
        "in.txt",
        "r",
        "b\n",
        b"\x05\x06",
        False,
    )
    assert kernel.eval("open('out.txt').read()") == "once\n"  # never appended twice
    kernel.restart()
    kernel.ok("%load_ext jupyter_pause")
    kernel.ok("pathlib = __import__('pathlib')\npathlib.Path('in.txt').write_text('a\\nB\\nc\\n')")
    out = kernel.ok("%restore")
    row = _row(out, "rf")
    assert "failed" in row and "in.txt changed since the checkpoint (same size, other" in row
    assert "restored" in _row(out, "bf")
    out = kernel.ok("%restore --recompute")
    assert "recomputed" in _row(out, "rf") and "recomputed" in _row(out, "log")
    assert kernel.eval("(first, rf.readline(), rf.readline())") == ("a\n", "B\n", "c\n")
