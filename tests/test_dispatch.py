"""dispatch.run / submit / Job on a real LocalCluster (worker processes) with real gloo."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import psutil
import pytest
import torch
from distributed import Client

import dask_ddp
from cluster_util import (
    all_reduce_rank,
    client_fixture,
    dataloader_rank,
    ddp_train,
    exit_on_rank,
    print_rank,
    raise_on_rank,
    sleep_in_collectives,
    train_single,
    wait_no_rank_processes,
    wait_rank_processes,
    with_local_rank,
)
from dask_ddp import dispatch
from dask_ddp._cluster import cluster_info

pytestmark = [pytest.mark.dask, pytest.mark.timeout(180)]


client = client_fixture(4, threads_per_worker=2)


@pytest.mark.parametrize("n", [2, 4])
def test_all_reduce_sums(client: Client, n: int) -> None:
    job = dask_ddp.submit(client, all_reduce_rank, 10.0, n_workers=n)
    out = job.result(timeout=120)
    expected = sum(r + 10.0 for r in range(n))
    assert [o["sum"] for o in out] == [expected] * n
    assert [o["rank"] for o in out] == list(range(n))
    assert {o["backend"] for o in out} == {"gloo"}  # "auto" without CUDA
    # Every worker of the local cluster is on one host: local ranks as torchrun numbers them.
    assert [o["local_rank"] for o in out] == list(range(n))
    assert {o["local_world"] for o in out} == {n}
    ports = {o["env"]["MASTER_PORT"] for o in out}
    assert len(ports) == 1 and ports != {"23456"}
    assert {o["env"]["MASTER_ADDR"] for o in out} == {"127.0.0.1"}
    assert {o["env"]["GLOO_SOCKET_IFNAME"] for o in out} == {"lo"}
    # Rank 0's rendezvous server is gone with the job: no port left bound.
    listening = {c.laddr.port for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
    assert int(ports.pop()) not in listening
    # Each rank ran on its own worker, in its own process.
    assert [o["env"]["DASK_DDP_WORKER"] for o in out] == job.workers
    assert len({o["pid"] for o in out}) == n


def test_stream_output(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    dask_ddp.submit(client, print_rank, n_workers=2, stream_output=True).result(timeout=120)
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0 of 2" in out and "[rank 1] hello from 1 of 2" in out


def test_seed_run_returns_plain_futures(client: Client) -> None:
    futures = dispatch.run(client, with_local_rank, pass_local_rank=True)
    assert type(futures) is list and len(futures) == 4
    assert client.gather(futures) == [0, 1, 2, 3]
    job = dispatch.job_of(futures)
    assert job is not None and job.futures == futures and job.name == "with_local_rank"
    assert all(f.key.startswith("with_local_rank-") for f in futures)
    # The futures are the caller's: the job's watcher does not read the values a second
    # time (a large return value crosses once); the job still answers result().
    assert job.result(timeout=60) == [0, 1, 2, 3]
    assert job._control.values is None


def test_ddp_matches_single_process(client: Client) -> None:
    steps, batch, seed = 5, 4, 3
    out = dask_ddp.submit(client, ddp_train, steps, batch, seed, n_workers=2).result(120)
    for key in out[0]:
        torch.testing.assert_close(out[0][key], out[1][key], rtol=0, atol=0)
    single = train_single(steps, batch * 2, seed)
    for key in single:
        torch.testing.assert_close(out[0][key], single[key], rtol=1e-5, atol=1e-6)
    assert not all(torch.equal(single[k], train_single(0, 8, seed)[k]) for k in single)


def test_two_jobs_at_once(client: Client) -> None:
    a = dask_ddp.submit(client, all_reduce_rank, 1.0, n_workers=2, name="job-a")
    b = dask_ddp.submit(client, all_reduce_rank, 100.0, n_workers=2, name="job-b")
    ra, rb = a.result(120), b.result(120)
    assert [o["sum"] for o in ra] == [3.0, 3.0]
    assert [o["sum"] for o in rb] == [201.0, 201.0]
    assert ra[0]["env"]["MASTER_PORT"] != rb[0]["env"]["MASTER_PORT"]


def test_rank_raising_fails_job_with_root_cause(client: Client) -> None:
    t0 = time.monotonic()
    job = dask_ddp.submit(client, raise_on_rank, 1, "boom from rank one", n_workers=3)
    with pytest.raises(dask_ddp.RankFailedError) as info:
        job.result(timeout=60)
    assert time.monotonic() - t0 < 30
    err = info.value
    assert err.rank == 1 and err.worker == job.workers[1]
    assert "rank 1" in str(err) and job.workers[1] in str(err)
    assert "boom from rank one" in str(err) and "raise_on_rank" in err.remote_traceback
    assert isinstance(err.__cause__, ValueError)
    assert str(err.__cause__) == "boom from rank one"
    # The other ranks were stopped, none left behind.
    assert all(f.status == "error" for f in job.futures)
    wait_no_rank_processes(client.scheduler.address, 10)


def test_rank_exit_code(client: Client) -> None:
    t0 = time.monotonic()
    job = dask_ddp.submit(client, exit_on_rank, 0, 3, n_workers=2)
    with pytest.raises(dask_ddp.RankFailedError, match="exited with code 3") as info:
        job.result(timeout=60)
    assert time.monotonic() - t0 < 30
    assert info.value.rank == 0 and info.value.kind == "died"
    wait_no_rank_processes(client.scheduler.address, 10)


def test_seed_futures_raise_not_hang(client: Client) -> None:
    futures = dispatch.run(client, raise_on_rank, 2, "seed-style failure")
    with pytest.raises(dask_ddp.JobError, match="seed-style failure"):
        client.gather(futures)  # rank 0's error comes first and names the root cause
    with pytest.raises(dask_ddp.RankFailedError, match="seed-style failure"):
        dispatch.job_of(futures).result(timeout=60)  # type: ignore[union-attr]
    wait_no_rank_processes(client.scheduler.address, 10)


def test_not_enough_workers_raises_at_once(client: Client) -> None:
    t0 = time.monotonic()
    with pytest.raises(dask_ddp.GangStartError, match="needs 9 workers but only 4"):
        dask_ddp.submit(client, all_reduce_rank, 0.0, n_workers=9)
    with pytest.raises(dask_ddp.GangStartError, match="GPU"):
        dask_ddp.submit(client, all_reduce_rank, 0.0, resources={"GPU": 1})
    with pytest.raises(dask_ddp.GangStartError, match="tcp://10.9.9.9:1"):
        dask_ddp.submit(client, all_reduce_rank, 0.0, workers=["tcp://10.9.9.9:1"])
    assert time.monotonic() - t0 < 30  # a gang check, not the 300 s rendezvous timeout


def test_nccl_without_cuda_is_a_clear_error(client: Client) -> None:
    futures = dispatch.run(client, all_reduce_rank, 0.0, backend="nccl")
    with pytest.raises(dask_ddp.RankFailedError, match="init_process_group.*needs CUDA"):
        dispatch.job_of(futures).result(timeout=60)  # type: ignore[union-attr]


def test_init_process_group_failure_reported_as_itself(client: Client) -> None:
    job = dask_ddp.submit(client, all_reduce_rank, 0.0, n_workers=2,
                          init_kwargs={"timeout": 5})  # not a timedelta
    with pytest.raises(dask_ddp.RankFailedError, match="in init_process_group") as info:
        job.result(timeout=60)
    assert isinstance(info.value.__cause__, TypeError)
    assert "timedelta" in str(info.value)


def test_dataloader_workers_inside_rank(client: Client) -> None:
    out = dask_ddp.submit(client, dataloader_rank, 2, n_workers=2).result(timeout=120)
    expected = 2 * sum(i * i for i in range(32))
    assert [o["total"] for o in out] == [expected, expected]
    for o in out:
        assert len(o["loader_pids"]) == 2 and o["pid"] not in o["loader_pids"]


def test_local_ranks_and_device_rotation(client: Client) -> None:
    workers = sorted(cluster_info(client)["workers"])[:2]
    job = dask_ddp.submit(client, all_reduce_rank, 0.0, workers=workers, nprocs_per_worker=2,
                          env={"CUDA_VISIBLE_DEVICES": "0,1"})
    out = job.result(timeout=120)
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    assert [o["local_rank"] for o in out] == [0, 1, 2, 3]
    assert {o["local_world"] for o in out} == {4}
    assert [o["env"]["DASK_DDP_WORKER"] for o in out] == [workers[0]] * 2 + [workers[1]] * 2
    assert [o["env"]["CUDA_VISIBLE_DEVICES"] for o in out] == ["0,1", "1,0", "0,1", "1,0"]
    assert out[0]["sum"] == 6.0


def test_cancel_stops_ranks(client: Client) -> None:
    job = dask_ddp.submit(client, sleep_in_collectives, 600.0, n_workers=2)
    wait_rank_processes(client.scheduler.address, 2)
    job.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        job.result(timeout=30)
    wait_no_rank_processes(client.scheduler.address, 20)


def test_client_disconnect_stops_ranks(client: Client) -> None:
    other = Client(client.scheduler.address)
    try:
        dask_ddp.submit(other, sleep_in_collectives, 600.0, n_workers=2)
        wait_rank_processes(client.scheduler.address, 2)
    finally:
        other.close()
    wait_no_rank_processes(client.scheduler.address, 30)


def scheduler_events(dask_scheduler: Any = None) -> list[str]:
    """The names of the Dask Events on the scheduler (``client.run_on_scheduler``)."""
    return sorted(dask_scheduler.extensions["events"]._events)


def test_cancel_after_the_end_changes_nothing(client: Client) -> None:
    # A job that ended cannot be cancelled: its result stays, and the cancel leaves no
    # abort Event behind on the scheduler (the job's cleanup had removed it).
    job = dask_ddp.submit(client, with_local_rank, n_workers=2, pass_local_rank=True)
    assert job.result(timeout=120) == [0, 1]
    job.cancel()
    assert job.result(timeout=10) == [0, 1]
    assert job.id not in " ".join(client.run_on_scheduler(scheduler_events))
