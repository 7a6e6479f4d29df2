"""Typed, bounded request input for every route: bodies and query values.

A tiny schema (field -> type and bounds) instead of ``bool(body.get(...))``: ``"false"`` is a
string, not a boolean, and is refused rather than read as true. The raw body is checked for size
and nesting before ``json.loads`` ever sees it, so ``[`` x 100000 is a 400, not a RecursionError.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_BODY = 64 * 1024  # bytes; every body of this API is a handful of small fields
MAX_DEPTH = 8  # the deepest body (recompute's names list) nests 2
MAX_TEXT = 200  # free-text fields (trigger)
MAX_PATH = 4096


class BadRequest(ValueError):
    """Input that does not match the route's schema: a 400 with this one-line message."""


@dataclass(frozen=True)
class Field:
    kind: str  # "str" | "bool" | "int" | "number" | "str_list"
    max_len: int = MAX_TEXT
    choices: tuple[str, ...] | None = None
    pattern: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    max_items: int = 1000
    nullable: bool = True
    required: bool = False


def _name(kind: str) -> str:
    return {"str": "a string", "bool": "true or false", "int": "an integer",
            "number": "a finite number", "str_list": "a list of strings"}[kind]


def _check_value(name: str, value: Any, f: Field) -> Any:
    if value is None:
        if f.nullable and not f.required:
            return None
        raise BadRequest(f"{name} must be {_name(f.kind)}, not null")
    if f.kind == "bool":
        if not isinstance(value, bool):
            raise BadRequest(f"{name} must be true or false, not {json.dumps(value)[:40]}")
        return value
    if f.kind in ("int", "number"):
        ok = (isinstance(value, int) if f.kind == "int" else isinstance(value, (int, float)))
        if isinstance(value, bool) or not ok or not math.isfinite(value):
            raise BadRequest(f"{name} must be {_name(f.kind)}")
        if (f.minimum is not None and value < f.minimum) or (
            f.maximum is not None and value > f.maximum
        ):
            raise BadRequest(f"{name} must be between {f.minimum:g} and {f.maximum:g}"
                             if f.maximum is not None else f"{name} must be >= {f.minimum:g}")
        return value
    if f.kind == "str":
        return _check_str(name, value, f)
    if f.kind == "str_list":
        if not isinstance(value, list) or len(value) > f.max_items:
            raise BadRequest(f"{name} must be a list of at most {f.max_items} strings")
        return [_check_str(f"{name}[{i}]", v, f) for i, v in enumerate(value)]
    raise AssertionError(f.kind)


def _check_str(name: str, value: Any, f: Field) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    if len(value) > f.max_len:
        raise BadRequest(f"{name} is longer than {f.max_len} characters")
    if f.choices is not None and value not in f.choices:
        raise BadRequest(f"{name} must be one of {', '.join(f.choices)}")
    if f.pattern is not None and not re.fullmatch(f.pattern, value):
        raise BadRequest(f"{name} has characters that are not allowed")
    return value


def check(data: dict[str, Any], schema: dict[str, Field]) -> dict[str, Any]:
    """The fields of ``data`` typed and bounded by ``schema``; unknown fields are refused (a
    typo such as "interupt" must not be silently ignored)."""
    unknown = sorted(set(data) - set(schema))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0][:40]!r} (expected {', '.join(schema)})")
    out: dict[str, Any] = {}
    for name, f in schema.items():
        if name not in data:
            if f.required:
                raise BadRequest(f"{name} is required")
            out[name] = None
            continue
        out[name] = _check_value(name, data[name], f)
    return out


def _depth(raw: str) -> int:
    """The nesting depth of JSON text, counted without parsing (brackets in strings skipped)."""
    depth = deepest = 0
    in_str = esc = False
    for ch in raw:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_body(raw: bytes | None, schema: dict[str, Field]) -> dict[str, Any]:
    """A JSON object body, bounded and typed (an empty body is ``{}``)."""
    if not raw:
        return check({}, schema)
    if len(raw) > MAX_BODY:
        raise BadRequest(f"the request body is larger than {MAX_BODY // 1024} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the request body is not UTF-8") from None
    if _depth(text) > MAX_DEPTH:
        raise BadRequest(f"the request body nests deeper than {MAX_DEPTH} levels")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise BadRequest("the request body is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return check(data, schema)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python accepts them, JSON does not


def query_number(name: str, value: str | None, *, minimum: float, maximum: float) -> float | None:
    """A finite number from a query string (``nan``, ``inf``, ``1e400`` are refused)."""
    if value is None or value == "":
        return None
    if len(value) > 40:
        raise BadRequest(f"{name} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise BadRequest(f"{name} must be a finite number") from None
    return _check_value(name, number, Field("number", minimum=minimum, maximum=maximum))


def query_str(name: str, value: str | None, f: Field) -> str | None:
    if value is None:
        return None
    return _check_str(name, value, f)


# ------------------------------------------------------------------------------ route schemas

TRIGGER = Field("str", max_len=MAX_TEXT)
PAUSE = {"trigger": TRIGGER, "interrupt": Field("bool"),
         "mode": Field("str", choices=("pause", "stop"))}
RESUME = {"trigger": TRIGGER}
RECOMPUTE = {"path": Field("str", max_len=MAX_PATH, required=True),
             "names": Field("str_list", max_len=MAX_TEXT, max_items=10000)}
GC = {"keep": Field("int", minimum=0, maximum=1_000_000),
      "older_than": Field("number", minimum=0, maximum=1e10),
      "dry_run": Field("bool")}
EMPTY: dict[str, Field] = {}
# A checkpoint id (and a stream in a query) never needs more than these characters.
CHECKPOINT_ID = Field("str", max_len=200, pattern=r"[A-Za-z0-9._-]+", nullable=False)
STREAM = Field("str", max_len=MAX_PATH, nullable=False)
