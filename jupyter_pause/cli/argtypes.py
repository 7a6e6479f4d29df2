"""argparse types for the numeric options of ``jupyter pause``: a bad value is a usage error
(exit 2, one line), never a traceback, an exit 1 from deep inside, or a value silently used."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

_MAX = 1e10  # seconds (~300 years) or counts: past it a value is a typo


def count(text: str) -> int:
    """A whole number, 0 or more (``--keep``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0 or value > _MAX:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def number(*, positive: bool = False) -> Callable[[str], float]:
    """A finite number >= 0 (> 0 with ``positive``): seconds, counts, prices."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value > _MAX:
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(
                f"{text!r} must be {'more than' if positive else 'at least'} 0")
        return value
    parse.__name__ = "number"  # argparse names the type in "invalid number value"
    return parse
