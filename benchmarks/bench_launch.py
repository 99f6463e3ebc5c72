"""Launch benchmark: dask-ddp vs torchrun (and Ray Train), same machine, same function, 2 ranks.

1. Start-up: time from the call to every rank being inside the process group
   (dask-ddp: ``submit`` on a running LocalCluster; torchrun: ``torchrun --standalone``;
   Ray Train: ``TorchTrainer.fit()`` on a running local Ray).
2. DDP step time of a small CNN (gloo, CPU), the same training loop under each.

torchrun and Ray run from the environment captured before ``distributed`` is imported
(:mod:`benchenv`), as their users run them; the differences left between a torchrun rank's
environment and a dask-ddp rank's are printed, and every figure with the load average.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_launch.py [--repeats 5] [--steps 60]

Prints each measurement and the ratios dask-ddp / torchrun (targets: start-up <= 1.2x,
step time <= 1.03x). Ray Train is skipped with a note when not installed (make bench-deps).

``--warm`` compares instead the rank starts warm (forked from the worker's template,
``dask-ddp.launch.warm-start: true``) and cold (a fresh Python, ``false``), with torchrun,
in the same run: the *rank's start*, from the call to the first line of the function of a
one-rank job (no peer to wait for), and the *launch*, from the call to every rank of a
two-rank job being in its process group::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_launch.py --warm [--repeats 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from typing import Any

import benchenv  # first: captures the environment before distributed is imported
import peers

logger = logging.getLogger("bench_launch")


def entered() -> float:
    """Rank side: the wall time at which this rank is inside the process group."""
    import torch.distributed as dist

    assert dist.is_initialized()
    return time.time()


def first_line() -> float:
    """Rank side: the wall time at the function's first line."""
    return time.time()


def cnn_steps_env(steps: int) -> dict[str, Any]:
    """Rank side: :func:`cnn_steps` and this rank's environment."""
    return {"step": cnn_steps(steps), "env": dict(os.environ)}


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


def run_peer(peer: str, mode: str, steps: int) -> tuple[float, dict[str, Any]]:
    """(start-up seconds or slowest rank's median step, rank 0's environment) under a peer."""
    run = peers.run_torchrun if peer == "torchrun" else peers.run_ray
    if mode == "startup":
        t0, values = run("bench_launch:entered", [])
        return max(values) - t0, {}
    _, values = run("bench_launch:cnn_steps_env", [steps])
    return max(v["step"] for v in values), values[0]["env"]


def run_dask(client: Any, mode: str, steps: int) -> tuple[float, dict[str, Any]]:
    import dask_ddp

    t0 = time.time()
    if mode == "startup":
        job = dask_ddp.submit(client, entered, n_workers=2, progress=False)
        return max(job.result()) - t0, {}
    job = dask_ddp.submit(client, cnn_steps_env, steps, n_workers=2, progress=False)
    values = job.result()
    return max(v["step"] for v in values), values[0]["env"]


def _set_warm_start(on: bool) -> None:
    """Worker side: the worker's ``dask-ddp.launch.warm-start`` (read on the worker)."""
    import dask

    dask.config.set({"dask-ddp.launch.warm-start": on})


def run_start(client: Any, how: str) -> tuple[float, float]:
    """(rank start, launch) seconds under ``how``: ``torchrun``, ``warm`` or ``cold``."""
    if how == "torchrun":
        t0, values = peers.run_torchrun("bench_launch:first_line", [], nproc=1)
        start = values[0] - t0
        t0, values = peers.run_torchrun("bench_launch:entered", [])
        return start, max(values) - t0
    import dask_ddp

    client.run(_set_warm_start, how == "warm")
    t0 = time.time()
    start = dask_ddp.submit(client, first_line, n_workers=1, progress=False).result()[0] - t0
    t0 = time.time()
    launch = max(dask_ddp.submit(client, entered, n_workers=2, progress=False).result()) - t0
    return start, launch


def main_warm(repeats: int) -> None:
    """``--warm``: rank start and launch, warm and cold, against torchrun."""
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    kinds = ["torchrun", "warm", "cold"]
    figures: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        first = run_start(client, "warm")  # starts each worker's template
        logger.info("warm, first call on fresh workers (templates start): rank start %.2f s, "
                    "launch %.2f s", *first)
        for i in range(repeats):
            for how in kinds:  # alternate, so drift on this machine hits each alike
                figures[how].append(run_start(client, how))
            logger.info("repeat %d (%s): %s", i, benchenv.load_average(), "; ".join(
                f"{k} start {figures[k][-1][0]:.2f} s, launch {figures[k][-1][1]:.2f} s"
                for k in kinds))
    med = {k: (statistics.median(s for s, _ in v), statistics.median(la for _, la in v))
           for k, v in figures.items()}
    for k in kinds:
        logger.info("%-8s rank start %.3f s (%.2fx torchrun), launch %.3f s (%.2fx torchrun)",
                    k, med[k][0], med[k][0] / med["torchrun"][0], med[k][1],
                    med[k][1] / med["torchrun"][1])
    logger.info("warm / cold: rank start %.2fx, launch %.2fx; medians of %d repeats; end: %s",
                med["warm"][0] / med["cold"][0], med["warm"][1] / med["cold"][1], repeats,
                benchenv.load_average())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--no-ray", action="store_true", help="skip Ray Train")
    p.add_argument("--warm", action="store_true",
                   help="rank start and launch, warm and cold, against torchrun")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.warm:
        logger.info("start: %s", benchenv.load_average())
        main_warm(args.repeats)
        return
    launchers = peers.with_ray(["torchrun", "dask-ddp"], args.no_ray)
    logger.info("start: %s", benchenv.load_average())
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)  # after its own set-up
    start: dict[str, list[float]] = {k: [] for k in launchers}
    step: dict[str, list[float]] = {k: [] for k in launchers}
    envs: dict[str, dict[str, str]] = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        first = run_dask(client, "startup", 0)[0]
        logger.info("dask-ddp first call on fresh workers: %.2f s", first)
        for i in range(args.repeats):
            # Alternate, so drift on this machine hits every launcher alike.
            for name in launchers:
                for mode, into in (("startup", start), ("steps", step)):
                    value, env = (run_dask(client, mode, args.steps) if name == "dask-ddp"
                                  else run_peer(name, mode, args.steps))
                    into[name].append(value)
                    if env:
                        envs.setdefault(name, env)
            logger.info("repeat %d (%s): %s", i, benchenv.load_average(), "; ".join(
                f"{n} start-up {start[n][-1]:.2f} s, step {1e3 * step[n][-1]:.2f} ms"
                for n in launchers))
    benchenv.log_env_differences(logger, "torchrun", envs["torchrun"], "dask-ddp",
                                 envs["dask-ddp"])
    if "ray" in envs:
        benchenv.log_env_differences(logger, "torchrun", envs["torchrun"], "Ray Train",
                                     envs["ray"])
    st, pt = statistics.median(start["torchrun"]), statistics.median(step["torchrun"])
    for name in launchers:
        s_, p_ = statistics.median(start[name]), statistics.median(step[name])
        logger.info("%-9s start-up to all ranks in the process group %.2f s (%.2fx torchrun), "
                    "DDP step of a small CNN, batch 32/rank %.2f ms (%.3fx torchrun)",
                    name, s_, s_ / st, 1e3 * p_, p_ / pt)
    logger.info("medians of %d repeats; targets for dask-ddp: start-up <= 1.2x, step <= 1.03x; "
                "end: %s", args.repeats, benchenv.load_average())


if __name__ == "__main__":
    main()
