"""Which names of the kernel's namespace are the user's variables."""

from __future__ import annotations

import importlib
import os
import types
from typing import Any

# Names IPython (or the kernel) puts in user_ns that are never the user's state.
_ALWAYS_HIDDEN = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
_MISSING = object()


def is_user_name(name: str, value: Any, hidden: dict[str, Any]) -> bool:
    if name.startswith("_") or name in _ALWAYS_HIDDEN:
        return False
    if isinstance(value, types.ModuleType):
        return False  # modules are re-imported on restore, see module_aliases()
    # IPython's own rule (%who): a hidden name counts once the user rebinds it.
    return hidden.get(name, _MISSING) is not value


def user_variables(ip: Any) -> dict[str, Any]:
    """The user's variables: no IPython internals, no modules, nothing starting with ``_``."""
    hidden = ip.user_ns_hidden
    return {k: v for k, v in ip.user_ns.items() if is_user_name(k, v, hidden)}


def module_aliases(ip: Any) -> dict[str, str]:
    """``{"np": "numpy", ...}`` for modules bound in the namespace (recorded in the manifest meta)."""
    hidden = ip.user_ns_hidden
    out = {}
    for k, v in ip.user_ns.items():
        if (
            isinstance(v, types.ModuleType)
            and not k.startswith("_")
            and hidden.get(k, _MISSING) is not v
        ):
            name = getattr(v, "__name__", None)
            if isinstance(name, str) and name != "__main__":
                out[k] = name
    return out


def reimport_modules(ip: Any, aliases: dict[str, str] | None) -> tuple[list[str], list[str]]:
    """Bind modules recorded at checkpoint time that are not bound now. Returns (done, failed)."""
    done, failed = [], []
    for alias, modname in sorted((aliases or {}).items()):
        if not (isinstance(alias, str) and alias.isidentifier() and isinstance(modname, str)):
            continue
        current = ip.user_ns.get(alias)
        if isinstance(current, types.ModuleType) and current.__name__ == modname:
            continue
        if alias in ip.user_ns and not isinstance(current, types.ModuleType):
            continue  # a variable with that name exists: never overwrite it with a module
        try:
            ip.user_ns[alias] = importlib.import_module(modname)
            done.append(alias)
        except Exception:  # noqa: BLE001 - a module missing here is reported, not fatal
            failed.append(modname)
    return done, failed


def default_stream() -> str:
    """The checkpoint lineage of this kernel: the notebook path jupyter_server gave the session."""
    return os.environ.get("JPY_SESSION_NAME") or "default"


def default_store_url() -> str | None:
    """Store of the magics. The server may export its store so that magics and server agree."""
    return os.environ.get("JUPYTER_PAUSE_STORE_URL") or None


def default_key_path() -> str | None:
    return os.environ.get("JUPYTER_PAUSE_KEY_PATH") or None
