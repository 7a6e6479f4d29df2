"""What "idle" means, and the auto-pause state machine (pure: no Jupyter imports, clock injected).

Idle, for one workspace at time ``now``, with the profile's rules:

* no kernel is busy (a running cell always blocks an auto-pause, whatever the profile), and
* no kernel activity (any kernel message: executions, output, comms) for ``idle_after`` seconds,
  counted from the later of the last activity and the *baseline* (server start, last resume,
  last cancelled announcement: so a resumed workspace is never paused again at once, the
  Kubeflow culling bug kubeflow/kubeflow#6648), and
* terminal activity counts too when ``count_terminals``, and
* no client is connected when ``require_no_connections``.

A notebook that ran ``%pause --never`` (the kernel reports ``never_pause``) is exempt.

A kernel that cannot be checkpointed (another language, or no kernel side of jupyter-pause)
would lose its state in a pause. Nobody is there to say "pause anyway", so the profile decides
(``uncheckpointable``): ``skip`` (the default) never auto-pauses such a workspace and says why in
the verdict; ``pause_anyway`` pauses it, that kernel's state lost and named in the report. The
default keeps work: an hour of an R session is worth more than an idle accelerator-hour.
A ``stop`` profile saves no kernel's state anyway, so the rule does not apply to it.

``AutoPauser`` turns successive observations into decisions: announce (a client is connected:
give the person ``grace_period`` seconds to cancel), cancel (activity came back, or the person
said no), fire (go through the normal pause lifecycle with trigger "idle").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Action = Literal["pause", "stop", "none"]
Uncheckpointable = Literal["skip", "pause_anyway"]
UNCHECKPOINTABLE = ("skip", "pause_anyway")


@dataclass(frozen=True)
class Profile:
    """How one kind of workload is treated when idle.

    ``action``: ``pause`` = checkpoint + snapshot + release (the normal Pause); ``stop`` = release
    without a checkpoint or snapshot (small CPU notebooks: the files are what matters);
    ``none`` = never auto-pause.
    """

    name: str
    action: Action = "pause"
    idle_after: float = 3600.0
    grace_period: float = 300.0
    require_no_connections: bool = False
    count_terminals: bool = True
    snapshot: bool = True
    # A kernel that cannot be checkpointed: skip the auto-pause, or pause and lose its state.
    uncheckpointable: Uncheckpointable = "skip"
    description: str = ""

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class KernelView:
    """One kernel as the idle rules see it."""

    id: str
    execution_state: str = "idle"
    last_activity: float | None = None  # epoch seconds
    path: str | None = None
    never_pause: bool | None = None  # None = not asked (asked only before an announce/fire)
    # False: a pause cannot checkpoint it (``why`` says why); None = not asked (as above)
    checkpointable: bool | None = None
    why: str = ""
    kernel: str | None = None  # the kernelspec name


@dataclass
class Observation:
    """The workspace at one tick: kernels, connected clients, terminals."""

    kernels: list[KernelView] = field(default_factory=list)
    connections: int = 0  # connected clients (kernel websockets)
    terminal_last_activity: float | None = None
    terminals: int = 0

    @property
    def busy(self) -> list[KernelView]:
        return [k for k in self.kernels if k.execution_state not in ("idle", "dead")]

    @property
    def exempt(self) -> list[KernelView]:
        return [k for k in self.kernels if k.never_pause]

    @property
    def uncheckpointable(self) -> list[KernelView]:
        return [k for k in self.kernels if k.checkpointable is False]


@dataclass
class Verdict:
    """Whether the workspace is idle, since when, and every reason it is not."""

    idle: bool
    since: float  # when the idle clock started (last counted activity or the baseline)
    idle_for: float
    eligible_at: float | None  # when it becomes idle if nothing happens (None: blocked)
    blockers: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"idle": self.idle, "since": self.since, "idle_for": self.idle_for,
                "eligible_at": self.eligible_at, "blockers": list(self.blockers)}


def _name(k: KernelView) -> str:
    return k.path or k.id


def evaluate(obs: Observation, profile: Profile, now: float, baseline: float) -> Verdict:
    """Is the workspace idle under ``profile``? Lists every reason it is not."""
    blockers: list[str] = []
    last = baseline
    for k in obs.kernels:
        if k.last_activity is not None:
            last = max(last, k.last_activity)
    if profile.count_terminals and obs.terminal_last_activity is not None:
        last = max(last, obs.terminal_last_activity)
    idle_for = max(0.0, now - last)
    for k in obs.busy:
        blockers.append(f"kernel busy: {_name(k)}")
    if profile.require_no_connections and obs.connections > 0:
        blockers.append(f"{obs.connections} client(s) connected")
    if profile.action == "none":
        blockers.append(f"profile {profile.name} never auto-pauses")
    if obs.exempt:
        blockers.append("opted out with %pause --never: " + ", ".join(_name(k) for k in obs.exempt))
    if (profile.action == "pause" and profile.uncheckpointable == "skip"
            and obs.uncheckpointable):
        lost = "; ".join(f"{_name(k)} ({k.why})" for k in obs.uncheckpointable)
        blockers.append(f"a pause would lose the state of {lost}: profile {profile.name} does "
                        "not auto-pause then (uncheckpointable: skip)")
    eligible_at = None if blockers else last + profile.idle_after
    if not blockers and idle_for < profile.idle_after:
        blockers.append(f"active {int(idle_for)} s ago (idle after {int(profile.idle_after)} s)")
    return Verdict(idle=not blockers, since=last, idle_for=idle_for, eligible_at=eligible_at,
                   blockers=blockers)


@dataclass
class Decision:
    """What the auto-pauser does after one tick."""

    kind: Literal["none", "announce", "cancel", "fire"]
    reason: str = ""
    deadline: float | None = None


class AutoPauser:
    """The auto-pause state machine for one workspace: watching -> announced -> firing."""

    def __init__(self, profile: Profile, now: float):
        self.profile = profile
        self.state: Literal["watching", "announced", "firing"] = "watching"
        self.baseline = now
        self.deadline: float | None = None
        self.last_verdict: Verdict | None = None

    def needs_probe(self, obs: Observation, now: float) -> bool:
        """True when the next step could announce or fire: ask the kernels about --never then."""
        v = evaluate(obs, self.profile, now, self.baseline)
        if not v.idle:
            return False
        return self.state == "watching" or (self.state == "announced"
                                            and self.deadline is not None and now >= self.deadline)

    def step(self, obs: Observation, now: float, *, can_pause: bool = True) -> Decision:
        """One tick. ``can_pause`` is False while the lifecycle is not ``running``/``ready``."""
        v = self.last_verdict = evaluate(obs, self.profile, now, self.baseline)
        if self.state == "firing":
            return Decision("none", "auto-pause in progress")
        if not can_pause:
            if self.state == "announced":
                return self._cancel(now, "the workspace is busy with another pause or resume")
            return Decision("none", "the workspace is not running")
        if self.state == "announced":
            if not v.idle:
                return self._cancel(now, v.blockers[0])
            if self.deadline is not None and now >= self.deadline:
                return self._fire(v)
            return Decision("none", "announced", self.deadline)
        if not v.idle:
            return Decision("none", v.blockers[0])
        if obs.connections > 0 and self.profile.grace_period > 0:
            self.state = "announced"
            self.deadline = now + self.profile.grace_period
            return Decision("announce", self._why(v), self.deadline)
        return self._fire(v)

    def cancel(self, now: float, reason: str = "cancelled by the user") -> Decision | None:
        """The person said no: restart the idle clock from now."""
        if self.state != "announced":
            return None
        return self._cancel(now, reason)

    def reset(self, now: float) -> None:
        """After a pause/resume flight ends: watch again, idle clock from now."""
        self.state, self.deadline, self.baseline = "watching", None, now

    def _cancel(self, now: float, reason: str) -> Decision:
        self.state, self.deadline, self.baseline = "watching", None, max(self.baseline, now)
        return Decision("cancel", reason)

    def _fire(self, v: Verdict) -> Decision:
        self.state, self.deadline = "firing", None
        return Decision("fire", self._why(v))

    def _why(self, v: Verdict) -> str:
        return (f"idle for {int(v.idle_for // 60)} min (profile {self.profile.name}: "
                f"{self.profile.action} after {int(self.profile.idle_after // 60)} min)")
