"""Small numeric helpers shared by the report and the what-if (no numpy needed)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def quantile(values: list[float], q: float) -> float | None:
    """Linear-interpolation quantile, the same as ``numpy.quantile``'s default."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Iterable[float]) -> dict:
    """``{"n", "p50", "p90", "max"}`` in seconds; None when there is nothing to measure."""
    xs = [float(v) for v in values if v is not None and v >= 0]
    return {
        "n": len(xs),
        "p50": quantile(xs, 0.5),
        "p90": quantile(xs, 0.9),
        "max": max(xs) if xs else None,
    }


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping union of ``[start, end)`` intervals (empty ones dropped)."""
    out: list[tuple[float, float]] = []
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def clip(intervals: Iterable[tuple[float, float]], start: float, end: float
         ) -> list[tuple[float, float]]:
    return [(max(s, start), min(e, end)) for s, e in intervals if min(e, end) > max(s, start)]


def total(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def hours(seconds: float) -> float:
    return seconds / 3600.0
