"""The GPU machine's own basics, before any dask-ddp GPU feature is blamed: CUDA computes,
NCCL forms a world of one and DDP steps over it, a Loader batch reaches the device intact,
and ``report()`` sends a CUDA scalar from a rank's environment. Skipped where CUDA is
missing (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from images import file_putter, write_folder

pytestmark = pytest.mark.gpu

# A rank of one in its own process: NCCL state (communicators, the store) dies with it, and
# a hang is a timeout here rather than a frozen test session.
NCCL_WORLD_OF_ONE = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    store = dist.FileStore(sys.argv[1], 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        x = torch.full((4,), 3.0, device="cuda")
        dist.all_reduce(x)
        assert x.tolist() == [3.0] * 4, x
        model = DDP(torch.nn.Linear(8, 2).cuda(), device_ids=[0])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = model.module.weight.detach().clone()
        model(torch.randn(16, 8, device="cuda")).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
        assert not torch.equal(before, model.module.weight), "the DDP step changed nothing"
        print("nccl", torch.cuda.nccl.version(), flush=True)
    finally:
        dist.destroy_process_group()
""")


def test_cuda_computes_as_the_cpu_does() -> None:
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    on_gpu = (a.cuda() @ a.cuda()).cpu()
    torch.testing.assert_close(on_gpu, a @ a, rtol=1e-3, atol=1e-3)


def test_nccl_world_of_one_runs_a_ddp_step(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    proc = subprocess.run(
        [sys.executable, "-c", NCCL_WORLD_OF_ONE, str(tmp_path / "store")],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert proc.returncode == 0, f"NCCL rank failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    assert proc.stdout.startswith("nccl"), proc.stdout


def test_a_loader_batch_reaches_the_gpu_intact(tmp_path: Path) -> None:
    from dask_ddp.data import ImageFolder, Loader
    from dask_ddp.data import transforms as T

    write_folder(file_putter(str(tmp_path)), ["a", "b"], per_class=6)
    loader = Loader(
        ImageFolder(str(tmp_path)), 4,
        transform=T.Compose([T.Resize((32, 32)), T.PILToTensor()]),
        shuffle=False, num_threads=2, pin_memory=True,
    )
    try:
        images, labels = next(iter(loader))
    finally:
        loader.close()
    assert images.is_pinned() or images.is_cuda
    on_gpu = images.to("cuda", non_blocking=True)
    labels_gpu = labels.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.uint8
    assert on_gpu.shape == (4, 3, 32, 32)
    assert torch.equal(on_gpu.cpu(), images.cpu())
    assert torch.equal(labels_gpu.cpu(), labels.cpu())


def test_report_takes_a_cuda_scalar() -> None:
    """In a rank's environment (rank_channel: the results pipe a rank is given, read back
    here), so report() takes its CUDA path: a pinned copy and an event, no wait."""
    import dask_ddp
    from dask_ddp import _pending
    from rank_channel import RankChannel

    with RankChannel("gpu-basics") as channel:
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000_000)  # the value comes after ~0.5 s of GPU time
        loss = torch.tensor(0.25, device="cuda") * 2
        dask_ddp.report({"loss": loss}, step=3)
        assert not torch.cuda.current_stream().query(), "report() waited for the GPU"
        assert _pending.waiting() == 1, "report() did not queue the CUDA value"
    [record] = channel.records()
    assert record["step"] == 3 and record["loss"] == 0.5, record
