"""A real non-Python kernel: the echo kernel of jupyter_client's "Making simple Python wrapper
kernels" (https://jupyter-client.readthedocs.io/en/latest/wrapperkernels.html), with a memory.

Its language is "echo": jupyter-pause cannot checkpoint it. It remembers what it was sent, so a
test can tell the same process (it recalls) from a fresh one (it recalls nothing): ``recall``
prints every earlier input, one a line; any other input is echoed and remembered.

Run as ``python echo_kernel.py -f {connection_file}`` (the kernelspec's argv).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar

from ipykernel.kernelbase import Kernel

HERE = Path(__file__).resolve().parent
ECHO = "parrot"  # the kernelspec names (pytest-jupyter installs one called "echo" of its own)
BARE_PYTHON = "bare-python"


def install_kernelspecs(kernel_dir: str | Path) -> None:
    """Install the echo kernel and the Python kernel without jupyter-pause
    (bare_python_kernel.py) as kernelspecs in ``kernel_dir`` (a test server's data dir)."""
    specs = {ECHO: ("echo_kernel.py", "Echo", "echo"),
             BARE_PYTHON: ("bare_python_kernel.py", "Python without jupyter-pause", "python")}
    for name, (script, display, language) in specs.items():
        d = Path(kernel_dir) / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, str(HERE / script), "-f", "{connection_file}"],
            "display_name": display, "language": language}))


class EchoKernel(Kernel):
    implementation = "Echo"
    implementation_version = "1.0"
    language = "echo"
    language_version = "0.1"
    language_info: ClassVar[dict[str, str]] = {"name": "echo", "mimetype": "text/plain",
                                               "file_extension": ".txt"}
    banner = "Echo kernel - as useful as a parrot"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.remembered: list[str] = []

    async def do_execute(self, code: str, silent: bool, store_history: bool = True,
                         user_expressions: dict | None = None, allow_stdin: bool = False,
                         **kwargs: Any) -> dict[str, Any]:
        if code.strip() == "recall":
            text = "".join(f"{line}\n" for line in self.remembered)
        else:
            self.remembered.append(code)
            text = code
        if not silent and text:
            self.send_response(self.iopub_socket, "stream", {"name": "stdout", "text": text})
        return {"status": "ok", "execution_count": self.execution_count, "payload": [],
                "user_expressions": {}}


if __name__ == "__main__":
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=EchoKernel)
