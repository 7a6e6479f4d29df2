"""Continuation: after a pause, do the next cells give what they would have given unpaused?

    python bench/continuation.py FOLDER [--method pause] [--method dill] [--json PATH]
                                        [--jobs N] [--recompute] [-v]

For each ``*.ipynb`` in FOLDER (sorted), every code cell run with nbclient in real ipykernels
(the driver of ``fidelity.py``):
- **uninterrupted, twice**. A cell whose outputs differ between these two runs is
  nondeterministic and not judged;
- **pause**: the cells up to the split, ``%checkpoint``, a fresh kernel, ``%load_ext
  jupyter_pause`` and ``%restore`` (``--recompute`` with the option), then the remaining cells;
- **dill**: the same with ``dill.dump_module`` / ``dill.load_module``.
The split is after the first code cell tagged ``split`` in its metadata, else after the middle
cell. The bench's own cells run with ``store_history=False``, as the Pause button's silent
requests do, so they take no execution count and the notebook's own cells keep their numbers.

Judged, per cell after the split: the execution count, stream text (stdout and stderr),
``text/plain`` of execute results and displays, and the ``ename`` of errors. Images are
excluded (a display's ``text/plain``, e.g. ``<Figure size 640x480 with 1 Axes>``, is compared).
Normalised: memory addresses (``0x7f...``) and the file ipykernel compiles a cell into (named
after the kernel's pid, it appears in warnings) everywhere, and every number in a cell tagged
``timing``; nothing else.

Each judged difference is *named* when the restore report gives a reason for it:
- a variable the report lists as not restored (skipped, stale, failed, missing), when the cell
  uses it, directly or through names that earlier cells after the split defined from it;
- an entry of the report that is not a user variable (process state: a random generator, the
  working directory, a setting, the execution counter) and did not come back: it may touch any
  later cell, so it names every difference of that notebook;
- the checkpoint or the restore itself failing.
dill reports nothing, so its differences are named only when its dump or load failed.

Prints each differing cell with a short diff and its reasons (or ``UNNAMED``), then per
notebook and in total, for each method, the judged cells identical and a mark: ``ok`` (it
continues identically), ``named`` (it does not, and every difference has a reason), ``DIFF``
(a difference without one); the load average with the figures. ``--json`` writes the same as
JSON. Passes run ``--jobs`` at a time, each in its own process and kernels.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def _load_fidelity() -> Any:
    """The notebook driver shared with the fidelity bench, loaded from its file under a name of
    its own: on ``sys.path`` as ``fidelity`` it would shadow the test suite's package of that
    name when the suite imports this bench."""
    name = "jupyter_pause_bench_fidelity"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("fidelity.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


fidelity = _load_fidelity()

METHODS = ("pause", "dill")
SPLIT_TAG, TIMING_TAG = "split", "timing"
REPORT_MIME = "application/vnd.jupyter-pause.report+json"
PROCESS_KIND = "process state"  # the kind of a report row that is process state, not a variable
# statuses of a report row whose value or state is back as it was
BACK = {"restored", "live", "recomputed", "saved"}
ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
# the file ipykernel compiles a cell into, named after the kernel's pid, in warnings
CELL_FILE = re.compile(r"(?:/[^\s\"':]*)?/ipykernel_\d+/\d+\.py")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
# the bench's kernels: one thread each (2 runs share 2 cores without oversubscription; the same
# count in every run), no model hub
KERNEL_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
              "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "TQDM_DISABLE": "1"}


@dataclass
class Cell:
    """What one executed cell showed, normalised for comparison."""

    count: int | None
    outputs: list[list[str]]  # [kind, text]: ["stdout", ...], ["result", ...], ["error", ename]
    error: str = ""  # "ename: evalue" of an error, for the diff and the reasons

    def key(self) -> tuple[Any, ...]:
        return (self.count, tuple(tuple(o) for o in self.outputs))


@dataclass
class Run:
    """One pass over a notebook: the cells after the split (all cells for an uninterrupted run)."""

    cells: list[Cell] = field(default_factory=list)
    reasons: list[dict[str, Any]] = field(default_factory=list)  # rows the report did not restore
    failure: str = ""  # the checkpoint or restore itself failed
    error: str = ""  # the pass itself could not run (a kernel did not start): nothing judged
    restore_output: str = ""
    seconds: float = 0.0


@dataclass
class Difference:
    cell: int  # 1-based among the notebook's code cells
    diff: str
    reasons: list[str]


@dataclass
class Judged:
    identical: list[int] = field(default_factory=list)
    differing: list[Difference] = field(default_factory=list)
    failure: str = ""

    @property
    def continues(self) -> bool:
        return not self.differing

    @property
    def unnamed(self) -> list[Difference]:
        return [d for d in self.differing if not d.reasons]


@dataclass
class Notebook:
    name: str
    cells: int
    split_after: int
    judged: list[int] = field(default_factory=list)
    nondeterministic: list[int] = field(default_factory=list)
    reference_errors: list[str] = field(default_factory=list)  # errors of the unpaused run
    methods: dict[str, Judged] = field(default_factory=dict)
    seconds: float = 0.0


# ---------------------------------------------------------------------------- the notebook


def code_cells(path: Path) -> list[tuple[str, list[str]]]:
    """(source, tags) of each non-empty code cell."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    return [(c.source, list(c.get("metadata", {}).get("tags", [])))
            for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def split_point(cells: Sequence[tuple[str, list[str]]]) -> int:
    """How many cells run before the pause: through the first tagged ``split``, else half."""
    for i, (_src, tags) in enumerate(cells):
        if SPLIT_TAG in tags:
            return i + 1
    return max(1, len(cells) // 2)


def normalise(text: str, timing: bool) -> str:
    text = CELL_FILE.sub("<cell>.py", ADDRESS.sub("0x?", text))
    return NUMBER.sub("<n>", text) if timing else text


def read_cell(cell: Any, timing: bool) -> Cell:
    """The judged content of an executed nbformat cell; consecutive streams merged."""
    outs: list[list[str]] = []
    error = ""
    for o in cell.outputs:
        if o.output_type == "stream":
            text = normalise(o.text, timing)
            if outs and outs[-1][0] == o.name:
                outs[-1][1] += text
            else:
                outs.append([o.name, text])
        elif o.output_type in ("execute_result", "display_data"):
            kind = "result" if o.output_type == "execute_result" else "display"
            outs.append([kind, normalise(o.get("data", {}).get("text/plain", ""), timing)])
        elif o.output_type == "error":
            outs.append(["error", o.ename])
            error = f"{o.ename}: {o.evalue}"
    return Cell(cell.get("execution_count"), outs, error)


def _kernel(env: dict[str, str], cwd: str, timeout: int, ipc: Path) -> Any:
    """A started ``fidelity._Run`` kernel on IPC sockets under ``ipc``: TCP ports picked free
    and released race with every other kernel started meanwhile on the machine ("Address
    already in use", "Kernel died before replying")."""
    from jupyter_client.manager import AsyncKernelManager

    ipc.parent.mkdir(parents=True, exist_ok=True)
    k = fidelity._Run(env, cwd, timeout)
    k.client.km = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=str(ipc))
    k.__enter__()
    return k


def _execute(k: Any, source: str, history: bool = True) -> Any:
    """Run one cell in a ``fidelity._Run`` kernel; the executed nbformat cell."""
    import nbformat

    cell = nbformat.v4.new_code_cell(source)
    k.nb.cells.append(cell)
    k.client.execute_cell(cell, len(k.nb.cells) - 1, store_history=history)
    return cell


def _text(cell: Any) -> str:
    c = read_cell(cell, timing=False)
    return "\n".join([t.rstrip("\n") for kind, t in c.outputs if kind != "error"]
                     + ([c.error] if c.error else []))


def _failed(cell: Any) -> str:
    return read_cell(cell, timing=False).error


def report_rows(cell: Any) -> list[dict[str, Any]]:
    """Every row (a dict with ``name`` and ``status``) of the jupyter-pause reports a cell
    displayed, wherever in the report's JSON it sits (variables or process state)."""
    found: list[dict[str, Any]] = []

    def walk(x: Any, section: str) -> None:
        if isinstance(x, Mapping):
            if "name" in x and "status" in x:
                found.append({**x, "_section": section})
                return
            for k, v in x.items():
                walk(v, section if k == "rows" else k)
        elif isinstance(x, list):
            for v in x:
                walk(v, section)

    for o in cell.outputs:
        if o.output_type in ("display_data", "execute_result"):
            walk(o.get("data", {}).get(REPORT_MIME), "rows")
    return found


# ---------------------------------------------------------------------------- one pass


def run_pass(path: str, mode: str, recompute: bool = False, timeout: int = 120,
             after_restore: str = "") -> Run:
    """``mode``: ``plain`` (uninterrupted), ``pause`` or ``dill``. ``after_restore``: code run
    silently right after the restore (the tests break a restore with it)."""
    t0 = time.monotonic()
    nb_path = Path(path)
    cells = code_cells(nb_path)
    split = split_point(cells)
    out = Run()
    with tempfile.TemporaryDirectory(prefix="jpc-") as tmp:
        tmpd = Path(tmp)
        (tmpd / "tmp").mkdir()
        # both kernels of a pass share the store, the key and the temporary directory, as the
        # kernels of one notebook on one volume do across a pause
        env = {**fidelity.kernel_env(tmpd, nb_path.name), **KERNEL_ENV, "TMPDIR": str(tmpd / "tmp")}
        cwd = str(nb_path.parent)
        dump = tmpd / "session.pkl"
        k = _kernel(env, cwd, timeout, tmpd / "ipc" / "k1")
        try:
            if mode == "pause":
                _execute(k, "%load_ext jupyter_pause", history=False)
            for i, (src, tags) in enumerate(cells):
                if mode != "plain" and i == split:
                    cell = _execute(k, "%checkpoint" if mode == "pause" else
                                    f"__import__('dill').dump_module({str(dump)!r})",
                                    history=False)
                    out.restore_output = _text(cell)
                    out.reasons += [r for r in report_rows(cell) if r.get("status") not in BACK]
                    if _failed(cell):
                        out.failure = f"checkpoint failed: {_failed(cell)}"
                    k.__exit__(None, None, None)
                    k = None
                    k = _kernel(env, cwd, timeout, tmpd / "ipc" / "k2")
                    if mode == "pause":
                        _execute(k, "%load_ext jupyter_pause", history=False)
                        cell = _execute(k, "%restore --recompute" if recompute else "%restore",
                                        history=False)
                        out.reasons += [r for r in report_rows(cell)
                                        if r.get("status") not in BACK]
                    else:
                        cell = _execute(k, f"__import__('dill').load_module({str(dump)!r})",
                                        history=False)
                    out.restore_output += "\n" + _text(cell)
                    if _failed(cell) and not out.failure:
                        out.failure = f"restore failed: {_failed(cell)}"
                    if after_restore:
                        _execute(k, after_restore, history=False)
                cell = _execute(k, src)
                out.cells.append(read_cell(cell, TIMING_TAG in tags))
        finally:
            if k is not None:
                k.__exit__(None, None, None)
    out.seconds = time.monotonic() - t0
    return out


# ---------------------------------------------------------------------------- the judge


def _names(source: str) -> tuple[set[str], set[str], dict[str, str]]:
    """(names a cell reads, names it binds, import aliases -> module) of a cell's source."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        words = set(re.findall(r"[A-Za-z_]\w*", source))
        return words, set(), {}
    reads, binds, aliases = set(), set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (reads if isinstance(node.ctx, ast.Load) else binds).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                binds.add(bound)
                aliases[bound] = (node.module or a.name) if isinstance(node, ast.ImportFrom) \
                    else a.name
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(node.name)
    return reads, binds, aliases


def uses(sources: Sequence[str], index: int) -> set[str]:
    """The names cell ``index`` of ``sources`` depends on: what it reads, and what the cells
    before it in ``sources`` that bound those names read in turn."""
    parsed = [_names(s) for s in sources]
    need = set(parsed[index][0])
    for j in range(index - 1, -1, -1):
        reads, binds, _ = parsed[j]
        if need & binds:
            need |= reads
    return need


def short_diff(want: Cell, got: Cell, width: int = 160) -> str:
    if want.count != got.count:
        head = f"execution count [{want.count}] -> [{got.count}]"
        if want.outputs == got.outputs:
            return head
    else:
        head = ""

    def lines(c: Cell) -> list[str]:
        return [f"{kind}: {line}" for kind, text in c.outputs
                for line in (c.error.splitlines()[:1] if kind == "error" else text.splitlines())]

    d = [ln for ln in difflib.unified_diff(lines(want), lines(got), lineterm="", n=0)
         if not ln.startswith(("---", "+++", "@@"))]
    body = " | ".join(s[:width] for s in d[:4]) + (" | ..." if len(d) > 4 else "")
    return f"{head}; {body}" if head else body


def _reason_text(r: Mapping[str, Any]) -> str:
    why = r.get("reason") or ""
    return f"{r.get('name')}: {r.get('status')}" + (f" ({why})" if why else "")


def judge(ref: Run, got: Run, judged: list[int], sources: Sequence[str], first: int) -> Judged:
    """Compare ``got`` with the reference ``ref`` (both runs of every cell) on the ``judged``
    cells (1-based; ``first`` is the first cell after the split); name each difference's
    reasons."""
    res = Judged(failure=got.failure or got.error)
    if got.error:  # nothing to compare: every judged cell differs, for no reason of the product
        res.differing = [Difference(n, got.error, []) for n in judged]
        return res
    per_var: dict[str, list[str]] = {}
    everywhere: list[str] = []  # process state (and anything else not a variable) not back
    counter: list[str] = []  # the execution counter not back: names count differences only
    for r in got.reasons:
        name = str(r.get("name"))
        if r.get("kind") == PROCESS_KIND or r.get("_section") != "rows":
            (counter if "execution count" in name.lower() else everywhere).append(
                _reason_text(r))
        else:
            per_var.setdefault(name, []).append(_reason_text(r))
    if got.failure:
        everywhere.append(got.failure)
    after = list(sources[first - 1:])
    for n in judged:
        want = ref.cells[n - 1]
        have = got.cells[n - 1] if n <= len(got.cells) else Cell(None, [])
        if want.key() == have.key():
            res.identical.append(n)
            continue
        reasons = list(everywhere)
        if want.count != have.count:
            reasons += counter
        need = uses(after, n - first)
        missing = re.findall(r"name '(\w+)' is not defined", have.error)
        for var, why in per_var.items():
            if var in need or var in missing:
                reasons += why
        if want.outputs != have.outputs and not (set(reasons) - set(counter)):
            reasons = []  # the outputs differ too, and only the count was explained
        res.differing.append(Difference(n, short_diff(want, have), list(dict.fromkeys(reasons))))
    return res


def compare(path: Path, methods: Sequence[str], passes: Mapping[str, Run]) -> Notebook:
    cells = code_cells(path)
    split = split_point(cells)
    a, b = passes["plain-1"], passes["plain-2"]
    nb = Notebook(path.name, len(cells), split)
    nb.reference_errors = [f"cell {i + 1}: {c.error}" for i, c in enumerate(a.cells) if c.error]
    nb.reference_errors += [r.error for r in (a, b) if r.error]
    for n in range(split + 1, len(cells) + 1 if not (a.error or b.error) else 0):
        (nb.judged if a.cells[n - 1].key() == b.cells[n - 1].key()
         else nb.nondeterministic).append(n)
    sources = [s for s, _ in cells]
    for m in methods:
        nb.methods[m] = judge(a, passes[m], nb.judged, sources, split + 1)
    nb.seconds = sum(p.seconds for p in passes.values())
    return nb


def _task(args: tuple[str, str, bool, int, str]) -> Run:
    path, mode, recompute, timeout, after = args
    try:
        run = run_pass(path, "plain" if mode.startswith("plain") else mode, recompute,
                       timeout, after)
    except Exception as e:  # noqa: BLE001 - one pass that cannot run must not end the rest
        run = Run(error=f"{mode} pass did not run: {type(e).__name__}: {e}")
    print(f"# {Path(path).name} [{mode}]: {run.seconds:.0f} s"
          + (f", {run.error or run.failure}" if run.error or run.failure else ""),
          file=sys.stderr, flush=True)
    return run


def run_folder(paths: Sequence[Path], methods: Sequence[str] = METHODS, *, jobs: int = 2,
               recompute: bool = False, timeout: int = 120,
               after_restore: Mapping[str, str] | None = None) -> list[Notebook]:
    """Every pass of every notebook (``jobs`` at a time, each in its own process and kernels),
    then the judgement of each notebook. ``after_restore``: notebook name -> code run right
    after its restores (to break them on purpose)."""
    modes = ["plain-1", "plain-2", *methods]
    tasks = [(str(p), m, recompute, timeout, (after_restore or {}).get(p.name, ""))
             for p in paths for m in modes]
    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as ex:
            runs = list(ex.map(_task, tasks))
    else:
        runs = [_task(t) for t in tasks]
    out = []
    for i, p in enumerate(paths):
        passes = dict(zip(modes, runs[i * len(modes):(i + 1) * len(modes)], strict=False))
        out.append(compare(p, methods, passes))
    return out


# ---------------------------------------------------------------------------- the report


def table(notebooks: Sequence[Notebook], methods: Sequence[str]) -> str:
    w = max([len(n.name) for n in notebooks] + [9])
    head = (f"{'notebook':<{w}}  {'split':>5}  {'judged':>6}  {'nondet':>6}  "
            + "  ".join(f"{m + ' same':>14}" for m in methods))
    lines = [head, "-" * len(head)]
    tot = {m: [0, 0] for m in methods}
    for nb in notebooks:
        row = [(f"{nb.name:<{w}}  {nb.split_after:>5}  {len(nb.judged):>6}  "
                f"{len(nb.nondeterministic):>6}")]
        for m in methods:
            j = nb.methods[m]
            tot[m][0] += j.continues
            tot[m][1] += len(j.identical)
            mark = "ok" if j.continues else ("named" if not j.unnamed else "DIFF")
            row.append(f"{f'{mark} {len(j.identical)}/{len(nb.judged)}':>14}")
        lines.append("  ".join(row))
    lines.append("-" * len(head))
    judged = sum(len(nb.judged) for nb in notebooks)
    pad = w + 25
    for what, per in (
        ("continue identically", lambda m: f"{tot[m][0]}/{len(notebooks)}"),
        ("judged cells identical", lambda m: f"{tot[m][1]}/{judged}"),
        ("differences unnamed",
         lambda m: str(sum(len(nb.methods[m].unnamed) for nb in notebooks))),
    ):
        lines.append(f"{what:<{pad}}" + "  ".join(f"{per(m):>14}" for m in methods))
    return "\n".join(lines)


def details(notebooks: Sequence[Notebook], methods: Sequence[str]) -> str:
    lines = []
    for nb in notebooks:
        if nb.nondeterministic:
            lines.append(f"# {nb.name}: not judged (differ between two unpaused runs): cells "
                         + ", ".join(map(str, nb.nondeterministic)))
        for e in nb.reference_errors:
            lines.append(f"# {nb.name}: the unpaused run itself raised in {e}")
        for m in methods:
            for d in nb.methods[m].differing:
                why = "; ".join(d.reasons) if d.reasons else "UNNAMED"
                lines.append(f"# {nb.name} [{m}] cell {d.cell}: {d.diff}\n#     reason: {why}")
    return "\n".join(lines)


def summary_json(notebooks: Sequence[Notebook], methods: Sequence[str],
                 load: Sequence[float]) -> dict[str, Any]:
    judged = sum(len(nb.judged) for nb in notebooks)
    return {
        "load_average": list(load),
        "cpus": os.cpu_count(),
        "notebooks": [asdict(nb) for nb in notebooks],
        "totals": {m: {
            "notebooks": len(notebooks),
            "continue_identically": sum(nb.methods[m].continues for nb in notebooks),
            "judged_cells": judged,
            "judged_cells_identical": sum(len(nb.methods[m].identical) for nb in notebooks),
            "differences_unnamed": sum(len(nb.methods[m].unnamed) for nb in notebooks),
        } for m in methods},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--method", action="append", choices=METHODS)
    ap.add_argument("--recompute", action="store_true", help="pause: %%restore --recompute")
    ap.add_argument("--jobs", type=int, default=2, help="passes run at the same time")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per cell")
    ap.add_argument("--json", type=Path, help="write the summary here as JSON")
    a = ap.parse_args(argv)
    methods = a.method or list(METHODS)
    paths = sorted(a.folder.glob("*.ipynb"))
    if not paths:
        ap.error(f"no notebooks in {a.folder}")
    t0 = time.monotonic()
    notebooks = run_folder(paths, methods, jobs=a.jobs, recompute=a.recompute,
                           timeout=a.timeout)
    load = os.getloadavg()
    print(details(notebooks, methods))
    print(table(notebooks, methods))
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; "
          f"{time.monotonic() - t0:.0f} s wall, {a.jobs} passes at a time")
    if a.json:
        a.json.write_text(json.dumps(summary_json(notebooks, methods, load), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
