"""A plain torchrun-style training script: it runs unchanged under torchrun and dask-ddp.

Nothing here imports dask, and dask_ddp only to ask for the rank's GPU where it is
installed. The script reads ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` from the
environment (set by either launcher), picks its device (:func:`rank_device`), calls
``init_process_group`` (``nccl`` on a GPU, else ``gloo``; the rendezvous
address comes from ``MASTER_ADDR``/``MASTER_PORT``), trains a small classifier on its
shard of a synthetic data set (the same on every launch: generated from ``--seed``),
all-reduces the loss and accuracy every epoch, and on rank 0 logs a summary and writes it
as JSON to ``--out``. Started without a launcher it runs as a single process.

How to run
----------
$ torchrun --standalone --nproc-per-node 2 examples/train_script.py --epochs 5 --out result.json
$ dask-ddp run --n-workers 2 examples/train_script.py --epochs 5 --out result.json
$ dask-ddp run --scheduler tcp://10.0.0.5:8786 --n-workers 4 examples/train_script.py \\
      --out /shared/result.json

``dask-ddp run`` without ``--scheduler`` starts a LocalCluster of ``--n-workers`` worker
processes, one rank each; each rank's output reaches the terminal prefixed with
``[rank N]``. The ranks start in the launching directory (relative paths work on a local
cluster); on a real cluster ``--out`` is written by rank 0 on its own worker's machine.

The result JSON::

    {"world_size": 2, "backend": "gloo", "epochs": 5, "seed": 0,
     "history": [{"epoch": 0, "loss": 0.52, "accuracy": 0.81}, ...],
     "loss": 0.12, "accuracy": 0.97, "eval_accuracy": 0.96, "seconds": 1.4}

``loss``/``accuracy`` are the last epoch's, over all ranks' training shards;
``eval_accuracy`` is over the whole held-out set.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

logger = logging.getLogger("train_script")

N_FEATURES = 10


def make_data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points of a learnable 2-class problem (a random teacher network's labels)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, N_FEATURES, generator=g)
    w1 = torch.randn(N_FEATURES, 16, generator=g)
    w2 = torch.randn(16, generator=g)
    y = (torch.tanh(x @ w1) @ w2 > 0).long()
    return x, y


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="base learning rate, scaled by "
                   "the world size")
    p.add_argument("--samples", type=int, default=4096, help="training points in all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="rank 0 writes the result JSON here")
    args = p.parse_args(argv)
    if min(args.epochs, args.batch_size, args.samples) < 1:
        p.error("--epochs, --batch-size and --samples must be >= 1")
    return args


def single_process_env() -> None:
    """Without a launcher: world size 1, rendezvous on a free local port."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def rank_device() -> torch.device:
    """This rank's own device: ``dask_ddp.rank_info().device`` where dask-ddp is installed
    (``cuda:0`` under dask-ddp, which lists each rank's own GPU first in its
    ``CUDA_VISIBLE_DEVICES``, so ``cuda:LOCAL_RANK`` would be another rank's GPU;
    ``cuda:LOCAL_RANK`` under torchrun, which shows every rank every GPU), else
    ``cuda:LOCAL_RANK``; the CPU without CUDA."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    try:
        import dask_ddp
    except ImportError:  # torchrun in an environment without dask-ddp
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return dask_ddp.rank_info().device


def train(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Train on this rank's shard; return the all-reduced summary (the same on every rank)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data(args.seed, args.samples + 1024)
    x_train, y_train = x[:args.samples], y[:args.samples]
    x_eval, y_eval = x[args.samples:], y[args.samples:]
    # Each rank its own rows, as many on every rank: DDP needs the same number of steps.
    per_rank = args.samples // world
    x_mine = x_train[rank::world][:per_rank].to(device)
    y_mine = y_train[rank::world][:per_rank].to(device)

    torch.manual_seed(args.seed)  # DDP broadcasts rank 0's initial weights anyway
    model = DDP(nn.Sequential(nn.Linear(N_FEATURES, 32), nn.ReLU(), nn.Linear(32, 2))
                .to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(y_mine), generator=torch.Generator().manual_seed(epoch))
        totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss, correct, rows
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            logits = model(x_mine[idx])
            loss = loss_fn(logits, y_mine[idx])
            optimizer.zero_grad()
            (loss / len(idx)).backward()
            optimizer.step()
            totals += torch.stack([loss.detach().double(),
                                   (logits.argmax(1) == y_mine[idx]).sum().double(),
                                   torch.tensor(float(len(idx)), device=device).double()])
        dist.all_reduce(totals)  # over every rank's shard
        loss_sum, correct, rows = totals.tolist()
        history.append({"epoch": epoch, "loss": loss_sum / rows, "accuracy": correct / rows})
        if rank == 0:
            logger.info("epoch %d: loss %.4f, accuracy %.4f (%d rows, %d ranks)", epoch,
                        loss_sum / rows, correct / rows, rows, world)

    model.eval()
    with torch.no_grad():
        mine = slice(rank, None, world)
        pred = model(x_eval[mine].to(device)).argmax(1)
        counts = torch.tensor([(pred == y_eval[mine].to(device)).sum().item(),
                               len(pred)], dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    return {"world_size": world, "backend": dist.get_backend(), "epochs": args.epochs,
            "seed": args.seed, "history": history, "loss": history[-1]["loss"],
            "accuracy": history[-1]["accuracy"],
            "eval_accuracy": float(counts[0] / counts[1]),
            "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    single_process_env()
    rank = int(os.environ["RANK"])
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s rank {rank} %(message)s")
    # A tiny model gains nothing from intra-op threads; the ranks would fight over cores.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = rank_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # env://: MASTER_ADDR/PORT
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        result = train(args, device)
        # The DDP model (its reducer holds the process group) is freed here, while the
        # interpreter is whole: left to the collector at exit, gloo's threads release
        # their tensors during finalization and abort the process.
        gc.collect()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        logger.info("done: %d ranks (%s), %d epochs, loss %.4f, train accuracy %.4f, "
                    "held-out accuracy %.4f, %.1f s", result["world_size"], result["backend"],
                    result["epochs"], result["loss"], result["accuracy"],
                    result["eval_accuracy"], result["seconds"])
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            logger.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
