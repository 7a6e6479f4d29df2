"""Argument types and parsing for the magics, whose options are declared with IPython's
``magic_arguments``: every mistake becomes ONE clear line (a ``UsageError``)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import ArgDecorator

from ..checkpoint import CheckpointError
from ..checkpoint.objectstore import parse_size

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class HelpShown(Exception):
    """``-h``/``--help`` printed the usage; the magic has nothing else to do."""


class exclusive(ArgDecorator):  # lower case, like magic_arguments' own decorators
    """The arguments declared after it are mutually exclusive (argparse's group)."""

    def add_to_parser(self, parser: argparse.ArgumentParser, group: Any) -> Any:
        return parser.add_mutually_exclusive_group()


def size(text: str) -> int:
    """``"500M"`` -> 524288000; units K, M, G, T are powers of 1024 (``2GB``/``2GiB`` also read)."""
    try:
        value = parse_size(text)
    except CheckpointError:
        raise argparse.ArgumentTypeError(
            f"cannot read {text!r} as a size (use e.g. 500M or 2G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def device(text: str) -> str:
    """``auto``, ``cpu`` or ``cuda:N``."""
    if not _DEVICE_RE.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not auto, cpu or cuda:N")
    return text


def names(text: str) -> list[str]:
    """Variable names separated by commas (``--include a,b c`` gives a, b and c)."""
    found = [n.strip() for n in text.split(",") if n.strip()]
    if not found:
        raise argparse.ArgumentTypeError("expected a variable name")
    return found


def parse(magic: Callable[..., Any], line: str) -> argparse.Namespace:
    """The options of ``line`` for a magic declared with ``magic_arguments``.

    POSIX quoting (``shlex``), as in a shell: IPython's own ``parse_argstring`` keeps the quotes
    around a quoted path. ``HelpShown`` after ``--help``; every mistake one ``UsageError``."""
    prog = f"%{magic.__name__}"
    # IPython's (untyped) magic_arguments attaches the parser to the function at run time
    parser: argparse.ArgumentParser = magic.parser  # type: ignore[attr-defined]
    parser.allow_abbrev = False  # "--max" must not quietly mean --max-size (or, later, another)
    try:
        ns = parser.parse_args(shlex.split(line or ""))
    except ValueError as e:  # shlex: an unclosed quote
        raise UsageError(f"{prog}: {e}") from None
    except UsageError as e:
        raise UsageError(f"{prog}: {e} (see {prog} --help)") from None
    except SystemExit:  # argparse printed the help
        raise HelpShown() from None
    for attr in ("include", "exclude", "only"):  # each value is a list (commas): flatten
        value = getattr(ns, attr, None)
        if value is not None:
            setattr(ns, attr, [n for group in value for n in group])
    return ns
