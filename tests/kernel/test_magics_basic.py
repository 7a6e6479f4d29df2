"""Magics that need no checkpoint engine: loading, provenance, argument errors, %pause/%resume."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(60)


def _one_error_line(out) -> str:
    assert out.status == "error"
    assert "Traceback" not in out.text
    assert out.errors == []  # no iopub error message (that is what renders a traceback)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_load_ext_registers_magics_and_provenance(kernel):
    magics = kernel.eval("sorted(get_ipython().magics_manager.magics['line'])")
    for name in ("checkpoint", "restore", "pause", "resume"):
        assert name in magics
    kernel.ok("x = 1\ny = [1, 2]")
    kernel.ok("x += 0")  # same object (small int): only the AST catches the rebinding
    kernel.ok("y.append(3)")  # mutation is not an assignment
    kernel.ok("def f(a):\n    inner = a\n    return inner\nclass C: pass\nfor i in range(2): pass")
    kernel.ok("import math as m\n_hidden = 1\nz = [k for k in range(3)]\n(w := 5)")
    kernel.ok("del z")
    cells = kernel.eval(
        "{k: (v['execution_count'], v['source']) for k, v in "
        "get_ipython()._jupyter_pause_provenance.cells.items()}"
    )
    assert cells["x"] == (3, "x += 0")
    assert cells["y"][0] == 2
    assert cells["f"][0] == cells["C"][0] == cells["i"][0] == 5
    assert cells["w"][0] == 6
    for name in ("inner", "a", "k", "m", "_hidden", "z", "In", "Out", "_", "_i3"):
        assert name not in cells


def test_provenance_ignores_silent_and_failed_cells_keep_partial(kernel):
    kernel.ok("a = 1")
    kernel.run("a = 2", silent=True)  # e.g. the server's own silent executions
    out = kernel.run("b = 5\nraise ValueError('boom')")
    assert out.status == "error"
    cells = kernel.eval(
        "{k: v['execution_count'] for k, v in "
        "get_ipython()._jupyter_pause_provenance.cells.items()}"
    )
    assert cells == {"a": 2, "b": 3}


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("%checkpoint --bogus", "unrecognized arguments: --bogus"),
        ("%checkpoint --max-size 12X", "cannot read '12X' as a size"),
        ("%checkpoint --include", "expected at least one argument"),
        ("%restore --device gpu7", "'gpu7' is not auto, cpu or cuda:N"),
        ("%restore --only", "expected at least one argument"),
        ("%restore --from 'unclosed", "No closing quotation"),
        ("%pause --never --allow", "not allowed with argument"),
    ],
)
def test_bad_flags_one_line(shared_kernel, line, fragment):
    shared_kernel.ok("keep = 42")
    out = shared_kernel.run(line)
    msg = _one_error_line(out)
    assert fragment in msg
    assert msg.startswith("UsageError: %")
    assert shared_kernel.eval("keep") == 42


def test_help_prints_usage(shared_kernel):
    out = shared_kernel.ok("%checkpoint --help")
    assert "--max-size SIZE" in out.stdout


def test_pause_toggle_never_allow(kernel):
    out = kernel.ok("%pause --never")
    assert "never be paused automatically" in out.stdout
    assert kernel.eval("__import__('jupyter_pause.kernel.liveness', fromlist=['_']).never_pause()")
    kernel.ok("%pause --allow")
    assert not kernel.eval(
        "__import__('jupyter_pause.kernel.liveness', fromlist=['_']).never_pause()"
    )


def test_pause_and_resume_without_server(kernel):
    for magic in ("%pause", "%resume"):
        msg = _one_error_line(kernel.run(magic))
        assert "no running Jupyter server found" in msg


def test_unload_removes_magics(kernel):
    kernel.ok("%unload_ext jupyter_pause")
    assert "checkpoint" not in kernel.eval("list(get_ipython().magics_manager.magics['line'])")
    assert not kernel.eval("hasattr(get_ipython(), '_jupyter_pause_provenance')")


def test_provenance_backfilled_from_history(kernel_factory):
    k = kernel_factory()
    k.ok("a = 1")
    k.ok("b = a + 1\na = 5")
    k.ok("%load_ext jupyter_pause")
    k.ok("c = 3")
    cells = k.eval(
        "{k: v['execution_count'] for k, v in "
        "get_ipython()._jupyter_pause_provenance.cells.items()}"
    )
    assert cells == {"a": 2, "b": 2, "c": 4}
