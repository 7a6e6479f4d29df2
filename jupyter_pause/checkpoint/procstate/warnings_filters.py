"""Warnings filters (``warnings.filterwarnings`` / ``simplefilter``), in their order.

The restored list replaces the new process's; filters the new process has that the checkpoint
does not (its own -W options, libraries imported before the restore) follow it.
"""

from __future__ import annotations

import builtins
import importlib
import re
import sys
import warnings
from typing import Any

from . import BadState, Entry, Outcome, is_int, need, register

_ACTIONS = ("default", "error", "ignore", "always", "all", "module", "once")
_MAX_FILTERS = 4096


def _pattern(p: Any) -> Any:
    # a str is matched as the exact text (the C module's rule for its own default filters)
    if p is None or isinstance(p, str):
        return p if p is None else {"text": p}
    return {"re": p.pattern, "flags": p.flags & ~re.UNICODE}


def _unpattern(p: Any) -> Any:
    need(p is None or isinstance(p, dict), "a pattern is not a pattern")
    if p is None:
        return None
    text, pat, flags = p.get("text"), p.get("re"), p.get("flags", 0)
    need(all(x is None or (isinstance(x, str) and len(x) <= 4096) for x in (text, pat))
         and (text is None) != (pat is None) and is_int(flags), "a pattern is not text")
    return text if pat is None else re.compile(pat, flags)


def _capture() -> Any:
    out = []
    for action, msg, cat, mod, lineno in list(warnings.filters)[:_MAX_FILTERS]:
        # typeshed allows a tuple of categories here; filterwarnings/simplefilter store one class
        name = cat.__qualname__  # type: ignore[union-attr]
        out.append({"action": action, "message": _pattern(msg), "module": _pattern(mod),
                    "category": f"{cat.__module__}:{name}", "lineno": lineno})
    return {"filters": out}


def _category(spec: str) -> type:
    modname, _, qual = spec.partition(":")
    mod = builtins if modname == "builtins" else (
        sys.modules.get(modname) or importlib.import_module(modname))
    obj: Any = mod
    for part in qual.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Warning)):
        raise TypeError(f"{spec} is not a warning category")
    return obj


def _restore(state: Any) -> list[Outcome]:
    need(isinstance(state, dict) and isinstance(state.get("filters"), list)
         and len(state["filters"]) <= _MAX_FILTERS, "not a filter list")
    items, lost = [], []
    for f in state["filters"]:
        need(isinstance(f, dict) and f.get("action") in _ACTIONS, "unknown action")
        msg, mod, cat, lineno = f.get("message"), f.get("module"), f.get("category"), f.get(
            "lineno")
        need(isinstance(cat, str) and ":" in cat and len(cat) <= 300, "a category is not named")
        need(is_int(lineno) and lineno >= 0, "bad line number")
        try:
            item = (f["action"], _unpattern(msg), _category(cat), _unpattern(mod), lineno)
        except BadState:
            raise
        except Exception as e:  # noqa: BLE001 - one filter that cannot come back is named
            lost.append(f"{cat.split(':')[-1][:60]} ({type(e).__name__})")
            continue
        if item not in items:
            items.append(item)
    extra = [f for f in warnings.filters if f not in items]
    # typeshed declares warnings.filters a Sequence; it is the module's own list
    warnings.filters[:] = items + extra  # type: ignore[index]
    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is not None:
        mutated()  # the C module caches which filters apply
    why = f"{len(items)} filters"
    if lost:
        why += f"; not restored: {', '.join(lost[:4])}"
    return [("warnings filters", "restored", why)]


register(Entry("warnings.filters", "warnings filters", _capture, _restore, order=40))
