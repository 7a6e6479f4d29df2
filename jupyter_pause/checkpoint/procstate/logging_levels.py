"""Logging levels: the root logger's and every logger given a level of its own.

A library often sets its loggers' levels when it is imported (transformers does), so a restore
imports the top-level package a logger is named for when the checkpointed process had it
imported: the package sets its level, then the restored one is put over it, as in the notebook.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from . import Entry, Outcome, is_int, need, register

_MAX_LOGGERS = 2048


def _capture() -> Any:
    levels: dict[str, int] = {}
    root = logging.getLogger()
    if root.level != logging.WARNING:
        levels[""] = root.level
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and lg.level != logging.NOTSET:
            levels[name] = lg.level
    if not levels:
        return None
    owners = sorted({n.split(".")[0] for n in levels if n and n.split(".")[0] in sys.modules})
    return {"levels": dict(sorted(levels.items())[:_MAX_LOGGERS]), "modules": owners}


def _restore(state: Any) -> list[Outcome]:
    need(isinstance(state, dict), "not a mapping")
    levels, modules = state.get("levels"), state.get("modules", [])
    need(isinstance(levels, dict) and len(levels) <= _MAX_LOGGERS, "levels is not a mapping")
    need(all(isinstance(k, str) and len(k) <= 300 and is_int(v) and 0 <= v <= 100
             for k, v in levels.items()), "a level is not a number")
    need(isinstance(modules, list) and all(isinstance(m, str) and m.isidentifier()
                                           for m in modules), "modules is not a list")
    missing = []
    for m in modules:
        if m not in sys.modules:
            try:
                importlib.import_module(m)
            except Exception:  # noqa: BLE001 - its loggers' levels are still set
                missing.append(m)
    changed = []
    for name, level in levels.items():
        lg = logging.getLogger(name or None)
        if lg.level != level:
            lg.setLevel(level)
            changed.append(f"{name or 'root'}={logging.getLevelName(level)}")
    why = [f"set {', '.join(changed[:6])}{' ...' if len(changed) > 6 else ''}"] if changed else []
    if missing:
        why.append(f"not importable here: {', '.join(missing[:6])}")
    return [("logging levels", "restored", "; ".join(why) or None)]


register(Entry("logging.levels", "logging levels", _capture, _restore, order=40))
