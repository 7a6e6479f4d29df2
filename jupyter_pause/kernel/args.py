"""Argument parsing for the magics: every mistake becomes ONE clear line (a ``UsageError``)."""

from __future__ import annotations

import argparse
import re
import shlex
from typing import Any, NoReturn

from IPython.core.error import UsageError

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class HelpShown(Exception):
    """``-h``/``--help`` printed the usage; the magic has nothing else to do."""


def parse_size(text: str) -> int:
    """``"500M"`` -> 524288000; units K, M, G, T are powers of 1024 (``2GB``/``2GiB`` also read)."""
    m = _SIZE_RE.match(text or "")
    if not m:
        raise ValueError(f"cannot read {text!r} as a size (use e.g. 500M or 2G)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return int(value)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _device(text: str) -> str:
    if not _DEVICE_RE.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not auto, cpu or cuda:N")
    return text


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a variable name")
    return names


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            raise UsageError(f"{self.prog}: {message.strip()}")
        raise HelpShown()


def _parser(prog: str, description: str) -> _Parser:
    return _Parser(prog=f"%{prog}", description=description, add_help=True, allow_abbrev=False)


def _add_names(p: argparse.ArgumentParser, flag: str, help_: str) -> None:
    p.add_argument(flag, metavar="NAMES", type=_names, nargs="+", action="extend", help=help_)


def checkpoint_parser() -> _Parser:
    p = _parser("checkpoint", "Write a checkpoint of this kernel's variables.")
    p.add_argument(
        "--to",
        metavar="PATH_OR_URL",
        dest="store",
        help="checkpoint store: a directory or an fsspec URL (default: the configured store)",
    )
    _add_names(p, "--include", "only these variables (comma or space separated)")
    _add_names(p, "--exclude", "leave these variables out")
    p.add_argument(
        "--max-size",
        metavar="SIZE",
        type=_size,
        help="skip variables larger than SIZE (e.g. 500M, 2G)",
    )
    p.add_argument("--stream", help="checkpoint lineage (default: this notebook's path)")
    p.add_argument("--keep", type=int, metavar="N", help="keep the last N checkpoints (default 5)")
    return p


def restore_parser() -> _Parser:
    p = _parser("restore", "Restore variables from the latest (or a given) checkpoint.")
    p.add_argument(
        "--from",
        metavar="PATH_OR_URL",
        dest="store",
        help="checkpoint store: a directory or an fsspec URL",
    )
    p.add_argument(
        "--device",
        default="auto",
        type=_device,
        help="where tensors go: auto, cpu or cuda:N (default auto)",
    )
    _add_names(p, "--only", "restore only these variables")
    p.add_argument(
        "--recompute",
        action="store_true",
        help="re-run the recorded cells of variables that could not be stored",
    )
    p.add_argument("--id", dest="checkpoint_id", help="a checkpoint id (default: the latest)")
    p.add_argument("--stream", help="checkpoint lineage (default: this notebook's path)")
    return p


def pause_parser() -> _Parser:
    p = _parser("pause", "Pause this workspace (checkpoint, then free the accelerator).")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--never", action="store_true", help="never pause this kernel automatically")
    g.add_argument("--allow", action="store_true", help="allow pausing this kernel again")
    return p


def resume_parser() -> _Parser:
    p = _parser("resume", "Resume the workspace; restores this kernel if it is a fresh one.")
    p.add_argument("--device", default="auto", type=_device)
    p.add_argument("--recompute", action="store_true")
    return p


def parse(parser: _Parser, line: str) -> argparse.Namespace:
    try:
        argv = shlex.split(line or "")
    except ValueError as e:
        raise UsageError(f"{parser.prog}: {e}") from None
    ns: Any = parser.parse_args(argv)
    for attr in ("include", "exclude", "only"):  # each value is a list (commas): flatten
        value = getattr(ns, attr, None)
        if value is not None:
            setattr(ns, attr, [n for group in value for n in group])
    return ns
