"""%pause / %resume find the Jupyter server through its runtime file and call its REST API.

The HTTP side here is a small real HTTP server standing in for the jupyter_pause server
extension (tested in tests/server); what is checked is what the kernel sends and shows."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytestmark = pytest.mark.timeout(60)


class _Recorder:
    def __init__(self, status: int = 202, reply: dict | None = None) -> None:
        self.requests: list[dict] = []
        self.status = status
        self.reply = reply if reply is not None else {"flight": {"id": "f-123", "kind": "pause"}}
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                rec.requests.append(
                    {
                        "path": self.path,
                        "auth": self.headers.get("Authorization"),
                        "body": json.loads(self.rfile.read(n) or b"{}"),
                    }
                )
                data = json.dumps(rec.reply).encode()
                self.send_response(rec.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/base/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers(tmp_path):
    made: list[_Recorder] = []

    def make(pid: int, token: str, **kw) -> _Recorder:
        rec = _Recorder(**kw)
        made.append(rec)
        runtime = tmp_path / "runtime"
        runtime.mkdir(exist_ok=True)
        info = {
            "url": rec.url,
            "base_url": "/base/",
            "token": token,
            "pid": pid,
            "root_dir": str(tmp_path),
            "sock": "",
            "secure": False,
        }
        (runtime / f"jpserver-{pid}-{len(made)}.json").write_text(json.dumps(info))
        return rec

    yield make
    for rec in made:
        rec.close()


def test_pause_posts_to_the_parent_server(kernel, servers):
    # The kernel's parent process is this test process: that server must win over the decoy,
    # whose pid (our own parent) is alive too.
    decoy = servers(os.getppid(), "wrong")
    ours = servers(os.getpid(), "s3cret")
    out = kernel.ok("%pause")
    assert "Pause requested (flight f-123)" in out.stdout
    assert "after" in out.stdout or "as soon as this cell finishes" in out.stdout
    assert decoy.requests == []
    (req,) = ours.requests
    assert req["path"] == "/base/jupyter-pause/api/pause"
    assert req["auth"] == "token s3cret"
    assert req["body"] == {"trigger": "magic", "interrupt": False}


def test_pause_refused_is_one_line(kernel, servers):
    servers(os.getpid(), "t", status=409, reply={"message": "a resume is in flight"})
    out = kernel.run("%pause")
    assert out.status == "error" and "Traceback" not in out.text
    lines = out.stderr.strip().splitlines()
    assert lines == ["UsageError: %pause: the server refused: a resume is in flight (HTTP 409)"]


def test_pause_server_without_extension(kernel, servers):
    servers(os.getpid(), "t", status=404, reply={"message": "Not Found"})
    out = kernel.run("%pause")
    assert "has no jupyter-pause API" in out.stderr and "Traceback" not in out.text


def test_resume_in_live_kernel_does_not_restore(kernel, servers):
    rec = servers(os.getpid(), "t")
    kernel.ok("v = 7")
    kernel.run(
        "__import__('jupyter_pause.kernel.liveness', fromlist=['_']).arm('tok')", silent=True
    )
    out = kernel.ok("%resume")
    assert "live one" in out.stdout
    assert rec.requests[0]["path"] == "/base/jupyter-pause/api/resume"
    assert kernel.eval("v") == 7


def test_resume_in_fresh_kernel_restores_here(kernel, servers):
    rec = servers(os.getpid(), "t", reply={"flight": {"id": "f-9", "kind": "resume"}})
    kernel.ok("import numpy as np\nweights = np.linspace(0, 1, 11)\nname = 'exp-1'")
    kernel.ok("%checkpoint")
    kernel.restart()
    kernel.ok("%load_ext jupyter_pause")
    out = kernel.ok("%resume")
    report = "\n".join(d.get("text/plain", "") for d in out.displays)
    assert "Resumed: this is a fresh kernel, restored" in report
    assert [r["path"] for r in rec.requests] == ["/base/jupyter-pause/api/resume"]
    assert rec.requests[0]["body"] == {"trigger": "magic"}
    assert kernel.eval("(weights.tolist()[-1], name)") == (1.0, "exp-1")
    state = kernel.eval("__import__('jupyter_pause.kernel.liveness', fromlist=['_']).state()")
    assert state["token"] is None and state["restored"]["by"] == "resume"
    out = kernel.ok("%resume")  # a second %resume does not restore over newer work
    assert "already restored" in out.stdout
