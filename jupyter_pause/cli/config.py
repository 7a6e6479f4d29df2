"""The extension's configuration for commands that run without a server (gc --offline, validate,
report, doctor): ``PauseApp`` configured from the files jupyter_server would load, so every
value and default is the server's own."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..server.app import PauseApp


def pause_app() -> PauseApp:
    """A ``PauseApp`` (jupyter_pause.server.app) holding the server's configuration."""
    # Imported here: the server's classes take seconds to import, and status/list/pause/resume
    # (which never read the configuration) should answer at once.
    from ..cluster.doctor import load_server_config
    from ..server.app import PauseApp

    config, _ = load_server_config()
    return PauseApp(config=config)
