"""jupyter_server's view of a kernel kept true across the restarts its restarter makes.

When a kernel's process dies, jupyter_client's restarter starts a new one, but jupyter_server
keeps the dead process's ``execution_state`` ("busy" when it died in a cell, jupyter_server
#1395), and when the restart took new ports (a kernel that dies before it ran stably gets new
random ports) its activity watch stays on the old IOPub port and never hears the new process
(#481). Everything that reads that state would then wait on a busy kernel that is not there:
the pause's busy check, the resume's wait for a kernel restoring itself, the idle policies,
``/api/kernels``. jupyter_server re-arms the watch only on the restarts it is asked for
(``MappingKernelManager.restart_kernel``); this does the same after every successful restart,
which jupyter_server announces on its event bus (``kernel_actions`` ``restart``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..kernelclient import kernel_info_answer

KERNEL_ACTIONS = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"
# How long the new process may take to answer before its state is left to jupyter_server.
ANSWER_WAIT = 60.0

log = logging.getLogger(__name__)


class RestartWatch:
    """Re-arms jupyter_server's activity watch of each kernel after it was restarted."""

    def __init__(self, serverapp: Any):
        self.serverapp = serverapp
        self._tasks: set[asyncio.Task] = set()
        self._logger: Any = None

    def start(self) -> None:
        logger = getattr(self.serverapp, "event_logger", None)
        if logger is None or KERNEL_ACTIONS not in logger.schemas.schema_ids:
            log.warning("jupyter_pause: this jupyter_server announces no kernel restarts; a "
                        "kernel restarted after a crash may read busy until it is used")
            return
        logger.add_listener(schema_id=KERNEL_ACTIONS, listener=self._on_action)
        self._logger = logger

    async def stop(self) -> None:
        if self._logger is not None:
            self._logger.remove_listener(schema_id=KERNEL_ACTIONS, listener=self._on_action)
            self._logger = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_action(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        if data.get("action") != "restart" or data.get("status") != "success":
            return
        kernel_id = data.get("kernel_id")
        if not kernel_id:
            return
        # A task of its own: jupyter_events waits on its listeners when it shuts down.
        task = asyncio.ensure_future(self.rearm(kernel_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def rearm(self, kernel_id: str) -> str | None:
        """Watch the kernel's current IOPub and learn its state from the new process.

        Returns the state it ends in (None when the kernel is gone)."""
        km = self.serverapp.kernel_manager
        if kernel_id not in km:
            return None
        kernel = km.get_kernel(kernel_id)
        if getattr(kernel, "_pending_restart_cleanup", None):
            # A restart asked through the API, still waiting for its kernel_info reply:
            # jupyter_server re-arms the watch itself, and stopping the watch now would cancel
            # that wait (stop_watching_activity runs its clean-up), so the request never ends.
            return kernel.execution_state
        # As jupyter_server's own restart does for changed ports; "starting" is the state it
        # normalises to "idle" on the first status it hears.
        km.stop_watching_activity(kernel_id)
        kernel.execution_state = "starting"
        km.start_watching_activity(kernel_id)
        log.info("jupyter_pause: kernel %s was restarted; watching its new process",
                 kernel_id[:8])
        answered = not await kernel_info_answer(
            kernel, ANSWER_WAIT, gone=lambda: None if kernel_id in km else "removed")
        if answered and kernel_id in km and kernel.execution_state == "starting":
            # It answered a request, so it runs no cell: the watch may have joined after the
            # status of that request (ZMQ's slow joiner), so say it here.
            kernel.execution_state = "idle"
        return kernel.execution_state if kernel_id in km else None
