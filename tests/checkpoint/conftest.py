from __future__ import annotations

import pytest

from jupyter_pause.checkpoint import load_or_create_key, open_store


@pytest.fixture
def key(tmp_path):
    return load_or_create_key(str(tmp_path / "keys" / "checkpoint.key"))


@pytest.fixture
def store(tmp_path):
    return open_store(str(tmp_path / "store"))
