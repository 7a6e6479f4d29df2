from __future__ import annotations

import pytest

from jupyter_pause.checkpoint import load_or_create_key, open_store


@pytest.fixture
def key(tmp_path):
    return load_or_create_key(str(tmp_path / "keys" / "checkpoint.key"))


@pytest.fixture
def store(tmp_path):
    return open_store(str(tmp_path / "store"))


@pytest.fixture(scope="module", params=["gcs", "s3"])
def object_server(request):
    """A real object-store server (gcp-storage-emulator or moto) with a fresh bucket."""
    from . import emulators

    srv = emulators.start(request.param)
    yield srv
    srv.stop()
