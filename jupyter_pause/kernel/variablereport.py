"""The short report that ends %checkpoint / %restore: one row per variable (HTML + text/plain)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

from ..units import format_bytes
from ..variables import RECOMPUTABLE, VariableRow, as_row, counts, set_status, summary

_OK, _WARN = "var(--jp-success-color1, #2e7d32)", "var(--jp-warn-color1, #ef6c00)"
_STATUS_COLOR: dict[str | None, str] = {"saved": _OK, "restored": _OK, "recomputed": _OK, "live": _OK,
                 "skipped": _WARN, "stale": _WARN, "failed": "var(--jp-error-color1, #c62828)"}
MAX_ROWS = 200  # a namespace of thousands of names should not flood the notebook
# The report as JSON next to text and HTML: JupyterLab's Checkpoint Now / Restore from
# Checkpoint commands read their result from it instead of the printed text.
REPORT_MIME = "application/vnd.jupyter-pause.report+json"


def apply_load_notes(rows: list[VariableRow], notes: Mapping[str, list[str]]) -> None:
    """Rows of variables that came back only in part (e.g. a tensor without its autograd graph):
    not "restored" but "stale", with what was lost, so that --recompute re-runs their cell.
    The partial value stays in the namespace: it is still the best there is until then."""
    for r in rows:
        name = r["name"]
        lost = notes.get(name) if r["status"] == "restored" and name is not None else None
        if lost:
            set_status(r, "stale", "; ".join(dict.fromkeys(lost)))


class Report:
    """Rendered by Jupyter as an HTML table, by terminals/tests as aligned text."""

    def __init__(self, title: str, variables: Iterable[Any], notes: Iterable[str] = ()) -> None:
        self.title = title
        self.rows = [as_row(v) for v in variables]
        self.notes = [n for n in notes if n]

    def counts(self) -> dict[str, int]:
        return counts(self.rows)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        # IPython adds text/plain and text/html from __repr__ and _repr_html_.
        return {
            REPORT_MIME: {
                "title": self.title,
                "summary": summary(self.rows),
                "rows": [dict(r) for r in self.rows[:MAX_ROWS]],
                "notes": self.notes,
            }
        }

    @staticmethod
    def _size(r: VariableRow) -> str:
        # Nothing was measured for an object that could not be serialized.
        if not r.get("size") and r["status"] in RECOMPUTABLE:
            return "-"
        return format_bytes(r.get("size"))

    @staticmethod
    def _why(r: VariableRow) -> str:
        why = r.get("reason") or ""
        cell = r.get("cell")
        if (
            r["status"] in RECOMPUTABLE
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
                    str(r["status"]) + (f" ({self._why(r)})" if self._why(r) else ""),
                )
                for r in rows
            ]
            widths = [max(len(row[i]) for row in table) for i in range(3)]
            for row in table:
                lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[3])
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
