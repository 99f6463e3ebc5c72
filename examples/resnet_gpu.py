"""A ResNet-18 trained with DDP on the cluster's GPUs; the same file runs on CPUs.

What it shows
-------------
- ``dask_ddp.rank_info().device``: the rank's own device. dask-ddp gives the ranks of a
  machine distinct GPUs where it has enough (across workers too) and selects it; use this
  device, not ``cuda:<local_rank>``. Where a machine has more ranks than GPUs they share
  one and ``backend="auto"`` trains on gloo, with a warning naming the GPU. Without CUDA
  it is the CPU, and the job runs there on gloo.
- On a GPU: ``DistributedDataParallel(device_ids=[device.index])``, bf16 autocast,
  channels_last weights and batches, batches copied from pinned memory without blocking.
- ``dask_ddp.report({"loss": loss})`` with the loss tensor itself: no ``.item()``, so the
  loop never waits for the GPU; the value reaches the client once the GPU produced it.
- The data is synthetic (random images whose class shifts their brightness, made on each
  rank): the point is the device handling; see ``quickstart.py`` for the Loader.

How to run
----------
$ python examples/resnet_gpu.py                                   # 2 ranks, small, CPU or GPU
$ python examples/resnet_gpu.py --nprocs-per-worker 4 --image-size 224 --batch-size 256 \\
      --steps 200                       # 4 GPUs of one machine: 1 worker, 4 ranks
$ python examples/resnet_gpu.py --scheduler tcp://10.0.0.5:8786 --n-workers 8 ...

Without ``--scheduler`` the LocalCluster has 2 workers of one rank each, or, with
``--nprocs-per-worker N`` above 1, one worker of N ranks (N ranks on the machine: one per
GPU where it has N).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from dask.distributed import Client, LocalCluster
from torch.nn.parallel import DistributedDataParallel as DDP

import dask_ddp

logger = logging.getLogger("resnet_gpu")


def synthetic_batch(gen: torch.Generator, batch_size: int, image_size: int,
                    classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose class is visible in their mean brightness, and their labels (CPU)."""
    labels = torch.randint(classes, (batch_size,), generator=gen)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=gen) * 0.5
    images += (labels.float() * (2.0 / classes) - 1.0).view(-1, 1, 1, 1)
    return images, labels


def train(steps: int, batch_size: int, image_size: int, classes: int,
          lr: float) -> dict[str, Any]:
    """One rank's training: runs in each rank process, the process group already up."""
    info = dask_ddp.rank_info()
    device = info.device  # its own GPU (the launcher selected it), or the CPU
    on_gpu = device.type == "cuda"
    if on_gpu:
        from torch.backends import cudnn  # imported here: the function travels pickled

        cudnn.benchmark = True  # fixed shapes: pick the fastest kernels once
    # channels_last is what the tensor cores' convolutions read; on a CPU it only costs.
    layout = torch.channels_last if on_gpu else torch.contiguous_format
    torch.manual_seed(0)  # DDP broadcasts rank 0's weights anyway
    net = torchvision.models.resnet18(weights=None, num_classes=classes)
    model = DDP(net.to(device, memory_format=layout),
                device_ids=[device.index] if on_gpu else None)
    opt = torch.optim.SGD(model.parameters(), lr=lr * info.world_size, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + info.rank)  # each rank its own samples
    first = last = None
    started = time.perf_counter()
    for step in range(steps):
        images, labels = synthetic_batch(gen, batch_size, image_size, classes)
        if on_gpu:  # a pinned copy can go without blocking the loop
            images, labels = images.pin_memory(), labels.pin_memory()
        images = images.to(device, non_blocking=True).contiguous(memory_format=layout)
        labels = labels.to(device, non_blocking=True)
        # bf16 autocast on the GPU: the matmuls and convolutions in bf16, the loss in fp32.
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
            loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dask_ddp.report({"loss": loss.detach()})  # a tensor: report() does not wait for it
        if step == 0:
            first = loss.detach()
        last = loss.detach()
    assert first is not None and last is not None
    # One wait for the GPU, at the end: the values the result needs.
    return {"rank": info.rank, "device": str(device), "steps": steps,
            "first_loss": first.item(), "last_loss": last.item(),
            "seconds": time.perf_counter() - started}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--scheduler", help="a Dask scheduler's address (default: a LocalCluster)")
    p.add_argument("--n-workers", type=int, default=None,
                   help="workers (ranks per worker: --nprocs-per-worker); default: every "
                        "worker of --scheduler, else a LocalCluster of 2 workers, or of 1 "
                        "with --nprocs-per-worker above 1")
    p.add_argument("--nprocs-per-worker", type=int, default=1,
                   help="ranks per worker, e.g. 4 for one worker on a 4-GPU machine (ranks "
                        "on one machine beyond its GPUs share one, on gloo)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.01, help="per rank (scaled by world size)")
    p.add_argument("--out", type=Path, default=Path("runs/resnet"),
                   help="output folder: metrics.jsonl and summary.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    call = (args.steps, args.batch_size, args.image_size, args.classes, args.lr)
    if args.scheduler:
        with Client(args.scheduler) as client:
            job = dask_ddp.submit(client, train, *call, n_workers=args.n_workers,
                                  nprocs_per_worker=args.nprocs_per_worker,
                                  output_dir=args.out)
            ranks = job.result()
    else:
        # One machine: several ranks per worker means one worker, so the machine runs
        # nprocs_per_worker ranks (one per GPU), not a multiple of them.
        n_workers = args.n_workers or (2 if args.nprocs_per_worker == 1 else 1)
        with LocalCluster(n_workers=n_workers, threads_per_worker=1,
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            job = dask_ddp.submit(client, train, *call, n_workers=n_workers,
                                  nprocs_per_worker=args.nprocs_per_worker,
                                  output_dir=args.out)
            ranks = job.result()
    summary = {"world_size": len(ranks), "ranks": ranks}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for r in ranks:
        logger.info("rank %d on %s: loss %.3f -> %.3f in %d steps, %.1f s", r["rank"],
                    r["device"], r["first_loss"], r["last_loss"], r["steps"], r["seconds"])
    return summary


if __name__ == "__main__":
    main()
