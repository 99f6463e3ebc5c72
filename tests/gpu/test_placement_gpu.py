"""GPU placement on a real GPU machine: the jobs a user starts first (two workers of a
LocalCluster, two ranks in one worker) get distinct GPUs with NCCL, or, where the machine
has too few GPUs, gloo with one warning; never an NCCL error. Skipped where CUDA is missing
(tests/conftest.py)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import torch

import dask_ddp
from cluster_util import cluster_client
from dask_ddp.errors import RankFailedError

pytestmark = [pytest.mark.gpu, pytest.mark.dask, pytest.mark.timeout(300)]

WARNING = "backend='auto' uses gloo, not NCCL"


def where_am_i() -> dict[str, Any]:
    """In a rank: its device, the GPU behind it, and one collective of CUDA tensors and one
    of CPU tensors over the group the launcher made."""
    import torch.distributed as dist

    info = dask_ddp.rank_info()
    device = info.device
    assert device.type == "cuda", device
    gpu = torch.ones(4, device=device) * (info.rank + 1)
    dist.all_reduce(gpu)
    host = torch.ones(2)  # "auto" must take CPU tensors too ("cpu:gloo,cuda:nccl")
    dist.all_reduce(host)
    return {"rank": info.rank, "device": str(device), "current": torch.cuda.current_device(),
            "uuid": str(torch.cuda.get_device_properties(device).uuid),
            "backend": str(dist.get_backend()), "gpu_sum": gpu[0].item(),
            "host_sum": host[0].item(), "host": socket.gethostname()}


def check_job(out: list[dict[str, Any]], printed: str) -> None:
    world = len(out)
    assert [o["rank"] for o in out] == list(range(world))
    for o in out:
        assert o["device"] == f"cuda:{o['current']}", o  # set_device selected its GPU
        assert o["gpu_sum"] == world * (world + 1) / 2 and o["host_sum"] == world, o
    uuids = [o["uuid"] for o in out]
    assert "Duplicate GPU" not in printed and "NCCL error" not in printed, printed[-4000:]
    if len(set(uuids)) == world:  # enough GPUs: distinct ones, NCCL for CUDA tensors
        assert all("nccl" in o["backend"] for o in out), out
        assert WARNING not in printed
    else:  # too few: gloo, and rank 0 said why, once, naming the GPU
        assert all(o["backend"] == "gloo" for o in out), out
        assert printed.count(WARNING) == 1, printed[-4000:]
        assert "ranks 0 and 1 on GPU" in printed and uuids[0] in printed, printed[-4000:]


def test_two_workers_get_distinct_gpus_or_gloo_with_a_warning(
        capsys: pytest.CaptureFixture[str]) -> None:
    with cluster_client(2) as client:
        job = dask_ddp.submit(client, where_am_i, n_workers=2, stream_output=True)
        out = job.result(timeout=240)
    check_job(out, capsys.readouterr().err)


def test_two_ranks_of_one_worker_get_distinct_gpus_or_gloo_with_a_warning(
        capsys: pytest.CaptureFixture[str]) -> None:
    with cluster_client(1) as client:
        job = dask_ddp.submit(client, where_am_i, n_workers=1, nprocs_per_worker=2,
                              stream_output=True)
        out = job.result(timeout=240)
    check_job(out, capsys.readouterr().err)


@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="needs exactly one GPU")
def test_explicit_nccl_on_one_gpu_fails_before_any_collective_naming_the_ranks() -> None:
    with cluster_client(2) as client:
        job = dask_ddp.submit(client, where_am_i, n_workers=2, backend="nccl")
        with pytest.raises(RankFailedError, match=r"ranks 0 and 1 on GPU \S+ of host") as info:
            job.result(timeout=240)
    assert "Duplicate GPU" not in str(info.value)
