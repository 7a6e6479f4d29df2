"""Checks of configured values (``c.PauseApp.*``, the backends', ``c.IdlePolicy.*``) that traitlets'
types let through: a negative count, a device no restore knows, a size or URL that cannot be read.

Why not raise ``TraitError``: traitlets applies a config section in one block and rolls the
WHOLE section back when one value fails, and jupyter_server then only logs the failure and loads
the extension with every trait at its default (another store, another key). A workspace paused
before the mistake could then not be resumed, and nobody sees why. Instead each bad value is
replaced by its default, recorded in ``config_problems`` with the reason, and logged; the server
starts, status shows the reason (``can_pause: false``), pauses are refused, and a resume is
refused only when a value it needs is wrong (see :meth:`ValidatedConfig.config_refusal`).

Standard library and traitlets only (``fsspec`` is asked lazily for URL schemes), so the server,
the backends and the policy share it.
"""

from __future__ import annotations

import importlib.util
import math
import re
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from traitlets import Dict, HasTraits

Check = Callable[[Any], "str | None"]  # a value -> None when fine, else why not (one line)

_DEVICE_RE = re.compile(r"\A(auto|cpu|cuda(:\d+)?)\Z")
_SCHEME_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9+.-]*\Z")
_MAX_SECONDS = 1e10  # ~300 years: past it a "duration" is a typo (and overflows timers)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def seconds(*, positive: bool = False) -> Check:
    """A finite duration in seconds, >= 0 (> 0 with ``positive``)."""
    def check(value: Any) -> str | None:
        if not _number(value) or not math.isfinite(value) or value > _MAX_SECONDS:
            return f"{value!r} is not a finite number of seconds"
        if value < 0 or (positive and value == 0):
            return f"{value!r} must be {'more than' if positive else 'at least'} 0 seconds"
        return None
    return check


def count(value: Any) -> str | None:
    """A non-negative integer."""
    if not _number(value) or value != int(value) or value < 0:
        return f"{value!r} must be a whole number, 0 or more"
    return None


def device(value: Any) -> str | None:
    """Where restored tensors go: auto, cpu, cuda or cuda:N."""
    if not isinstance(value, str) or not _DEVICE_RE.match(value):
        return f"{value!r} is not a device (use auto, cpu, cuda or cuda:N)"
    return None


def store_memory(value: Any) -> str | None:
    """An object store's memory bound, read by the checkpoint library's own parser."""
    if value in ("", None):
        return None
    from .checkpoint.objectstore import memory_bound  # the parser the uploads use

    try:
        memory_bound(value)
    except Exception as e:  # noqa: BLE001 - CheckpointError: the library's one line
        return str(e)
    return None


def url_problem(value: str, *, what: str = "URL") -> str | None:
    """Why ``value`` cannot be read as a URL (``http://[::1`` ...), else None."""
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as e:
        return f"{value!r} is not a valid {what}: {e}"
    if not parts.scheme or not _SCHEME_RE.match(parts.scheme):
        return f"{value!r} is not a valid {what} (no scheme such as http://)"
    return None


def store_url(value: Any) -> str | None:
    """A directory, or an fsspec URL whose protocol is known and installed."""
    if not isinstance(value, str) or "://" not in value:
        return None  # a local directory (empty: the library's default)
    why = url_problem(value, what="store URL")
    if why:
        return why
    scheme = value.split("://", 1)[0].lower()
    if scheme == "file":
        return None
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:  # pragma: no cover - fsspec is a dependency
        return None
    if scheme in registry:
        return None
    impl = known_implementations.get(scheme)
    if impl is None:
        return f"{value!r}: unknown storage protocol {scheme!r} (use a directory, gs://, s3://)"
    module = impl["class"].split(".", 1)[0]
    if importlib.util.find_spec(module) is None:
        return f"{value!r} needs the {module} package, which is not installed"
    return None


def accelerator(value: Any) -> str | None:
    """``{"type": str, "count": N}`` (either may be left out)."""
    if not isinstance(value, dict):
        return f"{value!r} is not a dict like {{'type': 'nvidia-l4', 'count': 1}}"
    if "type" in value and not isinstance(value["type"], str):
        return f"type {value['type']!r} must be a string"
    if "count" in value and count(value["count"]):
        return f"count {value['count']!r} must be a whole number, 0 or more"
    return None


def gke_duration(value: Any) -> str | None:
    """A GKE policy duration such as 7d, 12h, 1y2mo ('' = none)."""
    if value == "" or (isinstance(value, str) and re.fullmatch(r"(\d+(y|mo|d|h|min))+", value)):
        return None
    return f"{value!r} is not a duration GKE reads (e.g. 7d, 12h, 30min; '' for none)"


class ValidatedConfig(HasTraits):
    """A configurable whose ``config_checks`` traits are checked when set (from config too).

    Subclasses list their checks in ``config_checks`` and route them with
    ``@validate(*config_checks)`` to :meth:`_checked` (traitlets needs the names at class
    definition). ``resume_traits`` are the values a resume needs as well as a pause."""

    config_checks: ClassVar[dict[str, Check]] = {}
    resume_traits: ClassVar[frozenset[str]] = frozenset()
    # trait name -> why its configured value was refused (its default is used instead)
    config_problems = Dict()

    def _checked(self, proposal: Any) -> Any:
        name, value = proposal["trait"].name, proposal["value"]
        why = type(self).config_checks[name](value)
        if why is None:
            self.config_problems.pop(name, None)
            return value
        self.config_problems[name] = why
        log = getattr(self, "log", None)
        if log is not None:
            log.error("jupyter_pause: invalid %s.%s: %s", type(self).__name__, name, why)
        return self.trait_defaults(name)

    def problem_lines(self, traits: Iterable[str] | None = None) -> list[str]:
        """``Class.trait: why`` for each refused value (of ``traits`` only, when given)."""
        want = None if traits is None else set(traits)
        return [f"{type(self).__name__}.{n}: {w}" for n, w in sorted(self.config_problems.items())
                if want is None or n in want]

    def config_refusal(self, action: str) -> list[str]:
        """The refused values that stop ``action`` ("pause": all; "resume": ``resume_traits``)."""
        return self.problem_lines(None if action == "pause" else self.resume_traits)
