"""jupyter_server's authorizer governs the pause API like every other Jupyter resource."""

from __future__ import annotations

import json

import pytest
from jupyter_server.auth.authorizer import Authorizer
from tornado.httpclient import HTTPClientError


class ViewerOnly(Authorizer):
    """May read the workspace state, may not pause, resume or delete anything."""

    def is_authorized(self, handler, user, action, resource):
        return not (resource == "jupyter_pause" and action != "read")


@pytest.fixture
def jp_server_config(jp_server_config):
    jp_server_config["ServerApp"]["authorizer_class"] = ViewerOnly
    return jp_server_config


async def test_viewer_reads_status_but_cannot_pause(jp_fetch):
    r = await jp_fetch("jupyter-pause", "api", "status")
    assert json.loads(r.body)["state"] == "running"
    for method, route in (("POST", "pause"), ("POST", "resume"), ("POST", "gc"),
                          ("DELETE", "checkpoints/x"), ("POST", "policy/cancel")):
        with pytest.raises(HTTPClientError) as e:
            await jp_fetch("jupyter-pause", "api", *route.split("/"), method=method,
                           body=None if method == "DELETE" else "{}")
        assert e.value.code == 403, route
    r = await jp_fetch("jupyter-pause", "api", "status")
    assert json.loads(r.body)["flight"] is None  # nothing started
