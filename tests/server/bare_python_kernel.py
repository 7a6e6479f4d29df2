"""A real IPython kernel whose environment lacks jupyter-pause's kernel side: ``jupyter_pause``
is not importable in it (``importlib.util.find_spec`` finds nothing, an import raises
``ModuleNotFoundError``), as in an environment where it is not installed, while ipykernel and
everything else work.

Run as ``python bare_python_kernel.py -f {connection_file}`` (the kernelspec's argv).
"""

from __future__ import annotations

import os
import sys


def _without_jupyter_pause() -> None:
    """Drop every sys.path entry that holds the package (the editable install's, the source
    tree's): what remains is the environment without it."""
    sys.path[:] = [p for p in sys.path
                   if not os.path.isdir(os.path.join(p or os.getcwd(), "jupyter_pause"))]
    for name in [m for m in sys.modules if m == "jupyter_pause" or m.startswith("jupyter_pause.")]:
        del sys.modules[name]


_without_jupyter_pause()

if __name__ == "__main__":
    from ipykernel.kernelapp import launch_new_instance

    launch_new_instance()
