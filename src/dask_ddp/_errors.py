"""Exceptions raised by the launcher (see :mod:`dask_ddp.dispatch`)."""

from __future__ import annotations

from typing import Any


class GangStartError(RuntimeError):
    """The ranks of a job cannot all be placed: too few workers or missing resources."""


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
    kind : str
        How the rank ended: "raised" (its function raised), "raised-first" (it raised
        before any other rank did), "died" (its process exited non-zero or was killed
        without reporting), "lost" (its worker left), "aborted" (stopped by the launcher).
    """

    def __init__(self, message: str, rank: int, worker: str, remote_traceback: str = "",
                 cause: BaseException | None = None, kind: str = "raised") -> None:
        super().__init__(message)
        self.rank = rank
        self.worker = worker
        self.remote_traceback = remote_traceback
        self.kind = kind
        #: Earlier attempts of an elastic job (see :class:`dask_ddp.dispatch.Restart`),
        #: set when its restarts ran out.
        self.attempts: list[Any] = []
        if cause is not None:
            self.__cause__ = cause

    def __reduce__(self) -> tuple[Any, ...]:
        # Dask pickles exceptions to move them to the client; the default pickling of an
        # exception drops __cause__, which carries the rank's own exception.
        return (_rebuild, (type(self), str(self), self.rank, self.worker,
                           self.remote_traceback, self.__cause__, self.kind))


def _rebuild(cls: type[JobError], message: str, rank: int, worker: str, tb: str,
             cause: BaseException | None, kind: str) -> JobError:
    return cls(message, rank, worker, tb, cause, kind)


class RankFailedError(JobError):
    """A rank raised, exited non-zero or was killed: the root cause of a failed job."""


class WorkerLostError(JobError):
    """The worker running a rank left the cluster while the job ran."""


class RankAbortedError(JobError):
    """A rank was stopped because another rank of its job failed or the job was cancelled."""


class RemoteException(Exception):
    """Stands for a rank's exception that could not be unpickled; carries its traceback."""
