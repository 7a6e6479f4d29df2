"""Every failure reason the package raises is in the one vocabulary, so none is counted as other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from jupyter_pause.cluster.reasons import FAILURE_REASONS, reason_label
from jupyter_pause.server import metrics

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_pause"
# A reason label is one snake_case word; sentences (a row's reason for a person) are not labels.
LABEL = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")


def _labels(node: ast.AST | None) -> list[str]:
    """The string constants an expression can evaluate to (through ``a if c else b`` and
    ``a or b``), when they look like labels."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) and LABEL.fullmatch(node.value) else []
    if isinstance(node, ast.IfExp):
        return _labels(node.body) + _labels(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [x for v in node.values for x in _labels(v)]
    return []


def reason_literals() -> dict[str, list[str]]:
    """label -> where it is given: ``reason=...`` arguments, ``reason = ...`` assignments,
    ``"reason": ...`` entries and ``reason`` parameter defaults, in every module of the package."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            values: list[ast.AST | None] = []
            if isinstance(node, ast.keyword) and node.arg == "reason":
                values.append(node.value)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "reason" for t in targets):
                    values.append(node.value)
            elif isinstance(node, ast.Dict):
                values.extend(v for k, v in zip(node.keys, node.values, strict=False)
                              if isinstance(k, ast.Constant) and k.value == "reason")
            elif isinstance(node, ast.arguments):
                params = [*node.posonlyargs, *node.args]
                defaults = [None] * (len(params) - len(node.defaults)) + list(node.defaults)
                values.extend(d for a, d in zip(params, defaults, strict=False) if a.arg == "reason")
                values.extend(d for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=False)
                              if a.arg == "reason")
            for label in (x for v in values for x in _labels(v)):
                found.setdefault(label, []).append(f"{rel}:{getattr(node, 'lineno', '?')}")
    return found


def test_every_reason_the_package_gives_is_in_the_vocabulary():
    found = reason_literals()
    # The scan sees the backends' and the lifecycle's reasons (it is not looking at nothing).
    assert {"snapshot_timeout", "rbac", "not_in_pod", "kernel_died", "interrupted"} <= set(found)
    missing = {label: where for label, where in found.items() if label not in FAILURE_REASONS}
    assert not missing, f"add these to jupyter_pause/cluster/reasons.py: {missing}"


def test_metrics_keep_known_reasons_and_bound_the_rest():
    for reason in FAILURE_REASONS:
        assert metrics.failure_reason(reason) == reason == reason_label(reason)
    assert metrics.failure_reason("something new") == "other"
    assert metrics.failure_reason(None) == "other"
