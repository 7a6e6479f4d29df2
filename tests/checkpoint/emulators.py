"""Real object-store servers over HTTP for the tests and the bench: gcp-storage-emulator (gs://,
through gcsfs) and moto's server (s3://, through s3fs), each a subprocess on a free port; and a
TCP relay in front of one, which a test kills to make the server vanish mid-upload while the
server itself (in-memory, so killing it would lose what it holds) keeps the earlier checkpoint
for the checks afterwards."""

from __future__ import annotations

import os

# gcsfs's "extended" file system asks a gRPC layout service about every bucket, which the
# emulator does not answer (each call then takes 40-90 s): plain gcsfs only. Set before any
# import of gcsfs.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import http.client
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.harness import free_port

BIN = os.path.dirname(sys.executable)


def _wait_http(port: int, path: str, proc: subprocess.Popen, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            c.getresponse().read()
            c.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer on port {port} within {deadline_s} s") from None
            time.sleep(0.05)


@dataclass
class Server:
    kind: str  # "gcs" or "s3"
    proc: subprocess.Popen
    port: int
    bucket: str = field(default_factory=lambda: f"jp-{uuid.uuid4().hex[:12]}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def options(self, port: int | None = None, **extra: Any) -> dict[str, Any]:
        """fsspec storage options for this server (or for a relay in front of it)."""
        ep = f"http://127.0.0.1:{port or self.port}"
        if self.kind == "gcs":
            return {"endpoint_url": ep, "token": "anon", "project": "test", **extra}
        return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": ep},
                **extra}

    def url(self, path: str = "ckpt") -> str:
        return f"{'gs' if self.kind == 'gcs' else 's3'}://{self.bucket}/{path}"

    def fs(self, port: int | None = None) -> Any:
        import fsspec

        return fsspec.filesystem("gs" if self.kind == "gcs" else "s3",
                                 skip_instance_cache=True, **self.options(port))

    def make_bucket(self) -> None:
        self.fs().mkdir(self.bucket)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def start(kind: str, data_dir: str | None = None) -> Server:
    """Start ``kind``'s server; ``data_dir`` keeps gcp-storage-emulator's objects on disk
    instead of in its memory (moto spools every object above 5 MiB to a temporary file
    already), for objects too large to hold twice in RAM."""
    port = free_port()
    if kind == "gcs":
        where = ["--data-dir", data_dir] if data_dir else []
        cmd = [os.path.join(BIN, "gcp-storage-emulator"), *where, "start", "--host",
               "127.0.0.1", "--port", str(port), *([] if data_dir else ["--in-memory"]), "-q"]
        probe = "/storage/v1/b"
    else:
        cmd = [os.path.join(BIN, "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
        probe = "/"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(port, probe, proc)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    srv = Server(kind, proc, port)
    srv.make_bucket()
    return srv


RELAY = r"""
import socket, sys, threading
target = int(sys.argv[1])
lsock = socket.socket()
lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lsock.bind(("127.0.0.1", 0))
lsock.listen(64)
print(lsock.getsockname()[1], flush=True)

def pipe(a, b):
    try:
        while True:
            data = a.recv(1 << 16)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

while True:
    c, _ = lsock.accept()
    u = socket.create_connection(("127.0.0.1", target))
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
"""


class Relay:
    """A TCP relay to ``port``; :meth:`kill` makes the server unreachable at once (connections
    reset, new ones refused), as a crashed server or a lost network would."""

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", RELAY, str(port)],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
