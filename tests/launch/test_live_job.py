"""submit(recovery="live") end to end: a real LocalCluster, real gloo, real kills of a
rank's process and of rank 0's worker; the survivors finish with identical state and the
job records the generation."""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

import dask_ddp
import live_util
from cluster_util import client_fixture
from dashboard_util import dashboard_root, wait_job
from images import file_putter, write_folder
from waits import wait_until

pytestmark = pytest.mark.timeout(300)

client = client_fixture(3)


@pytest.fixture(autouse=True)
def _all_workers_back(client: Client) -> None:
    """A worker the test before killed is back (its nanny restarts it) before the next
    job takes the cluster's workers: a job of 2 ranks would change what each test means."""
    client.wait_for_workers(3, timeout=120)


def _step(folder: Path, rank: int) -> int:
    try:
        return int((folder / f"step{rank}").read_text() or -1)
    except FileNotFoundError:
        return -1


def _started(folder: Path, rank: int, job: Any = None) -> str | None:
    if job is not None and job.done():
        job.result()  # raises the job's error: it ended before the rank started
    return None if (folder / f"pid{rank}").exists() else f"no pid file of rank {rank}"


def _kill_when(folder: Path, rank: int, at_step: int, pid: int,
               sig: signal.Signals = signal.SIGKILL) -> None:
    wait_until(lambda: None if _step(folder, rank) >= at_step
               else f"rank {rank} at step {_step(folder, rank)}",
               120, f"rank {rank} to reach step {at_step}")
    os.kill(pid, sig)


def _check_survivors(job: dask_ddp.Job, lost: int) -> None:
    values = job.result(timeout=120)
    assert len(values) == 2, values
    assert len({v["hash"] for v in values}) == 1, values
    assert sorted(v["rank"] for v in values) == [0, 1], values
    assert {(v["world"], v["generation"]) for v in values} == {(2, 1)}, values
    assert lost not in {v["first_rank"] for v in values}
    (gen,) = job.generations
    assert gen.lost == (lost,) and gen.world_size == 2 and gen.recovery_s < 10, gen


def test_rank_process_killed(client: Client, tmp_path: Path) -> None:
    job = dask_ddp.submit(client, live_util.live_train, str(tmp_path), 150, 0.01,
                          recovery="live", progress=False)
    wait_until(lambda: _started(tmp_path, 1), 120, "rank 1 to start")
    _kill_when(tmp_path, 1, 20, int((tmp_path / "pid1").read_text()))
    _check_survivors(job, lost=1)
    # The job page lists the generation and shows the group's new size.
    page = wait_job(dashboard_root(client), job.id, "its generation",
                    lambda j: j["generations"] and j["world_size"] == 2)
    (gen,) = page["generations"]
    assert gen["lost"] == [1] and gen["generation"] == 1, gen


def _audit(out: Path, lost: int, upto: int) -> Counter[int]:
    """Every id trained on: the lost rank's up to the agreed step, the others' all."""
    seen: list[int] = []
    for rank in range(3):
        for line in (out / f"audit{rank}").read_text().splitlines():
            it, labels = line.split()
            if rank != lost or int(it) <= upto:
                seen += [int(v) for v in labels.split(",")]
    return Counter(seen)


@pytest.mark.parametrize("data", ["images", "table"])
def test_exactly_once_audit(client: Client, tmp_path: Path, data: str) -> None:
    """Every sample of the epoch is trained on once across the job (padding aside): the
    lost rank's batches up to the agreed step, then the survivors' own and the lost
    rank's unread samples dealt to them; over images, and over the rows of a persisted
    Dask DataFrame."""
    out = tmp_path / "out"
    out.mkdir()
    if data == "images":
        n = 90
        write_folder(file_putter(str(tmp_path / "images")), ["a", "b", "c"], n // 3,
                     sizes=((10, 10),))
        fn, args = live_util.live_train_images, (str(tmp_path / "images"), n)
    else:
        n = 120
        fn, args = live_util.live_train_table, (live_util.id_frame(client, n, 6),)
    job = dask_ddp.submit(client, fn, *args, str(out), 0.1, recovery="live", progress=False)
    wait_until(lambda: _started(out, 2, job), 120, "rank 2 to start")
    _kill_when(out, 2, 4, int((out / "pid2").read_text()))
    _check_survivors(job, lost=2)
    (gen,) = job.generations
    counts = _audit(out, 2, gen.step)
    assert sorted(counts) == list(range(n)), sorted(set(range(n)) - set(counts))
    repeats = sum(c - 1 for c in counts.values())
    assert repeats <= (3 - 1) + (2 - 1), counts


def test_frozen_rank(client: Client, tmp_path: Path) -> None:
    """A rank stopped (SIGSTOP, a hung host) is found by the stall rule and killed; the
    others re-form without it instead of the job ending with a StallError."""
    job = dask_ddp.submit(client, live_util.live_train, str(tmp_path), 150, 0.01,
                          recovery="live", stall_timeout=2, progress=False)
    wait_until(lambda: _started(tmp_path, 2), 120, "rank 2 to start")
    pid = int((tmp_path / "pid2").read_text())
    _kill_when(tmp_path, 2, 20, pid, signal.SIGSTOP)
    try:
        _check_survivors(job, lost=2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_frozen_ranks_kill_that_did_not_take_is_tried_again(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    """The kill of a frozen rank counts once its worker said it killed the rank: a worker
    that found no such rank (or failed) leaves it to be tried at the next look at the
    stall, instead of the job waiting for good on a rank nobody kills."""
    from dask_ddp._launch.client.live_watch import LiveWatch
    from dask_ddp._launch.wire.entry_points import KILL_RANK

    workers = sorted(client.scheduler_info()["workers"])[:2]
    watch = LiveWatch(client, "no-such-job", workers, 30.0, kill_rank=KILL_RANK)
    try:
        with caplog.at_level("WARNING", logger="dask_ddp._launch.client.live_watch"):
            for _ in range(2):  # no rank 1 of that job on its worker: not ended, asked again
                client.sync(watch.end_frozen, [1], workers)
        assert watch.ended == set()
        assert sum("did not take" in r.getMessage() for r in caplog.records) == 2, \
            caplog.text
    finally:
        client.sync(watch.close)


def test_too_few_survivors_fall_back_to_a_restart(client: Client, tmp_path: Path) -> None:
    """Fewer than min_workers survive: the group gives up re-forming (the error names
    min_workers) and the job restarts whole, as recovery="restart" does."""
    job = dask_ddp.submit(client, live_util.live_train, str(tmp_path), 60, 0.01,
                          recovery="live", min_workers=3, max_workers=3, max_restarts=1,
                          progress=False)
    wait_until(lambda: _started(tmp_path, 1), 120, "rank 1 to start")
    _kill_when(tmp_path, 1, 10, int((tmp_path / "pid1").read_text()))
    values = job.result(timeout=180)
    assert len(values) == 3 and len({v["hash"] for v in values}) == 1, values
    (restart,) = job.restarts
    assert "min_workers=3" in str(restart), restart
    assert {v["generation"] for v in values} == {0}


def test_rank0_worker_killed(client: Client, tmp_path: Path) -> None:
    """Rank 0's worker (its whole process, as a lost machine) goes: the job's store is on
    the scheduler, so the others go on."""
    job = dask_ddp.submit(client, live_util.live_train, str(tmp_path), 150, 0.01,
                          recovery="live", progress=False)
    pids = client.run(os.getpid)
    wait_until(lambda: _started(tmp_path, 0), 120, "rank 0 to start")
    _kill_when(tmp_path, 0, 20, pids[job.workers[0]])
    _check_survivors(job, lost=0)


def test_retired_worker_leaves_at_a_step_boundary(client: Client, tmp_path: Path) -> None:
    """retire_workers (as an adaptive scale-down): the rank on that worker gets SIGTERM,
    finishes its step and leaves; the others go on. Last in the module: the cluster has
    one worker fewer afterwards."""
    job = dask_ddp.submit(client, live_util.live_train, str(tmp_path), 150, 0.01,
                          recovery="live", progress=False)
    wait_until(lambda: None if _step(tmp_path, 1) >= 20 else "rank 1 not at step 20", 120,
               "rank 1 to reach step 20")
    client.retire_workers([job.workers[1]], close_workers=True)
    _check_survivors(job, lost=1)
    assert "left at a step boundary" in job.generations[0].cause, job.generations
