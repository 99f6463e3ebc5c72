"""Stalls inside DDP's own collectives: a rank blocked in ``backward()`` (the reducer's
gradient all-reduce, issued from C++) while its peer returned ends the job with an error
naming it, its stack and how to train on uneven data; a rank that computes after its last
backward is never taken for one. The rule itself on plain records (no cluster)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

import dask_ddp
from cluster_util import client_fixture
from dask_ddp import dispatch
from dask_ddp._launch.client.stall import find_stall, in_c10d, stall_error, where_c10d
from launch_util import (
    ddp_compute_after_backward,
    ddp_frozen_inside_allreduce,
    ddp_uneven_steps,
    ddp_uneven_steps_with_buffers,
)

pytestmark = [pytest.mark.timeout(180)]

client = client_fixture(2)

STALL_S = 4.0
#: The job ends within stall_timeout plus one poll; what the loaded machine adds on top
#: (the process group's setup, the stacks' read) stays well under this.
END_BOUND_S = 60.0

log = logging.getLogger(__name__)


def check_ddp_stall(err: dask_ddp.StallError, where: str) -> str:
    """The uneven-steps stall's error: rank 1 in DDP's gradient all-reduce, its stack
    inside backward() in ``where``, rank 0 at the end, the Join hint."""
    text = str(err)
    assert err.rank == 1 and err.ranks[0] == 1, text
    assert err.collective == "gloo:all_reduce", text
    assert "rank 1 blocked in DDP's gradient all-reduce (gloo:all_reduce #" in text, text
    assert "issued from backward()" in text, text
    assert "Latest c10d collective of each rank" in text, text
    assert "Join" in text and "drop_last" in text and "equal batch counts" in text, text
    assert "backward" in err.stacks[1] and where in err.stacks[1], err.stacks
    assert "Python stacks of the ranks" in text
    return text


def test_uneven_ddp_steps_end_as_a_stall(client: Client) -> None:
    job = dask_ddp.submit(client, ddp_uneven_steps, 0.0, n_workers=2, progress=False,
                          stall_timeout=STALL_S)
    t0 = time.monotonic()
    with pytest.raises(dask_ddp.StallError) as info:
        job.result(timeout=120)
    took = time.monotonic() - t0
    text = check_ddp_stall(info.value, "ddp_uneven_steps")
    assert "rank 0 returned from its function" in text, text
    assert "_finish_barrier" in info.value.stacks[0], info.value.stacks
    assert took < END_BOUND_S, f"the stall took {took:.0f} s to end the job"
    log.warning("stall error after %.1f s (stall_timeout %g s):\n%s", took, STALL_S, text)


def test_dispatch_run_sees_the_ddp_stall(client: Client) -> None:
    futures = dispatch.run(client, ddp_uneven_steps, 0.0, stall_timeout=STALL_S)
    with pytest.raises(dask_ddp.StallError) as info:
        client.gather(futures, errors="raise")
    check_ddp_stall(info.value, "ddp_uneven_steps")


def test_ddp_forward_broadcast_stall(client: Client) -> None:
    # DDP broadcasts a BatchNorm's buffers in each forward: rank 1's extra step waits
    # there, before any backward.
    job = dask_ddp.submit(client, ddp_uneven_steps_with_buffers, 0.0, n_workers=2,
                          progress=False, stall_timeout=STALL_S)
    with pytest.raises(dask_ddp.StallError) as info:
        job.result(timeout=120)
    text = str(info.value)
    assert info.value.rank == 1, text
    assert "rank 1 blocked in DDP's forward-time broadcast (gloo:broadcast #" in text, text
    assert "Join" in text and "forward" in info.value.stacks[1], text


UNEVEN_DDP_SCRIPT = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(8, 2))
for step in range(3 + dist.get_rank()):  # uneven data: rank 1 has one batch more
    model(torch.randn(4, 8)).sum().backward()
dist.barrier()  # rank 0 waits here for good: rank 1's all-reduce is not a barrier
dist.destroy_process_group()
"""


def test_a_scripts_ddp_stall_is_found_too(client: Client, tmp_path: Any) -> None:
    script = tmp_path / "uneven_ddp.py"
    script.write_text(UNEVEN_DDP_SCRIPT)
    with pytest.raises(dask_ddp.StallError) as info:
        dask_ddp.run_command(client, ["python", str(script)], n_workers=2,
                             stream_output=False, timeout=120, stall_timeout=STALL_S)
    text = check_ddp_stall(info.value, "uneven_ddp.py")
    assert "rank 0 blocked in barrier" in text, text
    log.warning("a script's stall error:\n%s", text)


def test_dask_ddp_run_reports_the_ddp_stall(client: Client, tmp_path: Path) -> None:
    script = tmp_path / "uneven_ddp.py"
    script.write_text(UNEVEN_DDP_SCRIPT)
    env = dict(os.environ)
    src = str(Path(dask_ddp.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-m", "dask_ddp", "run", "--scheduler", client.scheduler.address,
         "--stall-timeout", str(STALL_S), str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert out.returncode != 0, out.stdout
    assert "rank 1 blocked in DDP's gradient all-reduce" in out.stderr, out.stderr
    assert "Join" in out.stderr, out.stderr


def test_compute_after_the_last_backward_is_not_a_stall(client: Client) -> None:
    # Rank 1 computes for 4x the stall timeout after its last backward while rank 0 waits
    # at the end: its count equals rank 0's and its last all-reduce completed.
    job = dask_ddp.submit(client, ddp_compute_after_backward, 4 * STALL_S, n_workers=2,
                          progress=False, stall_timeout=STALL_S)
    assert job.result(timeout=120) == [0, 1]
    assert job.stalled is None
    # The watcher saw rank 1's latest c10d collective: stall detection was looking.
    seen = job.rank_states()[1].get("c10d")
    assert seen and seen["done"] and seen["name"] == "gloo:all_reduce", job.rank_states()


def test_a_rank_frozen_inside_the_collective_its_peer_waits_in_is_a_stall(
        client: Client) -> None:
    # Rank 1 stops inside DDP's gradient all-reduce after its probe read that collective;
    # rank 0 then issues the same one: both count it, and only the frozen peer says
    # rank 0 can never complete it.
    job = dask_ddp.submit(client, ddp_frozen_inside_allreduce, 1.5, n_workers=2,
                          progress=False, stall_timeout=STALL_S)
    t0 = time.monotonic()
    try:
        with pytest.raises(dask_ddp.StallError) as info:
            job.result(timeout=90)
    finally:
        job.cancel()
    took = time.monotonic() - t0
    err = info.value
    text = str(err)
    assert sorted(err.ranks) == [0, 1], text
    found = re.search(r"rank 0 blocked in DDP's gradient all-reduce \(gloo:all_reduce #(\d+)",
                      text)
    assert found, text
    assert "rank 1 frozen" in text, text
    # The frozen rank counts the same collective (its third gradient all-reduce).
    assert f"rank 1: gloo:all_reduce #{found[1]} of process group '0'" in text, text
    # A frozen rank explains the wait: no advice about uneven data.
    assert "uneven data" not in text, text
    assert took < END_BOUND_S + 10, f"the stall took {took:.0f} s to end the job"


def c10d(seq: int, name: str = "gloo:all_reduce", done: bool = False,
         since: float = 100.0) -> dict[str, Any]:
    return {"seq": seq, "group": "0", "name": name, "since": since, "done": done,
            "counts": {"0": seq}}


def test_c10d_rule() -> None:
    working = {"state": "working", "since": 90.0}
    returned = {"state": "returned", "since": 95.0}
    stuck = {**working, "c10d": c10d(9)}
    ended = {**returned, "c10d": c10d(8, done=True)}
    # Beyond a peer that returned, not completed, still for the timeout: a stall.
    assert find_stall({0: ended, 1: stuck}, {}, 2, 104.0, 5.0) is None
    found = find_stall({0: ended, 1: stuck}, {}, 2, 105.0, 5.0)
    assert found is not None and found.stuck == [1] and found.in_c10d == [1]
    assert found.collective == "gloo:all_reduce"
    # A finished peer keeps its last count; a peer with no count counts 0.
    assert find_stall({0: ended, 1: stuck}, {0: 150.0}, 2, 200.0, 5.0) is not None
    assert find_stall({0: returned, 1: stuck}, {}, 2, 200.0, 5.0) is not None
    # Computing: a completed collective, an equal count, a peer ahead, no record.
    view = {0: ended, 1: {**working, "c10d": c10d(9, done=True)}}
    assert not in_c10d(1, view) and find_stall(view, {}, 2, 1000.0, 5.0) is None
    view = {0: {**returned, "c10d": c10d(9)}, 1: stuck}
    assert not in_c10d(1, view)  # same collective, same count: not a mismatch
    assert find_stall({0: {**returned, "c10d": c10d(10, done=True)}, 1: stuck}, {}, 2,
                      1000.0, 5.0) is None
    assert find_stall({0: ended, 1: working}, {}, 2, 1000.0, 5.0) is None
    # A peer that works keeps the job alive.
    assert find_stall({0: {**working, "c10d": c10d(8, done=True)}, 1: stuck}, {}, 2,
                      1000.0, 5.0) is None
    # Another collective at the same count (a barrier against the gradient all-reduce).
    barrier = {"state": "blocked", "collective": "barrier", "since": 101.0,
               "c10d": c10d(9, "gloo:barrier")}
    found = find_stall({0: barrier, 1: stuck}, {}, 2, 107.0, 5.0)
    assert found is not None and found.stuck == [1, 0] and found.in_c10d == [1]
    # A frozen peer that counts the same collective never completes it (stopped inside
    # it after its probe read it): the rank waiting there is stuck too.
    frozen = {"state": "frozen", "since": 101.0, "c10d": c10d(9)}
    view = {0: stuck, 1: frozen}
    assert in_c10d(0, view)
    assert find_stall(view, {}, 2, 105.0, 5.0) is None
    found = find_stall(view, {}, 2, 106.0, 5.0)
    assert found is not None and found.stuck == [0, 1] and found.in_c10d == [0]
    text = str(stall_error(found, "j", ["w0", "w1"], 5.0, {}, 106.0))
    assert "rank 1 frozen" in text and "uneven data" not in text, text
    # Without a frozen peer the same counts are work (the peer computes its part).
    assert find_stall({0: stuck, 1: {**working, "c10d": c10d(9)}}, {}, 2, 1000.0,
                      5.0) is None


def test_the_place_of_a_c10d_collective_in_words() -> None:
    state = {"c10d": c10d(9)}
    in_backward = 'File ".../torch/_tensor.py", line 623 in backward'
    assert where_c10d(state, in_backward).startswith("DDP's gradient all-reduce (")
    assert where_c10d(state, "") == "gloo:all_reduce #9 of process group '0'"
    in_forward = 'File ".../torch/nn/parallel/distributed.py", line 1 in forward'
    assert where_c10d({"c10d": c10d(4, "nccl:broadcast")}, in_forward) \
        .startswith("DDP's forward-time broadcast (nccl:broadcast #4")


def watchdog_abort(steps: int) -> int:
    """What an NCCL rank does when a collective times out, on gloo: the watchdog writes the
    flight recorder's ring (torch's own dump) to TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank,
    then aborts the process. Rank 0 waits in a barrier rank 1 never joins."""
    import os

    import torch
    import torch._C._distributed_c10d as c10d_core
    import torch.distributed as dist

    t = torch.ones(3)
    for _ in range(steps):
        dist.all_reduce(t)
    if dist.get_rank() == 1:
        path = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + "1"
        with open(path, "wb") as f:
            f.write(c10d_core._dump_fr_trace(True, False, False))
        os.abort()
    dist.barrier()
    return 0


def test_a_collectives_dump_is_attached_to_the_dead_ranks_error(client: Client) -> None:
    """The launcher points torch's dump on a collective's timeout into the rank's work
    directory and, when the rank dies, lists its last collectives in the error."""
    job = dask_ddp.submit(client, watchdog_abort, 5, n_workers=2, progress=False)
    with pytest.raises(dask_ddp.JobError) as info:
        job.result(timeout=120)
    text = str(info.value)
    assert info.value.rank == 1 and "SIGABRT" in text, text
    assert "last collectives of rank 1 in the flight recorder's dump" in text, text
    # Every all-reduce, oldest first, with its state. gloo marks a collective completed
    # from its own thread, after all_reduce returned: in a dump taken right after them,
    # any entry may still read 'scheduled' (CI once met #4 so, after #5 completed).
    listed = re.findall(r"gloo:all_reduce #(\d+) of process group '0': "
                        r"(?:completed|started|scheduled) sizes \[\[3\]\]", text)
    assert listed == ["1", "2", "3", "4", "5"], text
