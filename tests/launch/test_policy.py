"""The failure policy of a job that restarts (``_launch/policy.py``): a pure function."""

from __future__ import annotations

import pickle

import pytest

from dask_ddp._launch.policy import Decision, decide
from dask_ddp.errors import (
    FailureKind,
    GangStartError,
    JobError,
    RankAbortedError,
    RankFailedError,
    Restart,
    StallError,
    WorkerLostError,
)


def failure(kind: FailureKind) -> JobError:
    """The error a failed attempt raises for a root cause of this kind."""
    if kind is FailureKind.LOST:
        return WorkerLostError("worker left", 1, "tcp://w:1", kind=kind)
    if kind is FailureKind.STALLED:
        return StallError("stalled", 1, "tcp://w:1", ranks=[1], collective="all_reduce")
    if kind is FailureKind.ABORTED:
        return RankAbortedError("aborted", 1, "tcp://w:1", kind=kind)
    return RankFailedError("boom", 1, "tcp://w:1", kind=kind)


@pytest.mark.parametrize("kind", list(FailureKind), ids=str)
def test_every_failure_kind_restarts_while_restarts_are_left(kind: FailureKind) -> None:
    err = failure(kind)
    assert err.kind is kind
    assert decide(err, 0, 1) is Decision.RESTART
    assert decide(err, 2, 3) is Decision.RESTART


@pytest.mark.parametrize("kind", list(FailureKind), ids=str)
def test_every_failure_kind_raises_once_restarts_ran_out(kind: FailureKind) -> None:
    err = failure(kind)
    assert decide(err, 0, 0) is Decision.RAISE  # a job that never restarts
    assert decide(err, 1, 1) is Decision.RAISE
    assert decide(err, 5, 3) is Decision.RAISE


@pytest.mark.parametrize("error", [GangStartError("no workers"), RuntimeError("launcher"),
                                   TimeoutError("metrics")], ids=lambda e: type(e).__name__)
def test_an_error_that_is_not_a_rank_failure_raises(error: BaseException) -> None:
    assert decide(error, 0, 10) is Decision.RAISE


def test_attempts_are_declared_and_survive_pickling() -> None:
    record = Restart.of(0, failure(FailureKind.DIED))
    assert (record.rank, record.worker, record.kind) == (1, "tcp://w:1", "died")
    assert Restart.of(2, TimeoutError("t")).kind == "TimeoutError"
    gang = GangStartError("no workers")
    assert gang.attempts == []
    gang.attempts = [record]
    assert pickle.loads(pickle.dumps(gang)).attempts == [record]
    err = failure(FailureKind.RAISED)
    assert err.attempts == []
    err.attempts = [record]
    assert "attempt 0 at" in str(err.attempts[0])
