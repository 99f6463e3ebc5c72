"""The failure policy of a job that restarts: start again or raise (internal).

As Ray Train's ``FailurePolicy``: one small pure function decides what a failed attempt
leads to, apart from the machinery that carries it out (:class:`~dask_ddp.ElasticJob`'s
driver stops the ranks, waits for workers and launches the next attempt). A job that was
cancelled is not a failure and never reaches the policy.
"""

from __future__ import annotations

import enum

from dask_ddp.errors import JobError


class Decision(enum.Enum):
    """What a failed attempt leads to."""

    RESTART = "restart"  # start a new attempt on the workers available then
    RAISE = "raise"  # the job ends with the attempt's error


def decide(error: BaseException, restarts_so_far: int, max_restarts: int) -> Decision:
    """Whether a job restarts after an attempt failed with ``error``.

    Every failure of a rank (:class:`~dask_ddp.JobError`, whatever its
    :class:`~dask_ddp.errors.FailureKind`: raised, died, lost worker, stalled, aborted)
    restarts while fewer than ``max_restarts`` restarts were made; any other error (the
    launcher's own) is raised at once.

    Parameters
    ----------
    error
        The failed attempt's root cause (what its ``result()`` raised).
    restarts_so_far
        The restarts already made (0 after the first attempt failed).
    max_restarts
        The job's ``max_restarts``.

    Examples
    --------
    >>> from dask_ddp.errors import RankFailedError
    >>> decide(RankFailedError("boom", 1, "tcp://w:1"), 0, 1)
    <Decision.RESTART: 'restart'>
    >>> decide(RankFailedError("boom", 1, "tcp://w:1"), 1, 1)
    <Decision.RAISE: 'raise'>
    """
    if not isinstance(error, JobError) or restarts_so_far >= max_restarts:
        return Decision.RAISE
    return Decision.RESTART
