"""The client's Job (``_launch/client/job.py``) owns its state: no reference cycle keeps a finished
job, or its rank tasks on the scheduler, once its caller dropped it."""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from distributed import Client

import dask_ddp
from cluster_util import client_fixture, sleep_only, with_local_rank
from dask_ddp import dispatch
from waits import wait_until

pytestmark = [pytest.mark.dask, pytest.mark.timeout(180)]

client = client_fixture(2)


def tasks_named(client: Client, part: str) -> list[tuple[str, str]]:
    """The scheduler's tasks whose key holds ``part``, with their states."""

    def read(dask_scheduler: Any, part: str) -> list[tuple[str, str]]:
        return sorted((str(k), ts.state) for k, ts in dask_scheduler.tasks.items()
                      if part in str(k))

    return list(client.run_on_scheduler(read, part=part))


@contextlib.contextmanager
def no_garbage_collector() -> Iterator[None]:
    """Only reference counts free objects here: a reference cycle would keep them."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def wait_gone(client: Client, part: str) -> None:
    wait_until(lambda: tasks_named(client, part), 30,
               "rank tasks of a finished job its caller dropped still on the scheduler "
               "(a reference cycle keeps the job and its futures; keys left)")


def test_submit_result_then_drop(client: Client) -> None:
    with no_garbage_collector():
        job = dask_ddp.submit(client, with_local_rank, n_workers=2, pass_local_rank=True,
                              progress=False)
        assert job.result(timeout=120) == [0, 1]
        job_id = job.id
        # The job keeps its tasks while it is held (its futures still answer).
        assert [s for _, s in tasks_named(client, job_id)] == ["memory", "memory"]
        assert [f.result() for f in job.futures] == [0, 1]
        del job
        wait_gone(client, job_id)


def test_run_command_leaves_nothing(client: Client) -> None:
    name = f"cmd-{uuid.uuid4().hex[:8]}"
    with no_garbage_collector():
        codes = dask_ddp.run_command(client, ["python", "-c", "pass"], n_workers=2, name=name,
                                     timeout=120)
        assert codes == [0, 0]
        wait_gone(client, name)


def test_seed_run_futures_then_drop(client: Client) -> None:
    with no_garbage_collector():
        futures = dispatch.run(client, with_local_rank, pass_local_rank=True)
        assert client.gather(futures) == [0, 1]
        job = dispatch.job_of(futures)
        assert job is not None and job.futures == futures
        assert job.result(timeout=60) == [0, 1]
        job_id = job.id
        del job
        # The futures alone keep the job (job_of still finds it) and their tasks.
        found = dispatch.job_of(futures)
        assert found is not None and found.id == job_id
        del found, futures
        wait_gone(client, job_id)


def test_cancelled_job_then_drop(client: Client) -> None:
    with no_garbage_collector():
        job = dask_ddp.submit(client, sleep_only, 120, n_workers=2, progress=False)
        job_id = job.id
        wait_until(lambda: [s for _, s in tasks_named(client, job_id)
                            if s != "processing"], 60, "rank tasks not running")
        job.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            job.result(timeout=60)
        # Dask forgets a cancelled key: the futures still read cancelled, never pending.
        assert [f.status for f in job.futures] == ["cancelled", "cancelled"]
        del job
        wait_gone(client, job_id)
