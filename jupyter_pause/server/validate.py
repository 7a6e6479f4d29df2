"""Typed, bounded request input for every route: JSON Schemas of the bodies and query values.

``"false"`` is a string, not a boolean, and is refused rather than read as true. The raw body is
checked for size, nesting and NaN/Infinity (which Python's JSON reader accepts) before it is
decoded, so ``[`` x 100000 is a 400, not a RecursionError. A refusal names the field in one line.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jsonschema

MAX_BODY = 64 * 1024  # bytes; every body of this API is a handful of small fields
MAX_DEPTH = 8  # the deepest body (recompute's names list) nests 2
MAX_TEXT = 200  # free-text fields (trigger)
MAX_PATH = 4096
# A "\ud800" escape is valid JSON but no Unicode text: it could not be written to the journal
# as UTF-8 or printed later (UnicodeEncodeError), so it is refused here, at the door.
_SURROGATE = re.compile("[\ud800-\udfff]")


class BadRequest(ValueError):
    """Input that does not match the route's schema: a 400 with this one-line message."""


# JSON Schema's "integer" includes 1.0; a count here is a JSON integer only.
_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool)),
)
_TYPE_WORDS = {"string": "a string", "boolean": "true or false", "integer": "an integer",
               "number": "a finite number", "array": "a list of strings", "object": "an object"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


def body_schema(required: tuple[str, ...] = (), **fields: dict[str, Any]) -> dict[str, Any]:
    """A JSON object of ``fields`` (absent or null unless ``required``), nothing else: a typo
    such as "interupt" must not be silently ignored."""
    return {"type": "object", "additionalProperties": False, "required": list(required),
            "properties": {k: s if k in required else _nullable(s) for k, s in fields.items()}}


def _message(error: jsonschema.ValidationError, name: str) -> str:
    """One line for a schema error at field ``name``."""
    # jsonschema types these as any schema value (a bool schema, unset); ours are objects
    schema: Any = error.schema
    kind = error.validator
    if kind == "type":
        want = schema["type"][0] if isinstance(schema["type"], list) else schema["type"]
        if want == "array":
            return f"{name} must be a list of at most {schema.get('maxItems')} strings"
        null = ", not null" if error.instance is None and len(error.path) <= 1 else ""
        return f"{name} must be {_TYPE_WORDS[want]}{null}"
    if kind == "maxLength":
        return f"{name} is longer than {schema['maxLength']} characters"
    if kind == "enum":
        return f"{name} must be one of {', '.join(schema['enum'])}"
    if kind == "pattern":
        return f"{name} has characters that are not allowed"
    if kind in ("minimum", "maximum"):
        value: Any = error.instance
        if not math.isfinite(value):
            return f"{name} must be a finite number"
        if "maximum" in schema:
            return f"{name} must be between {schema['minimum']:g} and {schema['maximum']:g}"
        return f"{name} must be >= {schema['minimum']:g}"
    if kind == "maxItems":
        return f"{name} must be a list of at most {schema['maxItems']} strings"
    return f"{name}: {error.message}"  # pragma: no cover - a keyword these schemas do not use


def _field_name(error: jsonschema.ValidationError, top: str | None = None) -> str:
    """``names[3]`` for the path (names, 3); ``top`` names a value checked on its own."""
    parts = list(error.absolute_path)
    name = top if top is not None else str(parts.pop(0)) if parts else "the request body"
    return name + "".join(f"[{p}]" for p in parts)


def check(data: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """``data`` checked against a :func:`body_schema`, every field present (absent ones None).

    Raises BadRequest with the first problem: an unknown field, else in the schema's field order."""
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    fields = list(schema["properties"])
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0][:40]!r} (expected {', '.join(fields)})")
    # The first problem is the one said: by field, the field before its items, a wrong type
    # before a bound.
    problems = [(fields.index(k), 0, False, f"{k} is required")
                for k in schema["required"] if k not in data]
    problems += [(fields.index(str(e.absolute_path[0])), len(e.absolute_path),
                  e.validator != "type", _message(e, _field_name(e)))
                 for e in _Validator(schema).iter_errors(data) if e.absolute_path]
    if problems:
        raise BadRequest(min(problems)[-1])
    for k in fields:
        _refuse_surrogates(k, data.get(k))
    return {k: data.get(k) for k in fields}


def _refuse_surrogates(name: str, value: Any) -> None:
    if isinstance(value, str) and _SURROGATE.search(value):
        raise BadRequest(f"{name} is not valid Unicode text (it holds a lone surrogate such as "
                         "\\ud800)")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_surrogates(f"{name}[{i}]", item)


def check_value(name: str, value: Any, schema: dict[str, Any]) -> Any:
    """One value (e.g. from a query string or the URL) checked against ``schema``."""
    error = jsonschema.exceptions.best_match(_Validator(schema).iter_errors(value))
    if error is not None:
        raise BadRequest(_message(error, _field_name(error, name)))
    _refuse_surrogates(name, value)
    return value


def _scan(text: str) -> int:
    """The nesting depth of JSON text, counted without decoding (brackets in strings skipped);
    -1 for NaN or Infinity, which are not JSON."""
    depth = deepest = 0
    in_str = esc = False
    for ch in text:
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
        elif ch in "NI":  # outside strings JSON spells only true, false, null and exponents
            return -1
    return deepest


def check_raw(raw: bytes | None) -> None:
    """Refuse a body too large, not UTF-8, too deep or with NaN/Infinity, before it is decoded."""
    if not raw:
        return
    if len(raw) > MAX_BODY:
        raise BadRequest(f"the request body is larger than {MAX_BODY // 1024} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the request body is not UTF-8") from None
    depth = _scan(text)
    if depth > MAX_DEPTH:
        raise BadRequest(f"the request body nests deeper than {MAX_DEPTH} levels")
    if depth < 0:
        raise BadRequest("the request body is not JSON: NaN and Infinity are not JSON numbers "
                         "(every number must be finite)")


def query_number(name: str, value: str | None, *, minimum: float, maximum: float) -> float | None:
    """A finite number from a query string (``nan``, ``inf``, ``1e400`` are refused)."""
    if value is None or value == "":
        return None
    if len(value) > 40:
        raise BadRequest(f"{name} is not a number")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):  # NaN passes every bound
        raise BadRequest(f"{name} must be a finite number")
    return check_value(name, number, {"type": "number", "minimum": minimum, "maximum": maximum})


def query_str(name: str, value: str | None, schema: dict[str, Any]) -> str | None:
    """A string from a query or the URL, checked against ``schema`` (None when absent)."""
    return None if value is None else check_value(name, value, schema)


# ------------------------------------------------------------------------------ route schemas

TEXT = {"type": "string", "maxLength": MAX_TEXT}
PAUSE = body_schema(trigger=TEXT, interrupt={"type": "boolean"},
                    mode={"type": "string", "enum": ["pause", "stop"]},
                    # kernels that cannot be checkpointed and may lose their state (see
                    # checkpointable.py): their ids, or all of them
                    lose_state={"type": "array", "maxItems": 1000, "items": TEXT},
                    allow_uncheckpointable={"type": "boolean"})
RESUME = body_schema(trigger=TEXT)
RECOMPUTE = body_schema(
    ("path",), path={"type": "string", "maxLength": MAX_PATH},
    names={"type": "array", "maxItems": 10000, "items": TEXT})
GC = body_schema(keep={"type": "integer", "minimum": 0, "maximum": 1_000_000},
                 older_than={"type": "number", "minimum": 0, "maximum": 1e10},
                 dry_run={"type": "boolean"})
EMPTY = body_schema()
# A checkpoint id (and a stream in a query) never needs more than these characters. The
# pattern is matched with Python's re.search: \A and \Z, so that no trailing newline slips by.
CHECKPOINT_ID = {"type": "string", "maxLength": 200, "pattern": r"\A[A-Za-z0-9._-]+\Z"}
STREAM = {"type": "string", "maxLength": MAX_PATH}
