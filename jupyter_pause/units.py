"""Byte counts and durations as people read and write them (standard library only, so the
kernel side, the server, the policy tools and the CLI share it)."""

from __future__ import annotations

import math
from typing import Any

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def format_bytes(n: Any) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units); ``"-"`` for None or anything not a number."""
    try:
        n = float(n)
    except (TypeError, ValueError):
        return "-"
    for unit in _BYTE_UNITS:
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def parse_duration(text: str | float) -> float:
    """``90``, ``90s``, ``15m``, ``15min``, ``1h``, ``1.5h``, ``7d``, ``2w`` -> seconds.

    Raises ValueError (one line) for anything else or a negative duration.
    """
    if isinstance(text, (int, float)):
        return float(text)
    t = text.strip().lower()
    try:
        if t and t[-1] in _SECONDS:
            value = float(t[:-1]) * _SECONDS[t[-1]]
        elif t.endswith("min"):
            value = float(t[:-3]) * 60
        else:
            value = float(t)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 1h, 7d)") from None
    if not math.isfinite(value):  # NaN passes every bound
        raise ValueError(f"not a finite duration: {text!r}")
    if value < 0:
        raise ValueError(f"a duration cannot be negative: {text!r}")
    return value


def format_duration(seconds: Any, *, exact: bool = False) -> str:
    """Seconds as people read them: ``5400`` -> ``"1.5h"``, ``90`` -> ``"1.5m"``, ``2`` ->
    ``"2.0s"``; ``"-"`` for None or anything not a number.

    ``exact=True`` gives the form :func:`parse_duration` reads back unchanged: the largest unit
    that divides it, ``3600`` -> ``"1h"``, ``900`` -> ``"15m"``, ``90`` -> ``"90s"``.
    """
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return "-"
    if exact:
        for unit, size in (("h", 3600), ("m", 60)):
            if s >= size and s % size == 0:
                return f"{int(s // size)}{unit}"
        return f"{s:g}s"
    for unit, size in (("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit}"
    return f"{s:.1f}s"
