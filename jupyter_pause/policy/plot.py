"""PNG chart of the report and the what-if (matplotlib is optional: ``pip install matplotlib``)."""

from __future__ import annotations

from ..units import format_duration


class PlotUnavailable(RuntimeError):
    """--plot was asked for and matplotlib is not installed."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib, which is not installed "
            "(pip install 'jupyter_pause[plot]' or pip install matplotlib)") from None
    return plt


def write_plot(path: str, report: dict | None, whatif: dict | None) -> str:
    """Write a PNG with up to two panels: held vs released per period, and the what-if."""
    plt = _pyplot()
    panels = [p for p in (report, whatif) if p is not None]
    if not panels:
        raise ValueError("nothing to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    i = 0
    if report is not None:
        ax = axes[0][i]
        i += 1
        periods = report["periods"]
        labels = [p["start"][:10] for p in periods]
        held = [p["accelerator_hours_held"] for p in periods]
        rel = [p["accelerator_hours_released"] for p in periods]
        xs = list(range(len(labels)))
        ax.bar(xs, held, label="held", color="#d62728")
        ax.bar(xs, rel, bottom=held, label="released", color="#2ca02c")
        ax.set_xticks(list(xs), labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("accelerator-hours")
        ax.set_title(f"Accelerator held vs released (per {report['window']['period']})")
        top = max([h + r for h, r in zip(held, rel, strict=False)] or [0])
        ax.set_ylim(0, max(top, 1e-9) * 1.2)
        ax.legend(loc="upper center", ncol=2, fontsize=8)
    if whatif is not None:
        ax = axes[0][i]
        rows = whatif["thresholds"]
        labels = [format_duration(r["threshold_s"], exact=True) for r in rows]
        xs = list(range(len(rows)))
        bars = ax.bar(xs, [r["released_h"] for r in rows], color="#1f77b4", label="released")
        ax.axhline(whatif["upper_bound_h"], color="black", linestyle="--",
                   label=f"upper bound {whatif['upper_bound_h']:.1f} h (allocated - used)")
        for b, r in zip(bars, rows, strict=False):
            ax.annotate(f"{r['released_h']:.1f} h\n{r['pauses']} pauses\n"
                        f"{r['restarts']} restarts",
                        (b.get_x() + b.get_width() / 2, b.get_height() / 2),
                        ha="center", va="center", fontsize=8, color="white")
        ax.set_xticks(xs, labels)
        ax.set_xlabel("idle threshold")
        ax.set_ylabel("accelerator-hours released")
        ax.set_ylim(0, max(whatif["upper_bound_h"], 1e-9) * 1.25)
        ax.set_title(f"What-if: {whatif['allocated_h']:.0f} h allocated, "
                     f"{whatif['used_h']:.0f} h used")
        ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return path
