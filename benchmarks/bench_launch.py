"""Launch benchmark: dask-ddp vs torchrun, same machine, same function, 2 ranks.

1. Start-up: time from the call to every rank being inside the process group
   (dask-ddp: ``submit`` on a running LocalCluster; torchrun: ``torchrun --standalone``).
2. DDP step time of a small CNN (gloo, CPU), the same training loop under both.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_launch.py [--repeats 5] [--steps 60]

Prints each measurement and the ratios dask-ddp / torchrun (targets: start-up <= 1.2x,
step time <= 1.03x).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

logger = logging.getLogger("bench_launch")


def entered() -> float:
    """Rank side: the wall time at which this rank is inside the process group."""
    import torch.distributed as dist

    assert dist.is_initialized()
    return time.time()


def cnn_steps(steps: int, warmup: int = 5, batch: int = 32) -> float:
    """Rank side: median seconds per DDP training step of a small CNN on CIFAR-sized input."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)  # one core per rank under both launchers: 2 cores, 2 ranks
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    times = []
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()  # gradients all-reduced here
        opt.step()
        times.append(time.perf_counter() - t0)
    dist.barrier()
    # The median step: robust to the other jobs sharing this machine's two cores.
    return statistics.median(times[warmup:])


def torchrun_worker(mode: str, steps: int, out_dir: str) -> None:
    """The script torchrun runs: init, then the same rank-side function as dask-ddp's."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = entered() if mode == "startup" else cnn_steps(steps)
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(value, f)
    dist.destroy_process_group()


def run_torchrun(mode: str, steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as out:
        # The thread limits a Dask nanny gives its workers (and so the rank processes).
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1")
        t0 = time.time()
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node=2", os.path.abspath(__file__), "--torchrun-worker", mode,
             "--steps", str(steps), "--out", out],
            check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        values = []
        for r in range(2):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                values.append(json.load(f))
    return [max(values) - t0] if mode == "startup" else values


def run_dask(client: Any, mode: str, steps: int) -> list[float]:
    import dask_ddp

    t0 = time.time()
    if mode == "startup":
        job = dask_ddp.submit(client, entered, n_workers=2, progress=False)
        return [max(job.result()) - t0]
    job = dask_ddp.submit(client, cnn_steps, steps, n_workers=2, progress=False)
    return list(job.result())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--torchrun-worker", choices=["startup", "steps"])
    p.add_argument("--out")
    args = p.parse_args()
    if args.torchrun_worker:
        torchrun_worker(args.torchrun_worker, args.steps, args.out)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        first = run_dask(client, "startup", 0)[0]
        logger.info("dask-ddp first call on fresh workers: %.2f s", first)
        start_d, start_t, step_d, step_t = [], [], [], []
        for i in range(args.repeats):
            # Alternate, so drift on this shared machine hits both alike.
            start_t += run_torchrun("startup", 0)
            start_d += run_dask(client, "startup", 0)
            step_t.append(max(run_torchrun("steps", args.steps)))
            step_d.append(max(run_dask(client, "steps", args.steps)))
            logger.info("repeat %d: start-up torchrun %.2f s, dask-ddp %.2f s; step torchrun "
                        "%.2f ms, dask-ddp %.2f ms", i, start_t[-1], start_d[-1],
                        1e3 * step_t[-1], 1e3 * step_d[-1])
    st, sd = statistics.median(start_t), statistics.median(start_d)
    pt, pd = statistics.median(step_t), statistics.median(step_d)
    logger.info("start-up to all ranks in the process group (median of %d): torchrun %.2f s, "
                "dask-ddp %.2f s, ratio %.2fx (target <= 1.2x)", args.repeats, st, sd, sd / st)
    logger.info("DDP step of a small CNN, batch 32/rank (median of %d): torchrun %.2f ms, "
                "dask-ddp %.2f ms, ratio %.3fx (target <= 1.03x)", args.repeats, 1e3 * pt,
                1e3 * pd, pd / pt)


if __name__ == "__main__":
    main()
