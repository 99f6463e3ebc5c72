"""The recovery policy's seam (``_launch/wire/policy.py``): resolving ``recovery=``, asking a
policy, and the status of a failed attempt; the built-ins' decisions are in
``test_recovery_policy.py``."""

from __future__ import annotations

import logging
import pickle

import pytest

from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._launch.wire.policy import (
    BUILT_IN,
    LIVE,
    NAMES,
    RESTART,
    Action,
    Policy,
    RecoveryStatus,
    ask,
    policy_of,
)
from dask_ddp.errors import (
    FailureKind,
    GangStartError,
    RankFailedError,
    Restart,
    StallError,
    WorkerLostError,
)

PAYLOAD = pickle.dumps((print, (), {}))


def always_regroup(status: RecoveryStatus) -> Action:
    return Action.REGROUP


def answer_text(status: RecoveryStatus) -> Action:
    return "restart"  # type: ignore[return-value]  # a policy's bug under test


def test_the_words_name_the_built_ins_and_only_them() -> None:
    assert NAMES == ("restart", "live")
    assert policy_of("restart") is RESTART and policy_of("live") is LIVE
    assert (RESTART.regroups, LIVE.regroups) == (False, True)
    assert set(BUILT_IN) == set(NAMES)


# Ids without addresses: every xdist process must collect the same names.
@pytest.mark.parametrize("value", ["elastic", "", 3, None, object(), always_regroup],
                         ids=["elastic", "empty", "3", "None", "an-object", "a-function"])
def test_a_value_that_is_no_policy_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ValueError, match=r"recovery must be one of \('restart', 'live'\) "
                                         r"or a RecoveryPolicy.*got " + repr(value)[:20]
                                         .replace("(", r"\(").replace(")", r"\)")
                                         .replace(".", r"\.")):
        policy_of(value)


def test_an_object_with_the_three_members_is_a_policy() -> None:
    class Mine:
        name = "mine"
        regroups = False

        def decide(self, status: RecoveryStatus) -> Action:
            return Action.RAISE

    mine = Mine()
    assert policy_of(mine) is mine
    opts = LaunchOptions(name="t", payload=PAYLOAD, recovery=mine)
    assert opts.policy is mine


def test_a_policy_travels_in_the_options() -> None:
    mine = Policy("mine", always_regroup, regroups=False)
    opts = pickle.loads(pickle.dumps(LaunchOptions(name="t", payload=PAYLOAD, recovery=mine)))
    assert opts.policy == mine and opts.policy.decide(RecoveryStatus(FailureKind.LOST)) \
        is Action.REGROUP


def test_ask_refuses_an_answer_that_is_no_action() -> None:
    with pytest.raises(TypeError, match=r"policy 'texty' answered 'restart'.*must return an "
                                        r"Action"):
        ask(Policy("texty", answer_text), RecoveryStatus(FailureKind.RAISED, rank=0))


def test_ask_restarts_for_a_regroup_without_the_live_machinery(
        caplog: pytest.LogCaptureFixture) -> None:
    status = RecoveryStatus(FailureKind.LOST, rank=1)
    with caplog.at_level(logging.WARNING, logger="dask_ddp._launch.wire.policy"):
        assert ask(Policy("eager", always_regroup), status) is Action.RESTART
    assert "'eager' answered REGROUP but does not regroup" in caplog.text
    assert ask(Policy("eager", always_regroup, regroups=True), status) is Action.REGROUP


@pytest.mark.parametrize("error, kind", [
    (WorkerLostError("worker left", 1, "tcp://w:1", kind=FailureKind.LOST), FailureKind.LOST),
    (RankFailedError("boom", 2, "tcp://w:1", kind=FailureKind.DIED), FailureKind.DIED),
    (StallError("stalled", 0, "tcp://w:1", ranks=[0], collective="all_reduce"),
     FailureKind.STALLED),
], ids=lambda v: str(v)[:12])
def test_the_status_of_an_ended_attempt(error: RankFailedError, kind: FailureKind) -> None:
    status = RecoveryStatus.of(error, restarts=1, max_restarts=3, min_workers=2)
    assert (status.kind, status.rank, status.live_workers) == (kind, error.rank, 0)
    assert (status.restarts, status.max_restarts, status.min_workers) == (1, 3, 2)
    assert status.restarts_left


def test_the_launchers_own_error_is_no_ranks_and_raises() -> None:
    status = RecoveryStatus.of(GangStartError("no workers"), restarts=0, max_restarts=10)
    assert status.rank is None
    assert RESTART.decide(status) is Action.RAISE and LIVE.decide(status) is Action.RAISE


def test_attempts_are_declared_and_survive_pickling() -> None:
    record = Restart.of(0, RankFailedError("boom", 1, "tcp://w:1", kind=FailureKind.DIED))
    assert (record.rank, record.worker, record.kind) == (1, "tcp://w:1", "died")
    assert Restart.of(2, TimeoutError("t")).kind == "TimeoutError"
    gang = GangStartError("no workers")
    assert gang.attempts == []
    gang.attempts = [record]
    assert pickle.loads(pickle.dumps(gang)).attempts == [record]
    err = RankFailedError("boom", 1, "tcp://w:1")
    assert err.attempts == []
    err.attempts = [record]
    assert "attempt 0 at" in str(err.attempts[0])
