"""Plain-text tables for the report and the what-if (what `jupyter pause report` prints)."""

from __future__ import annotations

from ..journal import iso
from ..units import format_bytes, format_duration


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths, strict=False)))
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _dist(d: dict) -> str:
    if not d["n"]:
        return "-"
    return "/".join(format_duration(d[k]) for k in ("p50", "p90", "max"))


def render_report(report: dict) -> str:
    w = report["window"]
    out = [f"Accelerator report {w['start']} .. {w['end']} (per {w['period']})"]
    header = ["period", "held h", "released h", "pauses ok/fail", "resumes live/rest/fresh/fail",
              "ckpt written", "pause p50/p90/max", "resume p50/p90/max"]
    rows = []
    for p in [*report["periods"], {**report["totals"], "start": "total"}]:
        pa, re = p["pauses"], p["resumes"]
        rows.append([
            p["start"][:10] if p["start"] != "total" else "total",
            f"{p['accelerator_hours_held']:.2f}",
            f"{p['accelerator_hours_released']:.2f}",
            f"{pa['completed']}/{pa['failed']}",
            f"{re['live']}/{re['restored']}/{re['fresh']}/{re['failed']}",
            format_bytes(p["sizes"]["checkpoint_bytes_written"]),
            _dist(p["time_to_pause_s"]),
            _dist(p["time_to_resume_s"]),
        ])
    out.append(_table(header, rows))
    t = report["totals"]
    reasons = {**{f"pause: {k}": v for k, v in t["pauses"]["failed_by_reason"].items()},
               **{f"resume: {k}": v for k, v in t["resumes"]["failed_by_reason"].items()}}
    if reasons:
        out.append("Failures by reason: " + "; ".join(f"{k} x{v}" for k, v in reasons.items()))
    if t["pauses"]["by_trigger"]:
        out.append("Pauses by trigger: " + ", ".join(
            f"{k} {v}" for k, v in sorted(t["pauses"]["by_trigger"].items())))
    rc = t.get("recoveries") or {}
    if rc.get("kernel_deaths") or rc.get("server_kills"):
        out.append(
            f"Recoveries: kernels died {rc['kernel_deaths']}, servers killed "
            f"{rc['server_kills']}; offered {rc['offered']}, restored {rc['restored']}, "
            f"dismissed {rc['dismissed']}; work lost {rc['cells_lost']} cells, "
            f"{format_duration(rc['seconds_lost'])} since the autosaves")
    st = t.get("stops") or {}
    if st.get("total"):
        line = (f"Server stops: {st['total']} ("
                + ", ".join(f"{k} {v}" for k, v in sorted(st["by_trigger"].items()))
                + f"); kernels saved {st['kernels_saved']}, not saved {st['kernels_not_saved']}")
        if st["not_saved_by_reason"]:
            line += " (" + ", ".join(f"{k} {v}" for k, v in
                                     sorted(st["not_saved_by_reason"].items())) + ")"
        line += f"; restored after the stop {st['restored_after']}"
        if st["restore_failed_after"]:
            line += f", failed {st['restore_failed_after']}"
        if st["interrupted"]:
            line += f"; killed during the shutdown checkpoint {st['interrupted']}"
        out.append(line + f"; stop p50/p90/max {_dist(t['time_to_stop_s'])}")
    if t["sizes"]["snapshots"]:
        out.append(f"Snapshots: {t['sizes']['snapshots']} "
                   f"({format_bytes(t['sizes']['snapshot_bytes'])})")
    if report["journal"]["skipped_lines"]:
        out.append(f"Skipped {report['journal']['skipped_lines']} unreadable journal line(s).")
    return "\n".join(out)


def render_whatif(w: dict) -> str:
    price = w.get("price_per_hour")
    out = [
        (f"What-if over {iso(w['window']['start'])} .. {iso(w['window']['end'])}: "
         f"{w['allocated_h']:.1f} h allocated, {w['used_h']:.1f} h used, "
         f"at most {w['upper_bound_h']:.1f} h can be released"),
        (f"capture {format_duration(w['capture_s'])} per pause, "
         f"restore {format_duration(w['restore_s'])} per restart "
         f"({w.get('costs_source', 'flags')})"),
    ]
    header = ["idle after", "pauses", "restarts", "released h", "held h", "of max",
              "capture h", "waiting h"]
    if price is not None:
        header.append("saved")
    rows = []
    for r in w["thresholds"]:
        row = [format_duration(r["threshold_s"], exact=True), str(r["pauses"]),
               str(r["restarts"]),
               f"{r['released_h']:.2f}", f"{r['held_h']:.2f}",
               f"{100 * r['share_of_upper_bound']:.0f}%", f"{r['capture_h']:.2f}",
               f"{r['restore_wait_h']:.2f}"]
        if price is not None:
            row.append(f"{r['saved']:.2f}")
        rows.append(row)
    out.append(_table(header, rows))
    return "\n".join(out)
