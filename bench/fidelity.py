"""Restore fidelity: run notebooks, checkpoint, restore into a fresh kernel, compare every variable.

    python bench/fidelity.py FOLDER [--method pause] [--method dill] [--no-recompute]

For each ``*.ipynb`` in FOLDER (sorted), with each method:
- run every code cell with nbclient in a real ipykernel (pause: after ``%load_ext jupyter_pause``);
- fingerprint every user variable (value and aliasing, see ``fidelity_fp.py``);
- checkpoint: ``%checkpoint`` (pause) or ``dill.dump_module`` (dill);
- start a fresh kernel and restore: ``%restore --recompute`` (pause; plain ``%restore`` with
  ``--no-recompute``) or ``dill.load_module`` (dill);
- fingerprint again and compare, variable by variable.
A notebook counts as restored when every variable came back equal. Prints one row per notebook
with the methods side by side, then the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FP_MODULE = Path(__file__).resolve().with_name("fidelity_fp.py")
MARK = "JPF-FINGERPRINTS:"
METHODS = ("pause", "dill")


@dataclass
class Result:
    notebook: str
    method: str
    original: dict[str, str] = field(default_factory=dict)  # name -> fingerprint
    restored: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # the notebook itself failed to run (not a restore failure)
    restore_output: str = ""
    seconds: float = 0.0

    @property
    def equal(self) -> list[str]:
        return [n for n, h in self.original.items() if self.restored.get(n) == h]

    @property
    def lost(self) -> list[str]:
        return [n for n, h in self.original.items() if self.restored.get(n) != h]

    @property
    def ok(self) -> bool:
        return self.error is None and not self.lost


def _fp_cell(detail: bool = False) -> str:
    # everything it binds starts with "_jpf" (not a user variable) and is deleted again, so
    # neither the checkpoint nor dill.dump_module sees it
    return (
        "import importlib.util as _jpf_u, json as _jpf_j\n"
        f"_jpf_s = _jpf_u.spec_from_file_location('_jpf_fp', {str(FP_MODULE)!r})\n"
        "_jpf_m = _jpf_u.module_from_spec(_jpf_s)\n"
        "_jpf_s.loader.exec_module(_jpf_m)\n"
        f"print({MARK!r} + _jpf_j.dumps(_jpf_m.fingerprints(globals(), {detail})))\n"
        "del _jpf_u, _jpf_j, _jpf_s, _jpf_m"
    )


def kernel_env(data_dir: Path, session: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["JUPYTER_DATA_DIR"] = str(data_dir / "data")  # checkpoints and key of this run only
    env["JUPYTER_RUNTIME_DIR"] = str(data_dir / "runtime")
    env["JPY_SESSION_NAME"] = session
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    env["MPLBACKEND"] = "Agg"
    for var in ("JUPYTER_PAUSE_STORE_URL", "JUPYTER_PAUSE_KEY_PATH", "JUPYTER_PAUSE_SERVER_URL"):
        env.pop(var, None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


class _Run:
    """One kernel executing cells through nbclient, collecting their text output."""

    def __init__(self, env: dict[str, str], cwd: str, timeout: int) -> None:
        import nbformat
        from nbclient import NotebookClient

        self.nb = nbformat.v4.new_notebook()
        self.client = NotebookClient(
            self.nb, timeout=timeout, kernel_name="python3", allow_errors=True
        )
        self.env, self.cwd = env, cwd
        self._cm: Any = None

    def __enter__(self) -> _Run:
        self._cm = self.client.setup_kernel(env=self.env, cwd=self.cwd)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)

    def cell(self, source: str) -> tuple[bool, str]:
        """Run one cell; (succeeded, its text output)."""
        import nbformat

        cell = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        texts, ok = [], True
        for o in cell.outputs:
            if o.output_type == "stream":
                texts.append(o.text)
            elif o.output_type in ("display_data", "execute_result"):
                texts.append(o.get("data", {}).get("text/plain", ""))
            elif o.output_type == "error":
                ok = False
                texts.append(f"{o.ename}: {o.evalue}")
        return ok, "".join(t if t.endswith("\n") else t + "\n" for t in texts)

    def fingerprints(self, detail: bool = False) -> dict[str, str]:
        _ok, text = self.cell(_fp_cell(detail))
        for line in text.splitlines():
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        raise RuntimeError(f"fingerprinting failed: {text[-500:]}")


def run_notebook(
    path: Path, method: str, *, recompute: bool = True, timeout: int = 120, detail: bool = False
) -> Result:
    """Run ``path`` with ``method`` (pause|dill) and compare the restore with the original."""
    import nbformat

    t0 = time.monotonic()
    res = Result(path.name, method)
    nb = nbformat.read(str(path), as_version=4)
    sources = [c.source for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    with tempfile.TemporaryDirectory(prefix="jpf-") as tmp:
        tmpd = Path(tmp)
        env = kernel_env(tmpd, path.name)
        cwd = str(path.parent)  # relative paths in the notebook resolve as when run by hand
        dump = tmpd / "session.pkl"
        with _Run(env, cwd, timeout) as k:
            if method == "pause":
                k.cell("%load_ext jupyter_pause")
            for i, src in enumerate(sources):
                ok, text = k.cell(src)
                if not ok:
                    res.error = f"cell {i + 1} failed: {text.strip().splitlines()[-1:]}"
                    res.seconds = time.monotonic() - t0
                    return res
            res.original = k.fingerprints(detail)
            if method == "pause":
                ok, text = k.cell("%checkpoint")
            else:
                ok, text = k.cell(f"__import__('dill').dump_module({str(dump)!r})")
            res.restore_output = text
            if not ok:  # nothing was saved: every variable is lost
                res.seconds = time.monotonic() - t0
                return res
        with _Run(env, cwd, timeout) as k:
            if method == "pause":
                k.cell("%load_ext jupyter_pause")
                ok, text = k.cell("%restore --recompute" if recompute else "%restore")
            else:
                ok, text = k.cell(f"__import__('dill').load_module({str(dump)!r})")
            res.restore_output += text
            if ok:
                res.restored = k.fingerprints(detail)
    res.seconds = time.monotonic() - t0
    return res


def explain(before: str, after: str | None, width: int = 200) -> str:
    """Where two detailed fingerprints first differ."""
    if after is None:
        return "missing after restore"
    i = next(
        (i for i, (x, y) in enumerate(zip(before, after, strict=False)) if x != y), min(len(before), len(after))
    )
    lo = max(0, i - width // 2)
    return f"before ...{before[lo : i + width]!r}\n#     after  ...{after[lo : i + width]!r}"


def table(results: dict[str, dict[str, Result]], methods: list[str]) -> str:
    """Notebook rows, one column per method (variables equal / total), then totals."""
    names = sorted(results)
    w = max([len(n) for n in names] + [8])
    head = f"{'notebook':<{w}}  " + "  ".join(f"{m:>14}" for m in methods)
    lines = [head, "-" * len(head)]
    tot = {m: [0, 0, 0] for m in methods}  # notebooks ok, variables equal, variables
    for n in names:
        cells = []
        for m in methods:
            r = results[n].get(m)
            if r is None:
                cells.append(f"{'-':>14}")
                continue
            if r.error:
                cells.append(f"{'error':>14}")
                continue
            eq, total = len(r.equal), len(r.original)
            tot[m][0] += r.ok
            tot[m][1] += eq
            tot[m][2] += total
            cells.append(f"{('ok ' if r.ok else 'LOST ') + f'{eq}/{total}':>14}")
        lines.append(f"{n:<{w}}  " + "  ".join(cells))
    lines.append("-" * len(head))
    lines.append(
        f"{'notebooks':<{w}}  " + "  ".join(f"{f'{tot[m][0]}/{len(names)}':>14}" for m in methods)
    )
    lines.append(
        f"{'variables':<{w}}  " + "  ".join(f"{f'{tot[m][1]}/{tot[m][2]}':>14}" for m in methods)
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--method", action="append", choices=METHODS)
    ap.add_argument("--no-recompute", action="store_true", help="pause: plain %%restore")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per cell")
    ap.add_argument("-v", "--verbose", action="store_true", help="name the variables lost")
    ap.add_argument("--explain", action="store_true", help="show where each lost one differs")
    a = ap.parse_args(argv)
    methods = a.method or list(METHODS)
    paths = sorted(a.folder.glob("*.ipynb"))
    if not paths:
        ap.error(f"no notebooks in {a.folder}")
    results: dict[str, dict[str, Result]] = {}
    for p in paths:
        for m in methods:
            r = run_notebook(
                p, m, recompute=not a.no_recompute, timeout=a.timeout, detail=a.explain
            )
            results.setdefault(p.name, {})[m] = r
            if a.verbose and (r.lost or r.error):
                print(f"# {p.name} [{m}]: {r.error or 'lost ' + ', '.join(r.lost)}", flush=True)
            if a.explain:
                for line in r.restore_output.splitlines():
                    if any(w in line for w in (" failed", " skipped", " stale")):
                        print(f"#   | {line.strip()[:300]}")
                for n in r.lost:
                    print(f"#   {n}: {explain(r.original[n], r.restored.get(n))}", flush=True)
    print(table(results, methods))
    return 0


if __name__ == "__main__":
    sys.exit(main())
