"""Rank-side functions of the elastic tests and benchmark (importable by the rank processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def mark(folder: str | None, name: str) -> None:
    """Create ``folder/name`` (how a rank tells the test where it is)."""
    if folder:
        Path(folder, name).touch()


def resumable_train(root: str, total_steps: int, save_every: int, marks: str | None,
                    step_sleep: float) -> dict[str, Any]:
    """DDP training on real image files through the Loader, resuming from the newest
    checkpoint; dropout and RNG-scaled losses make every RNG stream count."""
    import random

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dask_ddp
    from dask_ddp.data import ImageFolder, Loader
    from dask_ddp.data import transforms as T

    info = dask_ddp.rank_info()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(3 * 8 * 8, 3))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    tf = T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToTensor()])
    loader = Loader(ImageFolder(root), 4, transform=tf, seed=1, num_threads=1, prefetch=2)
    # A different seed per rank: the saved RNG states must be each rank's own.
    torch.manual_seed(100 + info.rank)
    np.random.seed(200 + info.rank)
    random.seed(300 + info.rank)
    ckpt = dask_ddp.Checkpointer(ddp, opt, sched, loader)
    extra = ckpt.restore()
    step = int(extra.get("step", 0))
    resumed_at, resumed_batch = step, loader.state_dict()["batch"]
    mark(marks, f"start-a{info.restart}-r{info.rank}")
    while step < total_steps:
        loader.set_epoch(loader.epoch)  # keeps a restored mid-epoch position
        for x, y in loader:
            scale = 1.0 + 0.1 * float(torch.rand(())) + 0.1 * np.random.rand() \
                + 0.1 * random.random()
            opt.zero_grad()
            (F.cross_entropy(ddp(x), y) * scale).backward()
            opt.step()
            sched.step()
            step += 1
            if step % save_every == 0:
                ckpt.save(step)
            mark(marks, f"step-a{info.restart}-r{info.rank}-s{step}")
            time.sleep(step_sleep)
            if step == total_steps:
                break
        else:
            loader.set_epoch(loader.epoch + 1)
    dist.barrier()
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "restart": info.restart, "world": info.world_size, "resumed_at": resumed_at,
            "resumed_batch": resumed_batch, "epoch": loader.epoch}


def raise_with_attempt() -> None:
    """Rank 1 raises, naming the attempt; the others wait in a collective."""
    import torch
    import torch.distributed as dist

    import dask_ddp

    info = dask_ddp.rank_info()
    if info.rank == 1:
        raise ValueError(f"bad batch in attempt {info.restart}")
    t = torch.zeros(1)
    while True:
        dist.all_reduce(t)


def collectives_until(first_seconds: float, later_seconds: float, restart_from: int,
                      marks: str | None) -> dict[str, Any]:
    """All-reduce in a loop: ``first_seconds`` in attempts before ``restart_from``,
    ``later_seconds`` after; returns the world size and attempt."""
    import torch
    import torch.distributed as dist

    import dask_ddp

    info = dask_ddp.rank_info()
    mark(marks, f"start-a{info.restart}-r{info.rank}")
    if info.rank == 0:
        dask_ddp.report({"attempt": info.restart, "world": info.world_size})
    seconds = first_seconds if info.restart < restart_from else later_seconds
    t = torch.ones(1)
    deadline = time.monotonic() + seconds
    while True:
        dist.all_reduce(t)  # every rank runs the same number of rounds
        stop = torch.tensor([1.0 if time.monotonic() >= deadline else 0.0])
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
        time.sleep(0.05)
    return {"world": info.world_size, "restart": info.restart, "rank": info.rank,
            "pid": os.getpid()}


def return_when_told(folder: str, timeout: float) -> int:
    """Every rank marks ``running{rank}`` after a barrier; rank 1 then waits (its worker is
    killed there), the others wait for the test's ``go`` and mark ``returned{rank}``,
    without another collective. Every wait is bounded by ``timeout`` seconds."""
    import torch.distributed as dist

    import dask_ddp

    rank = dask_ddp.rank_info().rank
    dist.barrier()
    mark(folder, f"running{rank}")
    deadline = time.monotonic() + timeout
    while rank == 1 or not Path(folder, "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: no word from the test within {timeout} s")
        time.sleep(0.05)
    mark(folder, f"returned{rank}")
    return rank
