"""Exceptions raised by the launcher (see :mod:`dask_ddp.dispatch`)."""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any


class FailureKind(str, enum.Enum):
    """How a rank ended, most fundamental first (a lower :attr:`order` is likelier the root).

    A ``str`` enum: ``err.kind == "lost"`` holds.
    """

    REGROUP = "regroup"            # its live group could not go on (too few survivors, no
                                   # agreement in time): the reason a live job ended
    LOST = "lost"                  # its worker left the cluster
    DIED = "died"                  # its process exited non-zero or was killed, unreported
    RAISED_FIRST = "raised-first"  # it raised before any other rank of its job did
    RAISED = "raised"              # it raised (after another rank failed, maybe because of it)
    STALLED = "stalled"            # it was blocked in a collective that could not complete
    ABORTED = "aborted"            # stopped by the launcher (another rank failed, a cancel)

    def __str__(self) -> str:
        return self.value

    @property
    def order(self) -> int:
        return _ORDER[self]


_ORDER = {kind: i for i, kind in enumerate(FailureKind)}


def kind_order(kind: str) -> int:
    """:attr:`FailureKind.order` of ``kind``; an unknown kind sorts after ``raised``."""
    try:
        return FailureKind(kind).order
    except ValueError:
        return FailureKind.RAISED.order


@dataclasses.dataclass(frozen=True)
class Restart:
    """One failed attempt of an :class:`~dask_ddp.ElasticJob` (see :attr:`JobError.attempts`).

    Attributes
    ----------
    attempt : int
        The attempt that failed (0 is the first).
    time : float
        When its failure was seen (``time.time()``).
    rank : int
        The rank the failure is about (-1 when no rank is known).
    worker : str
        That rank's worker ("" when unknown).
    kind : str
        The failure's kind (see :class:`JobError`), or the exception's class name.
    reason : str
        The error message.
    """

    attempt: int
    time: float
    rank: int
    worker: str
    kind: str
    reason: str

    @classmethod
    def of(cls, attempt: int, err: BaseException) -> Restart:
        """The record of attempt ``attempt``, which failed with ``err``, seen now."""
        if isinstance(err, JobError):
            return cls(attempt, time.time(), err.rank, err.worker, str(err.kind), str(err))
        return cls(attempt, time.time(), -1, "", type(err).__name__, str(err))

    def __str__(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.time))
        return f"attempt {self.attempt} at {stamp}: {self.reason}"


class GangStartError(RuntimeError):
    """The ranks of a job cannot all be placed: too few workers or missing resources.

    Attributes
    ----------
    attempts : list of Restart
        The earlier attempts of an elastic job whose restart could not be placed (empty
        for a first attempt).
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.attempts: list[Restart] = []


class JobError(RuntimeError):
    """Base class of the errors a failed job raises on the client.

    Attributes
    ----------
    rank : int
        The rank the error is about.
    worker : str
        The Dask address of that rank's worker.
    remote_traceback : str
        The formatted traceback from the rank process ("" when there is none).
    kind : FailureKind
        How the rank ended (a ``str``): "raised" (its function raised), "raised-first" (it
        raised before any other rank did), "died" (its process exited non-zero or was
        killed without reporting), "lost" (its worker left), "aborted" (stopped by the
        launcher).
    attempts : list of Restart
        Every attempt of an elastic job, oldest first, when its restarts ran out (the
        last is this error's); empty otherwise.
    """

    def __init__(self, message: str, rank: int, worker: str, remote_traceback: str = "",
                 cause: BaseException | None = None,
                 kind: FailureKind | str = FailureKind.RAISED) -> None:
        super().__init__(message)
        self.rank = rank
        self.worker = worker
        self.remote_traceback = remote_traceback
        self.kind = FailureKind(kind)
        #: Every attempt of an elastic job, set when its restarts ran out.
        self.attempts: list[Restart] = []
        if cause is not None:
            self.__cause__ = cause

    def __reduce__(self) -> tuple[Any, ...]:
        # Dask pickles exceptions to move them to the client; the default pickling of an
        # exception drops __cause__, which carries the rank's own exception.
        return (_rebuild, (type(self), str(self), self.rank, self.worker,
                           self.remote_traceback, self.__cause__, self.kind.value))


def _rebuild(cls: type[JobError], message: str, rank: int, worker: str, tb: str,
             cause: BaseException | None, kind: str) -> JobError:
    return cls(message, rank, worker, tb, cause, kind)


class RankFailedError(JobError):
    """A rank raised, exited non-zero or was killed: the root cause of a failed job."""


class WorkerLostError(JobError):
    """The worker running a rank left the cluster while the job ran."""


class RankAbortedError(JobError):
    """A rank was stopped because another rank of its job failed or the job was cancelled."""


class StallError(JobError):
    """The job stalled: ranks were blocked in a collective that could no longer complete.

    Raised when no rank made progress for the job's ``stall_timeout`` (some rank blocked
    in a collective, every other rank blocked too, returned from its function, or
    frozen). A collective issued from C++ counts too: a rank inside ``backward()`` waiting
    in DDP's gradient all-reduce that a peer never issued (uneven data); the message
    then lists each rank's latest c10d collective (torch's flight recorder) and how to
    train on uneven data. :attr:`rank` is the first stuck rank (one in a collective its
    peers never issued first).

    Attributes
    ----------
    ranks : list of int
        The ranks blocked in a collective (or frozen).
    collective : str
        The collective the first stuck rank was blocked in (``"all_reduce"``...; the
        flight recorder's name, ``"gloo:all_reduce"``, for one issued from C++), or
        ``""`` when the stuck ranks were frozen.
    stacks : dict of int to str
        The Python stack of every thread of each rank still running when the stall was
        found (``{rank: text}``).
    """

    def __init__(self, message: str, rank: int, worker: str, remote_traceback: str = "",
                 cause: BaseException | None = None,
                 kind: FailureKind | str = FailureKind.STALLED, *,
                 ranks: list[int] | None = None, collective: str = "",
                 stacks: dict[int, str] | None = None) -> None:
        super().__init__(message, rank, worker, remote_traceback, cause, kind)
        self.ranks = list(ranks) if ranks is not None else [rank]
        self.collective = collective
        self.stacks = dict(stacks or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_stall, (str(self), self.rank, self.worker, self.__cause__,
                                 self.ranks, self.collective, self.stacks))


def _rebuild_stall(message: str, rank: int, worker: str, cause: BaseException | None,
                   ranks: list[int], collective: str, stacks: dict[int, str]) -> StallError:
    return StallError(message, rank, worker, "", cause, ranks=ranks, collective=collective,
                      stacks=stacks)


class RemoteException(Exception):
    """Stands for a rank's exception that could not be unpickled; carries its traceback."""
