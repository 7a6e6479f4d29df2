"""Judge a restore by continuation: the cells after a checkpoint, run on in the process that wrote
it (the uninterrupted run) and in a fresh process that restored it, must print the same.

``continuation(setup, after, tmp)`` runs ``setup`` then a checkpoint of its globals then ``after``
in one fresh ``__main__`` process, and ``after`` alone in a second fresh process that restored
the checkpoint into its globals (what a fresh kernel's ``%restore`` does). ``after`` reports with
``emit(value)`` (JSON-able). Returns both runs' emitted values, the write and read statuses, and
the restore notes (``ReadResult.load_notes``).
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

from .helpers import run_py

_SCRIPT = """
import json, os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from jupyter_pause.checkpoint import load_or_create_key, open_store, read, write
_store, _key, _mode = open_store(sys.argv[1]), load_or_create_key(sys.argv[2]), sys.argv[3]
_base = set(globals()) | {{"_base"}}
_emitted = []
def emit(v):
    _emitted.append(v)
if _mode == "write":
{setup}
    _ns = {{k: v for k, v in globals().items() if k not in _base and not k.startswith("_")}}
    _ns.pop("emit", None)
    _res = write(_ns, _store, key=_key)
    _report = {{v.name: [v.status, v.reason] for v in _res.variables}}
    _notes = {{}}
else:
    _rr = read(_store, key=_key)
    globals().update(_rr.values)
    _report = {{v.name: [v.status, v.reason] for v in _rr.variables}}
    _notes = _rr.load_notes
try:
{after}
finally:
    print("RESULT " + json.dumps({{"out": _emitted, "report": _report, "notes": _notes}},
                                  default=repr))
"""


def _result(stdout: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no result line in:\n{stdout[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def continuation(setup: str, after: str, tmp: Any, timeout: float = 300,
                 env: dict | None = None) -> tuple[dict, dict]:
    """(uninterrupted, restored) results of ``after`` following ``setup``."""
    store, key = str(tmp / "store"), str(tmp / "k.key")
    code = _SCRIPT.format(setup=textwrap.indent(textwrap.dedent(setup), "    "),
                          after=textwrap.indent(textwrap.dedent(after), "    "))
    w = run_py(code, store, key, "write", timeout=timeout, env=env)
    r = run_py(code, store, key, "read", timeout=timeout, env=env)
    return _result(w.stdout), _result(r.stdout)


def assert_continues(setup: str, after: str, tmp: Any, **kw: Any) -> tuple[dict, dict]:
    """Every variable saved and restored, and the same output after the restore."""
    a, b = continuation(setup, after, tmp, **kw)
    bad = {n: s for n, s in a["report"].items() if s[0] != "saved"}
    assert not bad, f"not saved: {bad}"
    bad = {n: s for n, s in b["report"].items() if s[0] != "restored"}
    assert not bad, f"not restored: {bad}"
    assert b["out"] == a["out"], f"continuation differs:\n{a['out']}\n{b['out']}"
    return a, b
