"""The jupyter_server extension: configuration (``c.PauseApp.<trait>``), routes, start and stop."""

from __future__ import annotations

import importlib
import os
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Dict, Float, Instance, Int, List, Unicode, default

from ..cluster.accelerator import detected_accelerator
from ..cluster.base import Backend, resolve_backend_class
from .events import register_schema
from .lifecycle import Lifecycle
from .statelock import StateDirBusy, StateLock

# Optional modules of this package that add routes and start-up work. Each may define
#   get_handlers(app: PauseApp) -> list[tuple[str, type]]   (patterns like r"/jupyter-pause/api/x")
#   async def start(app: PauseApp) -> None ;  async def stop(app: PauseApp) -> None
DEFAULT_EXTENSION_MODULES = ["jupyter_pause.policy.handlers"]


class PauseApp(ExtensionApp):
    name = "jupyter_pause"
    load_other_extensions = True

    backend = Unicode(
        "local",
        help="Backend: an entry-point name of group 'jupyter_pause.backends' (local, gke, "
        "kubeflow) or a class path 'package.module:Class'.",
    ).tag(config=True)
    store_url = Unicode(
        "", help="Checkpoint store (directory or fsspec URL); empty = the checkpoint library's "
        "default (<jupyter data dir>/jupyter-pause/checkpoints)."
    ).tag(config=True)
    key_path = Unicode(
        "", help="HMAC key file of the checkpoints; empty = the checkpoint library's default."
    ).tag(config=True)
    state_dir = Unicode(
        help="Directory of state.json and journal.jsonl; put it on the persistent volume."
    ).tag(config=True)
    keep_checkpoints = Int(5, help="Checkpoints kept per notebook (0 = keep all).").tag(config=True)
    busy_timeout = Float(
        30.0, help="Seconds a pause waits for a busy kernel to go idle before it is refused."
    ).tag(config=True)
    interrupt_busy = Bool(
        False, help="Interrupt a kernel still busy after busy_timeout instead of refusing."
    ).tag(config=True)
    restore_device = Unicode(
        "auto", help="Where restored tensors go: 'auto', 'cpu' or 'cuda:N'."
    ).tag(config=True)
    accelerator = Dict(
        help='The accelerator this workspace holds, e.g. {"type": "nvidia-l4", "count": 1}; '
        "used for accelerator-seconds released. Default: the GPUs this server sees "
        "(nvidia-smi, /proc/driver/nvidia, NVIDIA_VISIBLE_DEVICES), else none.",
    ).tag(config=True)
    bridge_timeout = Float(
        3600.0, help="Seconds a checkpoint or restore inside one kernel may take."
    ).tag(config=True)
    variable_timeout = Float(
        120.0, help="Seconds one variable (or group of linked variables) may take to serialize "
        "in a checkpoint; past it the variable is skipped with that reason and the checkpoint "
        "goes on (0 = no limit)."
    ).tag(config=True)
    liveness_timeout = Float(60.0, help="Seconds to wait for a kernel's liveness answer.").tag(
        config=True
    )
    resume_on_start = Bool(
        None, allow_none=True,
        help="Resume by itself when the server starts paused (None: the backend decides; "
        "the Kubernetes backends do, local does not).",
    ).tag(config=True)
    activity_interval = Float(
        60.0, help="Seconds between 'activity' journal records (coalesced; 0 = off)."
    ).tag(config=True)
    progress_interval = Float(0.5, help="Minimum seconds between progress events.").tag(
        config=True
    )
    first_cell_watch = Float(
        86400.0, help="How long after a resume to wait for the first cell (first_cell_ran)."
    ).tag(config=True)
    extension_modules = List(
        Unicode(), DEFAULT_EXTENSION_MODULES,
        help="Modules that add routes/start-up work (get_handlers(app), start(app), stop(app)).",
    ).tag(config=True)

    backend_instance = Instance(Backend, allow_none=True)
    lifecycle = Instance(Lifecycle, allow_none=True)
    # Set when this app's configuration could not be applied (see update_config).
    config_error: str | None = None
    # Set when another live server holds the state directory: the API answers 503 with it.
    disabled_reason: str | None = None
    _state_lock: StateLock | None = None

    @default("accelerator")
    def _default_accelerator(self) -> dict[str, Any]:
        return dict(detected_accelerator())  # never torch: the server holds no CUDA context

    @default("state_dir")
    def _default_state_dir(self) -> str:
        return os.path.join(jupyter_data_dir(), "jupyter-pause", "state")

    @property
    def backend_name(self) -> str:
        return getattr(self.backend_instance, "name", None) or self.backend

    # ------------------------------------------------------------------ jupyter_server hooks

    def update_config(self, config: Any) -> None:
        try:
            super().update_config(config)
        except Exception as e:
            # jupyter_server only logs a failed link and loads the extension anyway, and
            # traitlets rolls the whole section back: the default checkpoint store and key
            # instead of the configured ones. Remember it, so that no pause or resume runs on
            # such a configuration (the lifecycle refuses them, saying why).
            self.config_error = f"invalid jupyter_pause configuration: {e}"
            raise

    def initialize_settings(self) -> None:
        if self.config_error:
            self.log.error("jupyter_pause: %s; pause and resume are disabled until it is fixed",
                           self.config_error)
        if not self.state_dir:  # "" after such a roll-back: never the server's working directory
            self.state_dir = self._default_state_dir()
        # Kernels inherit the server's environment: this makes the magics (%checkpoint,
        # %restore, %resume) use the store and key the server uses.
        for var, value in (("JUPYTER_PAUSE_STORE_URL", self.store_url),
                           ("JUPYTER_PAUSE_KEY_PATH", self.key_path)):
            if value:
                os.environ[var] = value
        # Detect now, at start-up, not on the event loop's first pause (nvidia-smi may be slow).
        self.log.info("jupyter_pause: accelerator %s", self.accelerator)
        self.backend_instance = resolve_backend_class(self.backend)(parent=self)
        register_schema(self.serverapp)
        self.lifecycle = Lifecycle(self)
        self.settings["jupyter_pause_lifecycle"] = self.lifecycle
        self._activity: PeriodicCallback | None = None
        # Their routes exist either way (a disabled server answers them with 503).
        self._modules = [m for m in (self._import(n) for n in self.extension_modules) if m]
        if self._lock_state_dir():
            self.lifecycle.load()

    def _lock_state_dir(self) -> bool:
        """One server per state directory; False (extension off, API 503) when another holds it."""
        lock = StateLock(self.state_dir)
        try:
            me = lock.acquire()
        except StateDirBusy as e:
            self.disabled_reason = str(e)
            self.log.error("jupyter_pause: %s; pause and resume are disabled in this server "
                           "(holder: %s)", e, e.holder)
            return False
        except OSError as e:  # no locks on this file system: run, but say it
            self.log.warning("jupyter_pause: %s; make sure only one server uses this state "
                             "directory", e)
            return True
        self._state_lock = lock
        self.log.info("jupyter_pause: state directory %s locked by %s", self.state_dir, me)
        return True

    def initialize_handlers(self) -> None:
        from .handlers import default_handlers

        self.handlers.extend(default_handlers())
        for module in self._modules:
            if hasattr(module, "get_handlers"):
                self.handlers.extend(module.get_handlers(self))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.disabled_reason:
            return
        await self.lifecycle.start()
        if self.activity_interval > 0:
            self._activity = PeriodicCallback(self.lifecycle.sample_activity,
                                              self.activity_interval * 1000)
            self._activity.start()
        for module in self._modules:
            if hasattr(module, "start"):
                await module.start(self)

    async def stop_extension(self) -> None:
        for module in self._modules:
            if hasattr(module, "stop"):
                try:
                    await module.stop(self)
                except Exception as e:  # noqa: BLE001 - another module must not stop the server
                    self.log.warning("jupyter_pause: %s.stop failed: %s", module.__name__, e)
        if self._activity is not None:
            self._activity.stop()
        if self.lifecycle is not None:
            await self.lifecycle.stop()
        if self._state_lock is not None:
            self._state_lock.release()
            self._state_lock = None

    def _import(self, name: str) -> Any:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):  # the optional module itself is absent
                return None
            self.log.warning("jupyter_pause: cannot load %s: %s", name, e)
        except Exception as e:  # noqa: BLE001 - an optional module must not stop the server
            self.log.warning("jupyter_pause: cannot load %s: %s", name, e)
        return None
