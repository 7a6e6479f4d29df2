"""The lifecycle's events on jupyter_server's event bus (jupyter_events)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

SCHEMA_ID = "https://events.jupyter.org/jupyter_pause/lifecycle/v1"
SCHEMA_PATH = Path(__file__).parent / "event_schemas" / "lifecycle" / "v1.yaml"

log = logging.getLogger(__name__)


def register_schema(serverapp: Any) -> None:
    logger = getattr(serverapp, "event_logger", None)
    if logger is not None and SCHEMA_ID not in logger.schemas.schema_ids:
        logger.register_event_schema(SCHEMA_PATH)


def emit_lifecycle(serverapp: Any, data: dict[str, Any]) -> None:
    """Emit one lifecycle event; a broken listener must never break a pause."""
    logger = getattr(serverapp, "event_logger", None)
    if logger is None:
        return
    try:
        logger.emit(schema_id=SCHEMA_ID, data=data)
    except Exception as e:  # noqa: BLE001
        log.debug("jupyter_pause: event not emitted: %s", e)
