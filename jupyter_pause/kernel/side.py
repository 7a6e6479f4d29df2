"""What this kernel side is, as the server asks every kernel: the distribution and its version,
the bridge protocol it speaks, and the interpreter it runs in.

Stdlib only and nothing else of ours imported: the server evaluates :func:`describe` as a user
expression with every bridge call (and alone, to learn about a kernel before a pause), so it must
be cheap and must work in a kernel that never loaded the rest of the package.

:data:`PROTOCOL` is the version of the bridge protocol (:mod:`.bridge`): the code string, its
arguments and the result dicts. Change it whenever a server of this version could no longer talk
to a kernel side of the previous one, or the other way round.
"""

from __future__ import annotations

import sys
from typing import Any

#: The distribution that installs the kernel side (``pip install jupyter-pause-kernel``).
PACKAGE = "jupyter-pause-kernel"
#: The bridge protocol this kernel side speaks.
PROTOCOL = 1


def describe() -> dict[str, Any]:
    """This kernel side, for the server (a plain dict: it travels as its ``repr``)."""
    from .. import __version__

    return {"installed": True, "package": PACKAGE, "version": __version__,
            "protocol": PROTOCOL, "python": sys.executable, "language": "python"}
