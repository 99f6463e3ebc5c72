"""A worker process killed with SIGKILL mid-job: the job fails fast, nothing is left running."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

import dask_ddp
from cluster_util import (
    sleep_in_collectives,
    sleep_only,
    wait_no_rank_processes,
    wait_rank_processes,
)
from dask_ddp import dispatch
from launch_util import wait_until
from stress import variants

pytestmark = [pytest.mark.dask, pytest.mark.slow, pytest.mark.timeout(180)]


def seed_job_losing_a_worker(client: Client, fn: Any, victim: int) -> tuple[Any, Any, str]:
    """Start ``fn(600.0)`` with the seed's ``dispatch.run`` on every worker, then SIGKILL
    rank ``victim``'s worker once the ranks are inside ``fn``: (futures, job, its address)."""
    futures = dispatch.run(client, fn, 600.0)
    job = dispatch.job_of(futures)
    assert job is not None
    wait_rank_processes(client.scheduler.address, 2)
    time.sleep(1.5)  # the ranks are inside their function
    addr = job.workers[victim]
    pid = client.run(os.getpid, workers=[addr])[addr]
    os.kill(pid, signal.SIGKILL)
    return futures, job, addr


# Rank 1's worker here, rank 0's in the seed's gather below; both victims for each under
# make stress.
@pytest.mark.parametrize("victim", variants([1, 0], once=1))
def test_worker_sigkill_fails_job_fast(victim: int, lease: Any) -> None:
    with lease(2) as client:
        futures, job, addr = seed_job_losing_a_worker(client, sleep_only, victim)
        t0 = time.monotonic()
        with pytest.raises(dask_ddp.JobError) as info:
            job.result(timeout=30)
        assert time.monotonic() - t0 < 30
        err = info.value
        assert isinstance(err, dask_ddp.WorkerLostError)
        assert err.rank == victim and err.worker == addr and addr in str(err)
        # No future stays pending: the seed-style gather ends too.
        assert all(f.status in ("error", "cancelled") for f in futures)
        with pytest.raises(Exception):  # noqa: B017 - cancelled or failed, never a hang
            client.gather(futures)
        wait_no_rank_processes(client.scheduler.address, 30 - (time.monotonic() - t0))


def test_worker_sigkill_during_run_command(tmp_path: Path, lease: Any) -> None:
    script = tmp_path / "sleepy_train.py"
    # Not in a process group (still "loading data"): nothing but the launcher can stop it.
    script.write_text("import time\nprint('loading', flush=True)\ntime.sleep(600)\n")
    with lease(2) as client:
        addr = client.scheduler.address
        outcome: dict[str, BaseException] = {}

        def launch() -> None:
            try:
                dask_ddp.run_command(client, ["python", str(script)], timeout=120)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome["error"] = exc

        thread = threading.Thread(target=launch)
        thread.start()
        wait_rank_processes(addr, 2, marker=str(script))
        time.sleep(1.0)
        victim = sorted(client.scheduler_info(n_workers=-1)["workers"])[1]  # rank 1's worker
        pid = client.run(os.getpid, workers=[victim])[victim]
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        thread.join(30)
        assert not thread.is_alive() and time.monotonic() - t0 < 30
        err = outcome["error"]
        assert isinstance(err, dask_ddp.WorkerLostError) and err.rank == 1
        # The orphaned rank of the killed worker died with it (PR_SET_PDEATHSIG).
        wait_no_rank_processes(addr, 30 - (time.monotonic() - t0), marker=str(script))


@pytest.mark.parametrize("victim", variants([1, 0], once=0))
def test_seed_gather_names_the_dead_worker(victim: int, lease: Any) -> None:
    # The seed's flow: dispatch.run + client.gather. The surviving rank's collective breaks
    # at once ("Connection reset by peer"); every future must still name the dead rank.
    with lease(2) as client:
        futures, _, addr = seed_job_losing_a_worker(client, sleep_in_collectives, victim)
        with pytest.raises(BaseException) as info:  # noqa: B017 - checked below
            client.gather(futures)
        names = [f"rank {victim}", addr, "left the cluster"]
        assert all(n in str(info.value) for n in names), info.value
        wait_until(lambda: [f for f in futures if f.status == "pending"], 30, "pending futures")
        for rank, fut in enumerate(futures):
            err: BaseException | None = None
            try:
                fut.result(timeout=10)
            except BaseException as exc:  # noqa: BLE001 - the error under test
                err = exc
            assert err is not None and all(n in str(err) for n in names), (rank, err)
            if rank != victim:
                assert isinstance(err, dask_ddp.WorkerLostError) and err.rank == victim
                own = err.__cause__
                assert isinstance(own, dask_ddp.JobError) and own.rank == rank, own
                assert f"rank {rank}" in str(err)  # the secondary failure is told too
        wait_no_rank_processes(client.scheduler.address, 30)
