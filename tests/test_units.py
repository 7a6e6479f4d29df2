"""The one byte formatter and the one duration parser that the CLI, reports and magics share."""

from __future__ import annotations

import argparse

import pytest

from jupyter_pause.cli.policy import parse_age
from jupyter_pause.units import format_bytes, format_duration, parse_duration


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5 << 20, "5.0 MiB"),
    (3 << 30, "3.0 GiB"), (2 << 40, "2.0 TiB"), (5000 << 40, "5000.0 TiB"), ("2048", "2.0 KiB"),
    (None, "-"), ("n/a", "-"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("text, seconds", [
    ("90", 90), ("90s", 90), ("15m", 900), ("15min", 900), ("1.5h", 5400), (" 7D ", 7 * 86400),
    ("2w", 14 * 86400), (30, 30),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_durations_are_one_line_errors_and_the_cli_says_so():
    for bad in ("soon", "", "-5m"):
        with pytest.raises(ValueError):
            parse_duration(bad)
        with pytest.raises(argparse.ArgumentTypeError):
            parse_age(bad)
    assert parse_age(None) is None and parse_age("12h") == 12 * 3600


@pytest.mark.parametrize("seconds, text, exact", [
    (None, "-", "-"), (2, "2.0s", "2s"), (90, "1.5m", "90s"), (900, "15.0m", "15m"),
    (5400, "1.5h", "90m"), (3600, "1.0h", "1h"), (0, "0.0s", "0s"),
])
def test_format_duration(seconds, text, exact):
    assert format_duration(seconds) == text
    assert format_duration(seconds, exact=True) == exact
    if seconds is not None:
        assert parse_duration(format_duration(seconds, exact=True)) == seconds
