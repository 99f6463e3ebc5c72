"""Defects of the launcher found by reading it, each on a real LocalCluster."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed import Client

import dask_ddp
from cluster_util import (
    client_fixture,
    rank_processes,
    restart_after,
    sleep_in_collectives,
    sleep_only,
)
from dask_ddp import dispatch
from dask_ddp.results import DaskResultsHandler
from launch_util import (
    active_tasks,
    fill_results_then_raise,
    install_loop_probe,
    off_loop_reads,
    wait_until,
    worker_tasks,
)

pytestmark = [pytest.mark.dask, pytest.mark.timeout(240)]


client = client_fixture(2)


def test_forwarder_close_failure_keeps_the_rank_outcome(lease: Any) -> None:
    # A results topic nobody reads fills its budget: the rank's last record cannot be
    # handed on, and the supervisor's close of its forwarder times out. The rank's own
    # error must still be the job's error. (The budget is read on the scheduler, in this
    # process, as the topic is made; the close's wait reaches the worker in the job.)
    with lease(1) as client, dask.config.set({"dask-ddp.results.budget": "64 KiB",
                                              "dask-ddp.launch.forward-close": "2 s"}):
        handler = DaskResultsHandler("never-read")
        job = dask_ddp.submit(client, fill_results_then_raise, handler, 200_000, "the real cause",
                              n_workers=1)
        with pytest.raises(dask_ddp.RankFailedError, match="the real cause") as info:
            job.result(timeout=120)
        assert isinstance(info.value.__cause__, ValueError)


def test_launch_failing_part_way_leaves_no_rank_running(client: Client, tmp_path: Path) -> None:
    # The job's output folder cannot be made (a file is in the way): that is found after
    # the ranks were submitted. They must be stopped, not left running unwatched.
    blocker = tmp_path / "out"
    blocker.write_text("not a folder")
    with pytest.raises(FileExistsError):
        dask_ddp.submit(client, sleep_only, 600.0, n_workers=2, output_dir=blocker,
                        progress=False)
    addr = client.scheduler.address
    wait_until(lambda: client.run_on_scheduler(active_tasks, "sleep_only"), 20,
               "tasks of the failed launch still active")
    # The scheduler forgets a cancelled task at once; its supervisor on the worker ends
    # later (it may have been starting its rank): wait for every supervisor to return,
    # then no rank of the launch may be left.
    wait_until(lambda: [t for ts in client.run(worker_tasks, "sleep_only").values()
                        for t in ts], 30, "supervisors of the failed launch still running")
    assert not rank_processes(addr)


def test_supervisor_reads_task_state_on_the_event_loop(client: Client) -> None:
    client.run(install_loop_probe)
    restart_after(client, "a probe replaced its workers' task tables")
    # Long enough for several abort polls of each supervisor.
    dask_ddp.submit(client, sleep_only, 2.0, n_workers=2).result(timeout=120)
    reads = client.run(off_loop_reads)
    assert all(not r for r in reads.values()), reads


def test_registry_keeps_no_finished_job(client: Client) -> None:
    futures = dispatch.run(client, sleep_in_collectives, 0.5)
    client.gather(futures)
    job = dispatch.job_of(futures)
    assert job is not None and job.futures == futures  # known while its futures are held
    job.result(timeout=30)  # the job's watcher has ended too
    ref = weakref.ref(job)
    del job, futures

    def alive() -> bool:
        gc.collect()
        return ref() is not None

    wait_until(alive, 20, "the finished job is still kept alive")
