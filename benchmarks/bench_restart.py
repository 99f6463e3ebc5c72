"""Restart benchmark: time from a worker's SIGKILL to every rank running again.

A 2-rank job (``max_restarts=N``) sits in all-reduces on a LocalCluster of 2 worker
processes (with nannies, which bring a killed worker back under a new address). The
benchmark SIGKILLs one worker, N times, and measures for each restart:

- detection: kill -> the job records the failure (``Job.restarts[-1].time``);
- relaunch: kill -> the new attempt's ranks are submitted;
- running: kill -> every rank of the new attempt is inside its process group.

The baseline, in the same run, is a cold launch: ``submit`` -> every rank inside its
process group, on the same (warm) cluster.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_restart.py [--kills 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchenv  # first: the clean environment, before distributed is imported

logger = logging.getLogger("bench_restart")


def rank_fn(marks: str, last_attempt: int) -> int:
    """Rank side: mark entry, then all-reduce until the final attempt's short run ends."""
    import torch
    import torch.distributed as dist

    import dask_ddp

    info = dask_ddp.rank_info()
    Path(marks, f"a{info.restart}-r{info.rank}").write_text(repr(time.time()))
    t = torch.ones(1)
    deadline = time.monotonic() + (1.0 if info.restart >= last_attempt else 3600.0)
    while True:
        dist.all_reduce(t)
        stop = torch.tensor([1.0 if time.monotonic() >= deadline else 0.0])
        dist.all_reduce(stop)
        if stop.item() > 0:
            return info.restart
        time.sleep(0.02)


def wait_marks(folder: Path, attempt: int, world: int, timeout: float = 120.0) -> float:
    """Wall time at which the last rank of ``attempt`` entered its function."""
    files = [folder / f"a{attempt}-r{r}" for r in range(world)]
    deadline = time.monotonic() + timeout
    while not all(f.exists() and f.stat().st_size for f in files):
        if time.monotonic() > deadline:
            raise TimeoutError(f"attempt {attempt} did not start within {timeout}s")
        time.sleep(0.01)
    return max(float(f.read_text()) for f in files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    benchenv.log_load_around_run(logger)
    logger.setLevel(logging.INFO)
    from distributed import Client, LocalCluster

    import dask_ddp

    with tempfile.TemporaryDirectory() as tmp, LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
            scheduler_port=0) as cluster, Client(cluster) as client:
        cold = []
        for i in range(2):  # the first warms the workers' imports
            marks = Path(tmp, f"cold{i}")
            marks.mkdir()
            t0 = time.time()
            job = dask_ddp.submit(client, rank_fn, str(marks), 0, progress=False)
            cold.append(wait_marks(marks, 0, 2) - t0)
            job.result(timeout=120)
        baseline = cold[-1]
        marks = Path(tmp, "killed")
        marks.mkdir()
        job = dask_ddp.submit(client, rank_fn, str(marks), args.kills, progress=False,
                              max_restarts=args.kills)
        rows = []
        for k in range(args.kills):
            wait_marks(marks, k, 2)
            time.sleep(1.0)
            victim = job.workers[k % 2]
            pid = client.run(os.getpid, workers=[victim])[victim]
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            running = wait_marks(marks, k + 1, 2) - t_kill
            detected = job.restarts[k].time - t_kill
            rows.append((detected, running))
            logger.info("kill %d: detected %.2f s, all ranks running again %.2f s after "
                        "the kill", k + 1, detected, running)
        job.result(timeout=120)
        med_detect = statistics.median(r[0] for r in rows)
        med_run = statistics.median(r[1] for r in rows)
        load = os.getloadavg()[0]
        logger.info("load average %.1f; cold launch (baseline) %.2f s", load, baseline)
        logger.info("median over %d kills: detection %.2f s, all ranks running again %.2f s;"
                    " ratio to a cold launch %.2fx", len(rows), med_detect, med_run,
                    med_run / baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
