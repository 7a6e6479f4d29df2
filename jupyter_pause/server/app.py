"""The jupyter_server extension: configuration (``c.PauseApp.<trait>``), routes, start and stop."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
from importlib.metadata import entry_points
from typing import Any, ClassVar

from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Dict, Float, Instance, Int, List, Unicode, Union, default, validate

from .. import configcheck as cc
from ..cluster.accelerator import detected_accelerator
from ..cluster.base import Backend, resolve_backend_class
from ..launch.provisioner import NAME as ZYGOTE
from . import jupyter_seams, kernelguard
from .deaths import Deaths
from .events import register_schema
from .handlers import default_handlers
from .lifecycle import Lifecycle
from .restarts import RestartWatch
from .shutdown import checkpoint_on_shutdown
from .statelock import StateDirBusy, StateLock

# Modules that add routes and start-up work (the policy tools are one: they use this package,
# never the reverse). Found by entry point, each by its module name; each may define
#   get_handlers(app: PauseApp) -> list[tuple[str, type]]   (patterns like r"/jupyter-pause/api/x")
#   async def start(app: PauseApp) -> None ;  async def stop(app: PauseApp) -> None
#   autosave_settings(app: PauseApp) -> dict   (defaults for ``autosave``, e.g. per profile)
EXTENSION_MODULES_GROUP = "jupyter_pause.server_modules"


class PauseApp(cc.ValidatedConfig, ExtensionApp):
    """The jupyter_server extension: configuration, the lifecycle, its handlers and events."""

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
    store_memory = Unicode(
        "", help="Memory that checkpoints to an object store (gs://, s3://) may hold for "
        "streamed uploads and restores, all parts in flight together: bytes or 256M, 1G "
        "(minimum 16M). Empty = the checkpoint library's default (256M)."
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
        3600.0, help="Seconds a checkpoint or restore inside one kernel may take in all, "
        "however steadily it progresses (a hard upper bound; a stuck kernel is caught sooner "
        "by kernel_silence_timeout)."
    ).tag(config=True)
    kernel_silence_timeout = Float(
        60.0, help="Seconds a kernel's checkpoint (at pause) or restore (at resume) may go with "
        "no progress message and no heartbeat answer before it fails as stalled, naming the "
        "notebook (a process stopped by SIGSTOP or frozen). A kernel busy in one long step "
        "still answers its heartbeat and is waited for. 0 = off (only bridge_timeout)."
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
    checkpoint_on_shutdown = Bool(
        True, help="When the server is asked to stop (SIGTERM, SIGINT, the shutdown API, "
        "`jupyter server stop`), checkpoint every kernel before the kernels are shut down.",
    ).tag(config=True)
    shutdown_checkpoint_budget = Float(
        20.0, help="Seconds the shutdown checkpoint may take, waiting for busy kernels "
        "included; what is not saved by then is named in the journal. The default fits "
        "Kubernetes' default terminationGracePeriodSeconds (30 s) with room for the kernels' "
        "own shutdown: raise both together.",
    ).tag(config=True)
    restore_after_stop = Bool(
        True, help="After a stop that saved a notebook's kernel, restore that checkpoint into "
        "the next kernel started for the notebook, before its session request answers.",
    ).tag(config=True)
    autosave = Union(
        [Bool(), Dict()], default_value=True,
        help="Autosave each kernel after its cells (a checkpoint of kind 'autosave', written "
        "while the kernel is idle; a cell never waits for it), so that a killed kernel or "
        "server loses at most the cell that was running. True/False, or a dict: enabled "
        "(bool), every_s (at most one per this many seconds, 0: after each cell), idle_delay "
        "(seconds idle before a write starts, default 0.25), keep (newest autosaves kept per "
        "notebook, default 3), max_bytes (and at most this many bytes of them, 0: no bound).",
    ).tag(config=True)
    kernel_huge_pages = Bool(
        True, help="Start kernels with THP_MEM_ALLOC_ENABLE=1 (unless the environment sets it): "
        "torch then backs large CPU tensors with transparent huge pages, so the fork of an "
        "autosave copies one page-table entry per 2 MiB instead of per 4 KiB (a 4 GiB state: "
        "about a quarter of the time, and a cell writing a tensor meanwhile is held less). "
        "Cost: each CPU allocation of 2 MiB or more is aligned to 2 MiB pages, and a write "
        "during an autosave copies 2 MiB at a time; set False in a pod sized to the byte.",
    ).tag(config=True)
    fast_kernel_start = Bool(
        True, help="Start python kernels (this interpreter's ipykernel) as forks of one process "
        "that imported ipykernel, numpy and pandas once (the jupyter-pause-zygote kernel "
        "provisioner), instead of a new interpreter each importing them: a resume of eight "
        "notebooks on two cores then takes about twice one, not four times. Kernels it cannot "
        "fork exactly as a new process would start (another interpreter or kernel, interpreter "
        "flags, a module of the notebook's directory shadowing an imported one) start as "
        "before. Applies where no kernel provisioner is configured "
        "(KernelProvisionerFactory.default_provisioner_name, a kernelspec's own).",
    ).tag(config=True)
    extension_modules = List(
        Unicode(),
        help="Modules that add routes/start-up work (get_handlers(app), start(app), stop(app), "
        f"autosave_settings(app)); default: those of entry-point group {EXTENSION_MODULES_GROUP!r}.",
    ).tag(config=True)

    @default("extension_modules")
    def _default_extension_modules(self) -> list[str]:
        return [ep.value for ep in sorted(entry_points(group=EXTENSION_MODULES_GROUP),
                                          key=lambda ep: ep.name)]

    # Values traitlets' types let through but nothing could use: refused at start, with the
    # reason in status, instead of at the resume that needs them (see jupyter_pause.configcheck).
    config_checks: ClassVar[dict[str, cc.Check]] = {
        "store_url": cc.store_url, "store_memory": cc.store_memory,
        "keep_checkpoints": cc.count, "busy_timeout": cc.seconds(),
        "restore_device": cc.device, "accelerator": cc.accelerator,
        "bridge_timeout": cc.seconds(positive=True), "variable_timeout": cc.seconds(),
        "kernel_silence_timeout": cc.seconds(),
        "liveness_timeout": cc.seconds(positive=True), "activity_interval": cc.seconds(),
        "progress_interval": cc.seconds(), "first_cell_watch": cc.seconds(),
        "shutdown_checkpoint_budget": cc.seconds(),
    }
    # What a resume reads too: a wrong one of these refuses the resume, the others only pauses.
    resume_traits = frozenset({"store_url", "store_memory", "restore_device", "bridge_timeout",
                               "liveness_timeout"})

    @validate(*config_checks)
    def _validate_config(self, proposal: Any) -> Any:
        return self._checked(proposal)

    backend_instance = Instance(Backend, allow_none=True)
    lifecycle = Instance(Lifecycle, allow_none=True)
    # Set when this app's configuration could not be applied (see update_config).
    config_error: str | None = None
    # Set when another live server holds the state directory: the API answers 503 with it.
    disabled_reason: str | None = None
    _state_lock: StateLock | None = None
    _restarts: RestartWatch | None = None
    _deaths: Deaths | None = None
    _profile_autosave: dict[str, Any] | None = None
    _modules: list[Any] | None = None
    _renames: kernelguard.RenameWatch | None = None
    # How the server was asked to stop: "signal", "api" (the shutdown API), "idle".
    _stop_trigger: str | None = None
    _stop_watch: jupyter_seams.StopTrigger | None = None
    _sigint: jupyter_seams.SigintStop | None = None
    _stopping: asyncio.Future | None = None
    _started = False
    # Set once the start-up checks (the lifecycle's, a killed server's offers) are done.
    _start_checked: asyncio.Event | None = None

    @default("accelerator")
    def _default_accelerator(self) -> dict[str, Any]:
        return dict(detected_accelerator())  # never torch: the server holds no CUDA context

    @default("state_dir")
    def _default_state_dir(self) -> str:
        return os.path.join(jupyter_data_dir(), "jupyter-pause", "state")

    def autosave_settings(self) -> dict[str, Any]:
        """``autosave`` as the kernels' settings (see ``kernel.autosave.Settings``): the
        workload profile's (``policy.profiles``), then this trait's own keys."""
        value = self.autosave
        if value is False or self.config_error:
            # an invalid configuration rolled the store back to the default one: nothing is
            # written there behind the person's back (pause and resume are refused alike)
            return {"enabled": False}
        if self._profile_autosave is None:
            self._profile_autosave = self._autosave_of_profile()
        own = value if isinstance(value, dict) else {}
        return {"enabled": True, **self._profile_autosave,
                **{k: v for k, v in own.items() if isinstance(k, str)}}

    def _autosave_of_profile(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for module in self._load_modules():
            if hasattr(module, "autosave_settings"):
                try:
                    out.update(module.autosave_settings(self))
                except Exception as e:  # noqa: BLE001 - a bad policy config: the defaults then
                    self.log.warning("jupyter_pause: autosave per profile not applied: %s", e)
        return out

    def _load_modules(self) -> list[Any]:
        if self._modules is None:
            self._modules = [m for m in (self._import(n) for n in self.extension_modules) if m]
        return self._modules

    def refusal(self, action: str) -> str | None:
        """Why this configuration cannot run ``action`` ("pause" or "resume"), else None."""
        if self.config_error:
            return self.config_error
        lines = self.config_refusal(action)
        backend = self.backend_instance
        if isinstance(backend, cc.ValidatedConfig):
            lines += backend.config_refusal(action)
        return f"invalid jupyter_pause configuration: {'; '.join(lines)}" if lines else None

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
        # %restore, %resume) use the store and key the server uses, and lets %checkpoint's
        # retention see which checkpoints a pause or resume depends on.
        for var, value in (("JUPYTER_PAUSE_STORE_URL", self.store_url),
                           ("JUPYTER_PAUSE_KEY_PATH", self.key_path),
                           ("JUPYTER_PAUSE_STATE_DIR", self.state_dir),
                           ("JUPYTER_PAUSE_STORE_MEMORY", self.store_memory)):
            if value:
                os.environ[var] = value
        # The magics' own autosave (%load_ext in a kernel the server did not start) alike.
        os.environ["JUPYTER_PAUSE_AUTOSAVE"] = json.dumps(self.autosave_settings(), default=str)
        if self.kernel_huge_pages and self.autosave_settings().get("enabled"):
            # read by torch's CPU allocator (c10/core/impl/alloc_cpu.cpp) at its first use
            os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
        self._kernel_provisioner()
        # Detect now, at start-up, not on the event loop's first pause (nvidia-smi may be slow).
        self.log.info("jupyter_pause: accelerator %s", self.accelerator)
        self.backend_instance = resolve_backend_class(self.backend)(parent=self)
        register_schema(self.serverapp)
        self.lifecycle = Lifecycle(self)
        self.settings["jupyter_pause_lifecycle"] = self.lifecycle
        self._activity: PeriodicCallback | None = None
        # Their routes exist either way (a disabled server answers them with 503).
        self._load_modules()
        if self._lock_state_dir():
            self.lifecycle.load()

    def _kernel_provisioner(self) -> None:
        """fast_kernel_start: the zygote provisioner for kernelspecs that name none, unless the
        server's configuration or environment chose a default provisioner itself."""
        from jupyter_client.provisioning.factory import KernelProvisionerFactory as Factory

        serverapp = self.serverapp
        if serverapp is None:
            return
        factory = Factory.instance(parent=serverapp)
        chosen = "default_provisioner_name" in serverapp.config.get(
            "KernelProvisionerFactory", {}) or os.environ.get(Factory.default_provisioner_name_env)
        local = "local-provisioner"
        if chosen:
            return
        if self.fast_kernel_start and factory.default_provisioner_name == local:
            factory.default_provisioner_name = ZYGOTE
        elif not self.fast_kernel_start and factory.default_provisioner_name == ZYGOTE:
            factory.default_provisioner_name = local  # another server of this process chose it

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
        self.handlers.extend(default_handlers())
        # jupyter_server's routes that start kernels, refusing while paused (kernelguard).
        self.handlers.extend(kernelguard.handlers())
        for module in self._modules or ():
            if hasattr(module, "get_handlers"):
                self.handlers.extend(module.get_handlers(self))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        lc = self.lifecycle
        if self.disabled_reason or lc is None:  # no lifecycle: the extension is disabled
            return
        # What a pause means to the kernel and session managers, and the restore after a
        # stop: in one place, kernelguard. Before the first await: the server may already
        # answer requests while this method waits, and a session opened then must be guarded
        # and restored like any other.
        kernelguard.install(lc)
        self._start_checked = asyncio.Event()
        # How a stop was asked for, and a SIGINT without a terminal routed to a clean stop:
        # before the first await too (a signal in that window must still stop cleanly).
        self._stop_watch = jupyter_seams.StopTrigger(serverapp)
        self._sigint = jupyter_seams.SigintStop()
        self._sigint.install(serverapp)
        try:
            await lc.start()
            self._started = True
            self._restarts = RestartWatch(serverapp)
            self._restarts.start()
            self._deaths = Deaths(self)
            await self._deaths.start_after_kill()
        finally:
            self._start_checked.set()
        self._deaths.start()
        self._renames = kernelguard.RenameWatch(lc)
        self._renames.start()
        if self.activity_interval > 0:
            self._activity = PeriodicCallback(lc.sample_activity,
                                              self.activity_interval * 1000)
            self._activity.start()
        for module in self._modules or ():
            if hasattr(module, "start"):
                await module.start(self)

    async def start_checked(self, timeout: float) -> None:
        """Return once the start-up checks are done (or after ``timeout``). The server answers
        requests while they run; a page's first ``GET status`` must already hold what they
        found (a killed server's offers): their events may come before the page listens."""
        if self._start_checked is not None and not self._start_checked.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._start_checked.wait(), timeout)

    def current_activity(self) -> list[str]:
        """What jupyter_server's idle shutdown (``shutdown_no_activity_timeout``, asked only
        when no kernel runs) must wait for: a pause, a resume or the shutdown checkpoint in
        flight, a restore after a stop. With the local backend a paused or resuming workspace
        has no kernel, and a stop in the middle of a resume would lose it. Never the kernels'
        autosaves or their own checkpoints (not the person's activity), and never a paused
        workspace with nothing in flight: that one is idle, and may be shut down."""
        lc = self.lifecycle
        busy: list[str] = []
        if lc is not None:
            if lc.flight is not None:
                busy.append(f"jupyter_pause {lc.flight.kind} {lc.flight.id}")
            busy += [f"jupyter_pause restore of {p} after the stop"
                     for p in sorted(lc.restoring_after_stop)]
        if not busy and self._stop_watch is not None:
            self._stop_watch.idle_check()  # the idle shutdown may stop the server now
        return busy

    async def stop_extension(self) -> None:
        # jupyter_server may run its clean-up twice (a second SIGTERM): the second call must
        # not go on to shut the kernels down while the first one still checkpoints them.
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_extension())
        await asyncio.shield(self._stopping)

    async def _stop_extension(self) -> None:
        if self._stop_trigger is None and self._stop_watch is not None:
            self._stop_trigger = self._stop_watch.trigger()
        try:
            await self._stop_all()
        finally:
            # Only now: a second SIGINT during the checkpoint must wait for this stop (our
            # handler), not interrupt it with KeyboardInterrupt out of the event loop.
            if self._sigint is not None:
                self._sigint.restore()

    async def _stop_all(self) -> None:
        for module in self._modules or ():
            if hasattr(module, "stop"):
                try:
                    await module.stop(self)
                except Exception as e:  # noqa: BLE001 - another module must not stop the server
                    self.log.warning("jupyter_pause: %s.stop failed: %s", module.__name__, e)
        if self._activity is not None:
            self._activity.stop()
        if self._restarts is not None:
            await self._restarts.stop()
        if self._renames is not None:
            self._renames.stop()
        if self.lifecycle is not None:
            await self._checkpoint_on_shutdown()
            await self.lifecycle.stop()
        if self._deaths is not None:
            await self._deaths.stop(clean=True)  # last: a stop killed before here is unclean
        if self._state_lock is not None:
            self._state_lock.release()
            self._state_lock = None

    async def _checkpoint_on_shutdown(self) -> None:
        # Never into the default store when the configured one could not be applied.
        lc = self.lifecycle
        if not (self.checkpoint_on_shutdown and self._started and lc) or self.config_error:
            return
        trigger = self._stop_trigger or "api"
        # A hub's spawner stops its server with a signal; say so (the culler and "Stop My
        # Server" cannot be told apart from here).
        hub = bool(os.environ.get("JUPYTERHUB_API_TOKEN")
                   or os.environ.get("JUPYTERHUB_SERVICE_PREFIX"))
        self.log.info("jupyter_pause: checkpointing the kernels before the server stops (%s, "
                      "budget %g s)", trigger, self.shutdown_checkpoint_budget)
        try:
            await checkpoint_on_shutdown(lc, trigger, self.shutdown_checkpoint_budget,
                                         hub=hub)
        except Exception:  # the server must stop whatever happens here
            self.log.exception("jupyter_pause: the shutdown checkpoint failed")

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
