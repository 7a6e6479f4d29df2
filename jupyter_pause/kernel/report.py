"""The short report that ends %checkpoint / %restore: one row per variable (HTML + text/plain)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

from ..units import format_bytes

_STATUS_COLOR = {
    "saved": "var(--jp-success-color1, #2e7d32)",
    "restored": "var(--jp-success-color1, #2e7d32)",
    "recomputed": "var(--jp-success-color1, #2e7d32)",
    "live": "var(--jp-success-color1, #2e7d32)",
    "skipped": "var(--jp-warn-color1, #ef6c00)",
    "stale": "var(--jp-warn-color1, #ef6c00)",
    "failed": "var(--jp-error-color1, #c62828)",
}
MAX_ROWS = 200  # a namespace of thousands of names should not flood the notebook


def variable_dict(v: Any) -> dict[str, Any]:
    """A VariableReport (dataclass, object or dict) as a plain JSON-able dict."""
    if isinstance(v, Mapping):
        d = dict(v)
    elif is_dataclass(v) and not isinstance(v, type):
        d = asdict(v)
    else:
        d = {k: getattr(v, k, None) for k in ("name", "kind", "size", "status", "reason", "cell")}
    cell = d.get("cell")
    if cell is not None and not isinstance(cell, dict):
        cell = variable_dict(cell) if is_dataclass(cell) else None
    out = {
        "name": d.get("name"),
        "kind": d.get("kind"),
        "size": d.get("size"),
        "status": d.get("status"),
        "reason": d.get("reason"),
        "cell": cell,
    }
    out["recomputable"] = bool(cell and cell.get("source")) and out["status"] in (
        "skipped",
        "stale",
        "failed",
    )
    return out


def apply_load_notes(rows: list[dict[str, Any]], notes: Mapping[str, list[str]]) -> None:
    """Rows of variables that came back only in part (e.g. a tensor without its autograd graph):
    not "restored" but "stale", with what was lost, so that --recompute re-runs their cell.
    The partial value stays in the namespace: it is still the best there is until then."""
    for r in rows:
        lost = notes.get(r["name"]) if r["status"] == "restored" else None
        if lost:
            r["status"] = "stale"
            r["reason"] = "; ".join(dict.fromkeys(lost))
            r["recomputable"] = bool(r.get("cell") and r["cell"].get("source"))


class Report:
    """Rendered by Jupyter as an HTML table, by terminals/tests as aligned text."""

    def __init__(self, title: str, variables: Iterable[Any], notes: Iterable[str] = ()) -> None:
        self.title = title
        self.rows = [variable_dict(v) for v in variables]
        self.notes = [n for n in notes if n]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out

    @staticmethod
    def _size(r: dict[str, Any]) -> str:
        # Nothing was measured for an object that could not be serialized.
        if not r.get("size") and r["status"] in ("skipped", "stale", "failed"):
            return "-"
        return format_bytes(r.get("size"))

    @staticmethod
    def _why(r: dict[str, Any]) -> str:
        why = r.get("reason") or ""
        cell = r.get("cell")
        if (
            r["status"] in ("skipped", "stale", "failed")
            and cell
            and cell.get("execution_count")
            and "cell [" not in why
        ):
            why = (
                f"{why}; defined in cell [{cell['execution_count']}]"
                if why
                else (f"defined in cell [{cell['execution_count']}]")
            )
        return why

    def __repr__(self) -> str:
        lines = [self.title]
        rows = self.rows[:MAX_ROWS]
        if rows:
            table = [("variable", "kind", "size", "status")] + [
                (
                    str(r["name"]),
                    str(r["kind"] or "-"),
                    self._size(r),
                    r["status"] + (f" ({self._why(r)})" if self._why(r) else ""),
                )
                for r in rows
            ]
            widths = [max(len(row[i]) for row in table) for i in range(3)]
            for row in table:
                lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[3])
        if len(self.rows) > MAX_ROWS:
            lines.append(f"... and {len(self.rows) - MAX_ROWS} more")
        lines.extend(self.notes)
        return "\n".join(line.rstrip() for line in lines)

    def _repr_html_(self) -> str:
        e = html.escape
        out = [f"<div class='jp-pause-report'><div><b>{e(self.title)}</b></div>"]
        if self.rows:
            out.append(
                "<table><thead><tr><th style='text-align:left'>variable</th>"
                "<th style='text-align:left'>kind</th><th>size</th>"
                "<th style='text-align:left'>status</th></tr></thead><tbody>"
            )
            for r in self.rows[:MAX_ROWS]:
                color = _STATUS_COLOR.get(r["status"], "inherit")
                why = self._why(r)
                src = (r.get("cell") or {}).get("source") or ""
                title = f" title='{e(src[:500], quote=True)}'" if src else ""
                out.append(
                    f"<tr><td style='text-align:left'><code>{e(str(r['name']))}</code></td>"
                    f"<td style='text-align:left'>{e(str(r['kind'] or '-'))}</td>"
                    f"<td style='text-align:right'>{e(self._size(r))}</td>"
                    f"<td style='text-align:left'{title}><span style='color:{color}'>"
                    f"{e(str(r['status']))}</span>{' — ' + e(why) if why else ''}</td></tr>"
                )
            out.append("</tbody></table>")
        if len(self.rows) > MAX_ROWS:
            out.append(f"<div>... and {len(self.rows) - MAX_ROWS} more</div>")
        out.extend(f"<div>{e(n)}</div>" for n in self.notes)
        out.append("</div>")
        return "".join(out)
