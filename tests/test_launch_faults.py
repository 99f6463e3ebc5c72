"""A worker process killed with SIGKILL mid-job: the job fails fast, nothing is left running."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from distributed import Client

import dask_ddp
from cluster_util import (
    local_cluster,
    sleep_only,
    wait_no_rank_processes,
    wait_rank_processes,
)
from dask_ddp import dispatch

pytestmark = [pytest.mark.dask, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("victim", [1, 0])
def test_worker_sigkill_fails_job_fast(victim: int) -> None:
    with local_cluster(n_workers=2) as cluster, Client(cluster) as client:
        futures = dispatch.run(client, sleep_only, 600.0)
        job = dispatch.job_of(futures)
        assert job is not None
        wait_rank_processes(client.scheduler.address, 2)
        time.sleep(1.0)  # the ranks are inside their function
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
        wait_no_rank_processes(client.scheduler.address, 30 - (time.monotonic() - t0))


def test_worker_sigkill_during_run_command(tmp_path: Path) -> None:
    script = tmp_path / "sleepy_train.py"
    # Not in a process group (still "loading data"): nothing but the launcher can stop it.
    script.write_text("import time\nprint('loading', flush=True)\ntime.sleep(600)\n")
    with local_cluster(n_workers=2) as cluster, Client(cluster) as client:
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
