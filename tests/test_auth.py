"""Every HTTP endpoint of the extension requires authentication.

The extension template's CI check (check_auth) fails when a handler method lacks
`@tornado.web.authenticated`; this does the same with jupyter_server's own check, then proves
it on the wire: each route and verb answers 403 to a request without a token.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError
from tornado.web import RequestHandler

NAMESPACE = "jupyter-pause"


@pytest.fixture
def jp_server_config(tmp_path):
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_pause": True},
            "allow_unauthenticated_access": False,
        },
        "PauseApp": {
            "state_dir": str(tmp_path / "state"),
            "store_url": str(tmp_path / "store"),
            "key_path": str(tmp_path / "checkpoint.key"),
        },
    }


def _extension_rules(web_app: Any) -> list[tuple[str, type[RequestHandler]]]:
    """(regex, handler class) of every route under the extension's namespace."""
    found = []
    routers = [web_app.wildcard_router, web_app.default_router]
    while routers:
        router = routers.pop()
        for rule in getattr(router, "rules", []):
            target = rule.target
            if hasattr(target, "rules"):
                routers.append(target)
                continue
            regex = getattr(rule.matcher, "regex", None)
            if (
                regex is not None
                and isinstance(target, type)
                and issubclass(target, RequestHandler)
                and f"/{NAMESPACE}/" in regex.pattern
            ):
                found.append((regex.pattern, target))
    return found


def _implemented(handler: type[RequestHandler]) -> list[str]:
    """Verbs the handler implements, less those jupyter_server allowlists (CORS preflight)."""
    methods = []
    for m in handler.SUPPORTED_METHODS:
        fn = getattr(handler, m.lower())
        if fn is not RequestHandler._unimplemented_method and not hasattr(
            fn, "__allow_unauthenticated"
        ):
            methods.append(m)
    return methods


def _example_path(pattern: str) -> str:
    """A concrete URL path matching a route regex (groups become 'x')."""
    path = re.sub(r"\(\?P<\w+>[^)]*\)|\([^)]*\)", "x", pattern).rstrip("$")
    return path.replace("\\", "")


def test_every_handler_method_is_authenticated(jp_serverapp) -> None:
    web_app = jp_serverapp.web_app
    rules = _extension_rules(web_app)
    assert len(rules) >= 5, f"expected the REST API under /{NAMESPACE}/api/, found {rules}"
    missing = []
    for pattern, handler in rules:
        missing += web_app._check_handler_auth(pattern, handler)
    assert not missing, "endpoints without @tornado.web.authenticated:\n" + "\n".join(missing)


async def test_every_route_refuses_requests_without_a_token(jp_serverapp, jp_fetch) -> None:
    base = jp_serverapp.base_url.rstrip("/")
    checked = []
    for pattern, handler in _extension_rules(jp_serverapp.web_app):
        path = _example_path(pattern)
        assert path.startswith(f"{base}/{NAMESPACE}/"), path
        parts = path[len(base) + 1 :].split("/")
        for method in _implemented(handler):
            body = json.dumps({}) if method in ("POST", "PUT", "PATCH") else None
            with pytest.raises(HTTPClientError) as e:
                await jp_fetch(
                    *parts,
                    method=method,
                    body=body,
                    headers={"Authorization": ""},
                    allow_nonstandard_methods=True,
                )
            assert e.value.code == 403, f"{method} {path} answered {e.value.code} without a token"
            checked.append(f"{method} {path}")
    assert checked, "no routes were checked"
