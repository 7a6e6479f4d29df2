"""Variable provenance: which cell (execution count + source) last assigned each user variable.

Cost per cell: one ``{name: id(value)}`` snapshot of the namespace before the cell and one
comparison after it (no hashing, no traversal of values), plus an AST walk of the cell's own
source for assignment targets, which catches rebinding that keeps the object's id (``x += 0``,
a list rebound to itself, ...). In-place mutation (``lst.append``) is not an assignment and does
not move a variable's provenance: re-running the assigning cell is what rebuilds it.
"""

from __future__ import annotations

import ast
import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from .namespace import is_user_name

log = logging.getLogger(__name__)

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def assigned_names(source: str) -> set[str]:
    """Module-level names bound by ``source`` (assignments, imports, def/class, for/with targets).

    Does not look inside function or class bodies (their names are local) and ignores
    comprehension variables (they have their own scope)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name.split(".")[0])
            continue
        if isinstance(
            node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
        ):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
            continue
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        if isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        stack.extend(ast.iter_child_nodes(node))
    return names


class Provenance:
    """Records, per variable, the last cell that assigned it. One per kernel (see :func:`install`)."""

    def __init__(self, ip: Any) -> None:
        self.ip = ip
        self.cells: dict[str, dict[str, Any]] = {}
        self._before: dict[int, dict[str, int]] = {}
        self._adopted: set[str] = set()  # names set by our own code during the current cell
        # Variables a restore could not bring back and nobody re-ran yet: name -> cell. Carried
        # into the next checkpoint so that their recipe is not lost by pausing again.
        self.pending: dict[str, dict[str, Any]] = {}
        self._suspended = 0

    # -- IPython events ----------------------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        if self._suspended:
            return
        try:
            self._before[id(info)] = {k: id(v) for k, v in self.ip.user_ns.items()}
            self._adopted = set()
        except Exception:
            log.debug("provenance snapshot failed", exc_info=True)

    def post_run_cell(self, result: Any) -> None:
        if self._suspended or result is None:
            return
        try:
            self._record(result)
        except Exception:
            log.debug("provenance update failed", exc_info=True)

    def _record(self, result: Any) -> None:
        info = getattr(result, "info", None)
        before = self._before.pop(id(info), None)
        if len(self._before) > 8:  # a pre without its post (should not happen): drop stale ones
            self._before.clear()
        source = getattr(info, "raw_cell", None) or ""
        count = getattr(result, "execution_count", None)
        if not getattr(info, "store_history", True) or not source.strip():
            # nested/helper cells (ours or other tools') are not cells of the notebook
            return
        ns = self.ip.user_ns
        hidden = self.ip.user_ns_hidden
        changed: set[str] = set()
        if before is not None:
            changed = {k for k, v in ns.items() if before.get(k) != id(v)}
            for gone in set(before) - set(ns):
                self.cells.pop(gone, None)
        try:
            transformed = self.ip.transform_cell(source)
        except Exception:  # noqa: BLE001
            transformed = source
        changed |= assigned_names(transformed) & set(ns)
        changed -= self._adopted
        self._adopted = set()
        cell = {"execution_count": count, "source": source}
        for name in changed:
            if name in ns and is_user_name(name, ns[name], hidden):
                self.cells[name] = cell
                self.pending.pop(name, None)

    # -- used by restore / recompute -------------------------------------------------------------
    def adopt(self, cells: Mapping[str, Mapping[str, Any] | None]) -> None:
        """Set provenance for names our own code bound (restored or recomputed values), and keep
        the running cell (e.g. ``%restore``) from claiming them."""
        for name, cell in cells.items():
            self._adopted.add(name)
            self.pending.pop(name, None)
            if cell:
                self.cells[name] = {
                    "execution_count": cell.get("execution_count"),
                    "source": cell.get("source", ""),
                }

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Cells we run ourselves (recompute) are not recorded as the notebook's cells."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    def backfill(self) -> None:
        """Provenance of cells run before the hooks were installed, from IPython's input history
        (AST targets only: the cell that last assigned each name still bound)."""
        try:
            history = list(self.ip.history_manager.input_hist_raw)
        except Exception:  # noqa: BLE001 - no history: nothing to backfill
            return
        ns = self.ip.user_ns
        hidden = self.ip.user_ns_hidden
        for count, source in enumerate(history):
            if not count or not isinstance(source, str) or not source.strip():
                continue
            try:
                transformed = self.ip.transform_cell(source)
            except Exception:  # noqa: BLE001 - fall back to the raw text
                transformed = source
            cell = {"execution_count": count, "source": source}
            for name in assigned_names(transformed):
                if name in ns and is_user_name(name, ns[name], hidden):
                    self.cells[name] = dict(cell)

    def snapshot(self, names: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """The provenance to store with a checkpoint (for ``names`` only, if given)."""
        if names is None:
            return {k: dict(v) for k, v in self.cells.items()}
        return {k: dict(self.cells[k]) for k in names if k in self.cells}


def get(ip: Any) -> Provenance | None:
    return getattr(ip, "_jupyter_pause_provenance", None)


def install(ip: Any) -> Provenance:
    """Register the hooks once per shell; idempotent."""
    prov = get(ip)
    if prov is None:
        keep_random_stream(ip)
        prov = Provenance(ip)
        prov.backfill()
        ip._jupyter_pause_provenance = prov
        ip.events.register("pre_run_cell", prov.pre_run_cell)
        ip.events.register("post_run_cell", prov.post_run_cell)
    return prov


def uninstall(ip: Any) -> None:
    prov = get(ip)
    if prov is None:
        return
    for event, cb in (("pre_run_cell", prov.pre_run_cell), ("post_run_cell", prov.post_run_cell)):
        with contextlib.suppress(ValueError):
            ip.events.unregister(event, cb)
    del ip._jupyter_pause_provenance


def keep_random_stream(ip: Any) -> None:
    """IPython's banner picks its tip with the global ``random.choice`` (IPython/core/tips.py,
    ``pick_tip``), and ipykernel builds the banner for every ``kernel_info_request``: each client
    that connects or probes the kernel (a browser tab, the server's liveness checks) advanced the
    notebook's seeded random stream, so a paused experiment drew other numbers than one never
    paused. The tip only shows in a terminal console's banner."""
    if getattr(ip, "enable_tip", False):
        ip.enable_tip = False
