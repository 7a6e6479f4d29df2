"""The lifecycle's events on jupyter_server's event bus (jupyter_events).

The schema is generated from :mod:`jupyter_pause.vocabulary`; jupyter_events validates each
event against it whenever a listener is attached (a page's event stream), so an event outside
it never reaches the frontend: that is an error, logged with the event and the reason.
"""

from __future__ import annotations

import logging
from typing import Any

from ..vocabulary import SCHEMA_ID, SCHEMA_PATH

log = logging.getLogger(__name__)


def register_schema(serverapp: Any) -> None:
    logger = getattr(serverapp, "event_logger", None)
    if logger is not None and SCHEMA_ID not in logger.schemas.schema_ids:
        logger.register_event_schema(SCHEMA_PATH)


def emit_lifecycle(serverapp: Any, data: dict[str, Any]) -> None:
    """Emit one lifecycle event; a broken listener or a refused event never breaks a pause."""
    logger = getattr(serverapp, "event_logger", None)
    if logger is None:
        return
    try:
        logger.emit(schema_id=SCHEMA_ID, data=data)
    except Exception as e:  # noqa: BLE001 - logged; the flight goes on, the page polls status
        # In the server's log; a ValidationError's message names the value the schema refused.
        (getattr(serverapp, "log", None) or log).error(
            "jupyter_pause: lifecycle event %r (state %r, outcome %r) not emitted: %s",
            data.get("event"), data.get("state"), data.get("outcome"),
            getattr(e, "message", None) or e)
