"""The root-cause order of a job's failure records (the supervisors' and the seed-style
gather's choice, _launch/wire/root_cause.py), on records as the failure topic holds them."""

from __future__ import annotations

from typing import Any

from dask_ddp._launch.wire.root_cause import better_record
from dask_ddp.errors import FailureKind


def rec(rank: int, kind: FailureKind, broken: bool = False) -> dict[str, Any]:
    return {"rank": rank, "worker": f"tcp://w{rank}", "kind": str(kind),
            "message": f"rank {rank}: {kind}", "traceback": "", "broken": broken}


STALL = rec(1, FailureKind.STALLED)


def test_a_stall_outranks_a_collective_it_broke() -> None:
    # Rank 1, stuck, is named by the stall; ending the job stopped rank 0, which broke
    # rank 1's collective: rank 1's own error gives way to the stall, and so does its
    # record when rank 0 (stopped: aborted) looks for the root cause.
    broken = rec(1, FailureKind.RAISED_FIRST, broken=True)
    assert better_record([STALL, broken], 1, FailureKind.RAISED_FIRST, broken=True) is STALL
    assert better_record([STALL, broken], 0, FailureKind.ABORTED) is STALL
    assert better_record([broken, STALL], 0, FailureKind.ABORTED) is STALL


def test_a_real_fault_still_outranks_a_stall() -> None:
    # A rank that died, or raised an error of its own (not a broken collective), is the
    # root cause even when a stall was recorded too.
    died = rec(0, FailureKind.DIED)
    assert better_record([STALL, died], 1, FailureKind.RAISED, broken=True) is died
    raised = rec(0, FailureKind.RAISED_FIRST)
    assert better_record([STALL, raised], 1, FailureKind.ABORTED) is raised
    # Without a stall a broken collective's record is an ordinary fault.
    broken = rec(0, FailureKind.RAISED_FIRST, broken=True)
    assert better_record([broken], 1, FailureKind.ABORTED) is broken


def test_a_rank_error_that_is_not_a_broken_collective_keeps_its_own() -> None:
    # The stall does not replace an error a rank raised by itself (broken=False), which
    # is more fundamental than a stall by the kinds' order.
    assert better_record([STALL], 1, FailureKind.RAISED_FIRST) is None
    assert better_record([STALL], 1, FailureKind.ABORTED) is STALL
    assert better_record([], 1, FailureKind.RAISED, broken=True) is None
