"""Live recovery's NCCL path: a live group whose groups are rebuilt every generation, an
NCCL default group for the gradients beside a gloo control group, on two GPUs.

Two rank processes, one GPU each (:func:`live_util.two_group_main`): a planned change
re-forms the group (the old NCCL communicator aborted, a new one made, DDP given it) and
hands rank 0's state on (the header and pickled state over gloo from the CPU, the
parameters and buffers over NCCL on the GPU); then rank 1 leaves and rank 0 goes on alone
in a group of one. What this does not show: a rank lost inside an NCCL all-reduce (its
peers' kernels wait for it; see docs/fault-tolerance.md). The same run on the CPU, gloo
standing in for NCCL, proves the plumbing in ``make test``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import live_util

pytestmark = pytest.mark.timeout(180)


def check(run: dict, backend: str) -> None:
    files = run["files"]
    assert run["codes"] == [0, 75], run  # rank 1 left its group (LEAVE_EXIT)
    at_leave = [files[f"{u}.at_leave.json"] for u in (0, 1)]
    # Rank 1's spoiled parameters were replaced by rank 0's at the change: both stepped
    # alike to the leaving step, in a group of two on the job's backend.
    assert at_leave[0]["hash"] == at_leave[1]["hash"], at_leave
    assert {(r["world"], r["backend"], r["comms"]) for r in at_leave} == \
        {(2, backend, "Rebuilt")}, at_leave
    last = files["0.json"]
    assert (last["step"], last["world"], last["backend"]) == \
        (live_util.TWO_GROUP_STEPS, 1, backend), last
    assert last["generation"] == 2, last  # the change, then rank 1's leaving


def test_rebuilt_groups_on_the_cpu(tmp_path: Path) -> None:
    check(live_util.run_two_groups("cpu", tmp_path), "gloo")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (one a rank)")
def test_rebuilt_groups_on_two_gpus(tmp_path: Path) -> None:
    check(live_util.run_two_groups("cuda", tmp_path), "nccl")
