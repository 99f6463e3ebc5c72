"""Restarts that survive a second fault, and leave no task of any attempt behind."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from distributed import Client, wait

import dask_ddp
from launch_util import active_tasks, chaos_train, wait_until
from waits import RESTART_GRACE

pytestmark = [pytest.mark.dask, pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 200  # ~10 s of collectives per attempt


def ranks_running(client: Client, job_id: str) -> Any:
    """What is missing for both ranks of attempt ``job_id`` to be running."""
    states = client.run_on_scheduler(active_tasks, job_id)
    running = [k for k, s in states if s == "processing"]
    return None if len(running) == 2 else states or "no task yet"


def kill_worker(client: Client, addr: str) -> None:
    pid = client.run(os.getpid, workers=[addr])[addr]
    os.kill(pid, signal.SIGKILL)


def test_second_fault_during_a_restart_is_survived(lease: Any) -> None:
    # Three workers, two ranks: the first fault kills rank 1's worker; the second kills
    # the worker the restart placed rank 1 on, while it runs. max_restarts=2 survives
    # both with the right result, and no task of any attempt stays on the scheduler.
    with lease(3) as client:
        job = dask_ddp.submit(client, chaos_train, STEPS, -1, -1, n_workers=2,
                              max_restarts=2, progress=False)
        assert isinstance(job, dask_ddp.ElasticJob)
        for attempt in range(2):
            wait_until(lambda n=attempt: len(job.attempts) <= n, 120,
                       f"attempt {attempt} not started")
            current = job.attempts[attempt]
            wait_until(lambda i=current.id: ranks_running(client, i), 120,
                       f"attempt {attempt}'s ranks not running")
            time.sleep(2.0)  # inside their collectives
            kill_worker(client, current.workers[1])
        values = job.result(timeout=240)
        assert [v["rank"] for v in values] == [0, 1]
        assert all(v["total"] == 2.0 * STEPS and v["restart"] == 2 for v in values), values
        assert len(job.restarts) == 2 and all(r.kind == "lost" for r in job.restarts), \
            job.restarts
        ids = [a.id for a in job.attempts]
        wait_until(lambda: [t for i in ids for t in client.run_on_scheduler(active_tasks, i)],
                   30, "tasks of the job's attempts left on the scheduler")


def test_a_restart_without_its_workers_names_the_missing_one(lease: Any) -> None:
    # Two workers, two ranks, max_restarts=1, an elastic_timeout of two restart graces:
    # rank 1's worker is closed with its nanny (the nanny lives in this process: closing
    # it kills the worker and nothing brings one back), so the restart cannot place two
    # ranks. It fails within the timeout with GangStartError naming the worker and why.
    elastic_timeout = 2 * RESTART_GRACE
    with lease(2) as client:
        cluster = client.cluster
        job = dask_ddp.submit(client, chaos_train, STEPS, -1, -1, n_workers=2,
                              max_restarts=1, elastic_timeout=elastic_timeout,
                              progress=False)
        wait_until(lambda: len(job.attempts) < 1, 120, "attempt 0 not started")
        first = job.attempts[0]
        wait_until(lambda: ranks_running(client, first.id), 120, "ranks not running")
        gone = first.workers[1]
        nanny = next(n for n in cluster.workers.values() if n.worker_address == gone)
        cluster.sync(nanny.close, timeout=30)
        t0 = time.monotonic()
        with pytest.raises(dask_ddp.GangStartError) as info:
            job.result(timeout=120)
        message = str(info.value)
        assert "missing: " + gone in message, message
        assert f"1 were available after waiting {elastic_timeout:g} s" in message, message
        assert "died during an attempt" in message, message
        assert time.monotonic() - t0 < 90, "the restart waited far beyond elastic_timeout"
        assert len(job.restarts) == 1, job.restarts
        ids = [a.id for a in job.attempts]
        wait_until(lambda: [t for i in ids for t in client.run_on_scheduler(active_tasks, i)],
                   30, "tasks of the job's attempts left on the scheduler")



@pytest.mark.parametrize("when", ["after-result", "as-futures-finish"])
def test_a_value_lost_after_the_job_errs_instead_of_waiting(when: str, lease: Any) -> None:
    # The user holds the ranks' futures after the job (the seed's dispatch.run returns
    # them). Rank 1's worker is then closed with its nanny: Dask would compute the finished
    # rank again, pinned to the gone worker, so the task would wait in no-worker for good
    # and result() with it. Instead the future errs at once, naming the rank, its job and
    # the worker, and no task of the job stays active on the scheduler. "as-futures-finish"
    # kills while the job's watcher may still be ending the job.
    with lease(2) as client:
        cluster = client.cluster
        if when == "after-result":
            job = dask_ddp.submit(client, chaos_train, 5, -1, -1, progress=False)
            assert [v["rank"] for v in job.result(timeout=120)] == [0, 1]
            futures = job.futures
        else:
            futures = dask_ddp.dispatch.run(client, chaos_train, 5, -1, -1)
            wait(futures, timeout=120)
        gone = next(iter(client.who_has(futures[1])[futures[1].key]))
        nanny = next(n for n in cluster.workers.values() if n.worker_address == gone)
        cluster.sync(nanny.close, timeout=30)
        t0 = time.monotonic()
        with pytest.raises(dask_ddp.WorkerLostError) as info:
            futures[1].result(timeout=60)
        message = str(info.value)
        assert "rank 1 " in message and gone in message, message
        assert "finished" in message, message
        assert info.value.rank == 1 and info.value.worker == gone
        assert time.monotonic() - t0 < 30, "the lost value waited before it erred"
        assert futures[0].result(timeout=10)["rank"] == 0  # its worker is still there
        if when == "after-result":
            assert [v["rank"] for v in job.result(timeout=10)] == [0, 1]  # kept
        key = str(futures[1].key)
        wait_until(lambda: client.run_on_scheduler(active_tasks, key), 30,
                   "the lost rank's task left active on the scheduler")
