"""The recovery policy of a job: what a rank's end leads to (public as :mod:`dask_ddp.recovery`).

As Ray Train v2's ``FailurePolicy`` and torch elastic's agent loop, the decision is a small
pure function apart from the machinery that carries it out. Each event (a rank raised,
died, lost its worker, stalled, was aborted) is described once by a
:class:`RecoveryStatus`, the job's policy answers with an :class:`Action`, and the
process that met the event carries it out:

- a rank's process died (its supervisor, on the rank's worker): ``REGROUP`` records the
  rank lost on the live group's store and its task ends without an error;
- a rank's worker left, or a rank froze in a stall (the job's watcher, on the client):
  ``REGROUP`` (or ``CONTINUE``) leaves its peers running, anything else aborts them;
- an attempt ended with its root cause (the job's controller, on the client, in a job
  that may restart): ``RESTART`` (or ``REGROUP``: a smaller group from scratch) starts the
  next attempt on the workers available then; ``RAISE`` (or ``CONTINUE``: nothing runs to
  continue) ends the job with the error.

A policy that may answer ``REGROUP`` says so (``regroups = True``): its jobs start the
live machinery (a reconfigurable process group, its store on the scheduler; gloo, and a
Checkpointer-registered DDP model, as ``recovery="live"``). The built-ins are
:data:`RESTART` and :data:`LIVE`; a policy of one's own is one function wrapped in a
:class:`Policy`, passed as ``recovery=``. It travels pickled in the job's options to every
worker (a module-level function or class: pickled by reference, as ``submit``'s ``fn``).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from dask_ddp.errors import FailureKind, JobError

logger = logging.getLogger(__name__)


class Action(enum.Enum):
    """What an event leads to (see the module for where each is carried out)."""

    CONTINUE = "continue"  # nothing is done: the job goes on as it is
    REGROUP = "regroup"  # the rank's peers go on in a smaller group (live machinery)
    RESTART = "restart"  # the attempt ends; an ElasticJob starts another
    RAISE = "raise"  # the job ends with the rank's error


@dataclasses.dataclass(frozen=True)
class RecoveryStatus:
    """One event a policy decides on: what happened to which rank, and where the job is.

    Attributes
    ----------
    kind : FailureKind
        What happened: ``LOST`` (its worker left), ``DIED`` (its process ended unreported),
        ``RAISED``/``RAISED_FIRST``, ``STALLED``, ``ABORTED``.
    rank : int or None
        The rank it happened to (``None``: not one rank's, a launcher error).
    restarts : int
        The restarts the job made so far (0 in its first attempt).
    max_restarts : int
        The job's ``max_restarts``.
    min_workers : int
        The job's ``min_workers`` (1 when not given).
    live_workers : int or None
        The ranks of the attempt still running besides this one: ``None`` where the process
        asking cannot count them (a rank's supervisor, which sees its rank alone; the group
        then checks ``min_workers`` as it re-forms), 0 once the attempt ended.
    frozen : bool
        A ``STALLED`` rank stopped running (SIGSTOP, a hung host): ending it would free
        its peers. A rank blocked in a collective that cannot complete is not frozen.
    """

    kind: FailureKind
    rank: int | None = None
    restarts: int = 0
    max_restarts: int = 0
    min_workers: int = 1
    live_workers: int | None = None
    frozen: bool = False

    @property
    def restarts_left(self) -> bool:
        """Fewer than ``max_restarts`` restarts were made."""
        return self.restarts < self.max_restarts

    @classmethod
    def of(cls, error: BaseException, **fields: Any) -> RecoveryStatus:
        """The status of an attempt that ended with ``error`` (``live_workers`` 0); an
        error that is not a rank's (the launcher's own) is ``RAISED`` by no rank."""
        if not isinstance(error, JobError):
            return cls(kind=FailureKind.RAISED, rank=None, live_workers=0, **fields)
        return cls(kind=error.kind, rank=error.rank, live_workers=0, **fields)


@runtime_checkable
class RecoveryPolicy(Protocol):
    """What ``recovery=`` takes besides ``"restart"`` and ``"live"``.

    ``decide`` must be pure (the same status, the same action): it is asked in the client
    and in the ranks' workers, each about the events it meets.
    """

    @property
    def name(self) -> str:
        """Named in messages."""
        ...

    @property
    def regroups(self) -> bool:
        """Whether ``decide`` may answer ``REGROUP`` (the job starts the live machinery)."""
        ...

    def decide(self, status: RecoveryStatus) -> Action:
        """The action ``status`` leads to."""
        ...


@dataclasses.dataclass(frozen=True)
class Policy:
    """A policy made of one function: ``Policy("mine", rule, regroups=True)``.

    Parameters
    ----------
    name
        The policy's name (in messages).
    rule
        ``rule(status) -> Action``, pure; module-level, so that it pickles to the workers.
    regroups
        Whether ``rule`` may answer ``REGROUP``.

    Examples
    --------
    >>> def regroup_lost_workers(status: RecoveryStatus) -> Action:
    ...     if status.kind is FailureKind.LOST and status.live_workers != 0:
    ...         return Action.REGROUP
    ...     return restart_rule(status)
    >>> mine = Policy("regroup-lost-workers", regroup_lost_workers, regroups=True)
    >>> mine.decide(RecoveryStatus(FailureKind.LOST, rank=1, live_workers=2))
    <Action.REGROUP: 'regroup'>
    >>> mine.decide(RecoveryStatus(FailureKind.RAISED, rank=1, max_restarts=1))
    <Action.RESTART: 'restart'>
    """

    name: str
    rule: Callable[[RecoveryStatus], Action]
    regroups: bool = False

    def decide(self, status: RecoveryStatus) -> Action:
        return self.rule(status)


def restart_rule(status: RecoveryStatus) -> Action:
    """``recovery="restart"``: every failure of a rank, whatever its kind, restarts the job
    while restarts are left (``max_restarts``), else raises; an error that is not a rank's
    (the launcher's own, ``rank`` None) raises at once.

    >>> restart_rule(RecoveryStatus(FailureKind.DIED, rank=1, max_restarts=1))
    <Action.RESTART: 'restart'>
    >>> restart_rule(RecoveryStatus(FailureKind.DIED, rank=1, restarts=1, max_restarts=1))
    <Action.RAISE: 'raise'>
    """
    if status.rank is None or not status.restarts_left:
        return Action.RAISE
    return Action.RESTART


#: The kinds of end where a rank *left* (its peers may go on without it).
LEFT = (FailureKind.LOST, FailureKind.DIED)


def live_rule(status: RecoveryStatus) -> Action:
    """``recovery="live"``: a rank that left (its process died, its worker left, it froze)
    is regrouped without while the attempt runs and at least ``min_workers`` ranks remain
    (the group checks again as it re-forms, and raises when too few did); anything else
    (a rank raised, the group could not re-form, a stall of ranks blocked in a
    collective) is :func:`restart_rule`'s.

    >>> live_rule(RecoveryStatus(FailureKind.LOST, rank=0, live_workers=2, min_workers=2))
    <Action.REGROUP: 'regroup'>
    >>> live_rule(RecoveryStatus(FailureKind.LOST, rank=0, live_workers=1, min_workers=2))
    <Action.RAISE: 'raise'>
    """
    left = status.kind in LEFT or (status.kind is FailureKind.STALLED and status.frozen)
    enough = status.live_workers is None or status.live_workers >= status.min_workers
    if left and enough and status.live_workers != 0:
        return Action.REGROUP
    return restart_rule(status)


RESTART = Policy("restart", restart_rule)
LIVE = Policy("live", live_rule, regroups=True)
#: The built-in policies by their ``recovery=`` word: the one place that names them.
BUILT_IN: dict[str, Policy] = {p.name: p for p in (RESTART, LIVE)}
NAMES = tuple(BUILT_IN)


def policy_of(value: Any) -> RecoveryPolicy:
    """The policy ``recovery=value`` names: a built-in's word, or a :class:`RecoveryPolicy`.

    Raises :class:`ValueError` naming the value when it is neither.
    """
    if isinstance(value, str):
        if value not in BUILT_IN:
            raise ValueError(f"recovery must be one of {NAMES} or a RecoveryPolicy, "
                             f"got {value!r}")
        return BUILT_IN[value]
    if not (isinstance(value, RecoveryPolicy) and callable(value.decide)
            and isinstance(value.regroups, bool) and isinstance(value.name, str)):
        raise ValueError(f"recovery must be one of {NAMES} or a RecoveryPolicy (a `name` "
                         f"str, a `regroups` bool and a `decide(status)` method), got "
                         f"{value!r}")
    return value


def ask(policy: RecoveryPolicy, status: RecoveryStatus) -> Action:
    """``policy.decide(status)``, checked: an answer that is not an :class:`Action` raises
    :class:`TypeError` naming the policy; ``REGROUP`` from a policy that does not regroup
    (its job has no live machinery) is carried out as ``RESTART``, with a warning."""
    action = policy.decide(status)
    if not isinstance(action, Action):
        raise TypeError(f"recovery policy {policy.name!r} answered {action!r} for {status}; "
                        f"decide() must return an Action ({[a.name for a in Action]})")
    if action is Action.REGROUP and not policy.regroups:
        logger.warning("recovery policy %r answered REGROUP but does not regroup "
                       "(regroups=False): restarting instead", policy.name)
        return Action.RESTART
    return action
