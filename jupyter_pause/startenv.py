"""The environment a process was started with, where ``/proc/self/environ`` does not say it.

A kernel forked by the launch package's zygote was exec'd as the zygote: its
``/proc/self/environ`` is the zygote's environment, not the one the kernel was started with. The
fork records that one here before anything else runs, so that what the checkpoint calls the
person's changes to ``os.environ`` stays what the person changed.
"""

from __future__ import annotations

_given: dict[str, str] | None = None


def set_given(env: dict[str, str]) -> None:
    """Record ``env`` as this process's start environment (a fork that became a kernel)."""
    global _given
    _given = dict(env)


def given() -> dict[str, str] | None:
    """The recorded start environment; None in a process that was exec'd as itself."""
    return None if _given is None else dict(_given)
