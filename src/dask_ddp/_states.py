"""The states of a rank, a job and a job's attempt: each named once (internal).

A leaf every layer may import (the probe in a rank process, the stall rule and the job in
the launcher, the job pages on the scheduler), as Ray Train v2's controller states are. The
members are ``str`` enums: a member equals its value (``RankActivity.BLOCKED == "blocked"``),
so records that cross a process (the progress topic, the job page's JSON) carry the plain
value and read back into a member with ``RankActivity(value)``.
"""

from __future__ import annotations

from enum import Enum


class _Named(str, Enum):
    """A ``str`` enum that prints and formats as its value (``StrEnum`` from Python 3.11)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class RankActivity(_Named):
    """What a rank process is doing, as its probe and its supervisor see it.

    ``BLOCKED`` is a rank inside a collective; its supervisor reports it as blocked only
    once it has waited there for ``blocked_after`` (a collective that completes at once is
    work). ``FROZEN`` is a stopped process (SIGSTOP, a debugger).
    """

    WORKING = "working"
    BLOCKED = "blocked"
    RETURNED = "returned"
    FROZEN = "frozen"

    @property
    def is_idle(self) -> bool:
        """True when the rank makes no progress of its own (the stall rule's input)."""
        return self is not RankActivity.WORKING


class JobState(_Named):
    """The state of a job, and of each of its attempts (an elastic job's restarts).

    ``RESTARTING`` is a job's alone: an attempt failed, its policy answered ``RESTART``,
    and the job waits for workers to place the next attempt.
    """

    STARTING = "starting"
    RUNNING = "running"
    STALLED = "stalled"
    RESTARTING = "restarting"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """True for the states a job or an attempt never leaves."""
        return self in _TERMINAL


_TERMINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})

#: An attempt of an elastic job goes through the same states as a job.
AttemptState = JobState
