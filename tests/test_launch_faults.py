"""A worker process killed with SIGKILL mid-job: the job fails fast, nothing is left running."""

from __future__ import annotations

import os
import signal
import time

import pytest
from distributed import Client

import dask_ddp
from cluster_util import local_cluster, rank_processes, sleep_in_collectives, wait_no_rank_processes
from dask_ddp import dispatch

pytestmark = [pytest.mark.dask, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("victim", [1, 0])
def test_worker_sigkill_fails_job_fast(victim: int) -> None:
    with local_cluster(n_workers=2) as cluster, Client(cluster) as client:
        futures = dispatch.run(client, sleep_in_collectives, 600.0)
        job = dispatch.job_of(futures)
        assert job is not None
        deadline = time.monotonic() + 60
        while len(rank_processes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # the ranks are inside their collectives
        addr = job.workers[victim]
        pid = client.run(os.getpid, workers=[addr])[addr]
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
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
        wait_no_rank_processes(30 - (time.monotonic() - t0))
