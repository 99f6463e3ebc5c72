"""Scale benchmark: launch time and scheduler CPU per job against the number of ranks, and
the results channel's throughput with many ranks reporting at once.

1. For N in ``--ranks`` (default 2 4 8 16 32): a local cluster of N single-thread worker
   processes (``dask worker --nworkers N``) on a scheduler in its own process, so its CPU
   is measured alone (psutil, user+system, over the job). A trivial function (each rank
   returns the time it is inside the process group). Figures: launch (call -> every rank
   inside the process group), the job's end to end time, and the scheduler's CPU seconds
   per job. Baseline in the same run: ``torchrun --standalone --nproc-per-node=N`` with the
   same function, spawned from the environment captured before dask is imported.
2. Results: ``--results-ranks`` ranks (default 32) each ``report()`` ``--records`` metric
   records at once; the client reads them (``job.metrics()``): records per second from the
   first record read to the last, and the scheduler's CPU per 1,000 records.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_scale.py [--ranks 2 4 8 16 32]
        [--repeats 3] [--results-ranks 32] [--records 2000]

Prints every figure with the load average (this machine is shared: say "not quiet").
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import benchenv  # first: captures the environment before distributed is imported
import peers

logger = logging.getLogger("bench_scale")


def entered() -> float:
    """Rank side: the wall time at which this rank is inside the process group."""
    import torch.distributed as dist

    assert dist.is_initialized()
    return time.time()


def report_many(n: int) -> int:
    """Rank side: ``n`` metric records as fast as the rank can hand them over."""
    import dask_ddp

    t0 = time.time()
    for i in range(n):
        dask_ddp.report({"loss": 1.0 / (i + 1), "step_time": 0.01}, step=i)
    return int(t0 * 1000)


class Cluster:
    """A scheduler process and ``n`` worker processes (nanny each), torn down on exit."""

    def __init__(self, n: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="bench-scale-")
        sched_file = os.path.join(self.dir, "scheduler.json")
        env = dict(os.environ)
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
             "--dashboard-address", ":0", "--scheduler-file", sched_file],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(sched_file):
            if time.monotonic() > deadline or self.scheduler.poll() is not None:
                raise RuntimeError("the scheduler did not start")
            time.sleep(0.1)
        self.workers = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
             sched_file, "--nworkers", str(n), "--nthreads", "1", "--no-dashboard"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from distributed import Client

        self.client = Client(scheduler_file=sched_file)
        self.client.wait_for_workers(n, timeout=300)

    def scheduler_cpu(self) -> float:
        import psutil

        t = psutil.Process(self.scheduler.pid).cpu_times()
        return float(t.user + t.system)

    def close(self) -> None:
        self.client.close()
        for proc in (self.workers, self.scheduler):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def launch_figures(n: int, repeats: int) -> dict[str, float]:
    import dask_ddp

    cluster = Cluster(n)
    try:
        starts, totals, cpus = [], [], []
        for _ in range(repeats + 1):  # the first job warms the workers up
            cpu0 = cluster.scheduler_cpu()
            t0 = time.time()
            job = dask_ddp.submit(cluster.client, entered, n_workers=n, progress=False)
            values = job.result(timeout=600)
            t1 = time.time()
            time.sleep(1.0)  # the job's cleanup reaches the scheduler
            starts.append(max(values) - t0)
            totals.append(t1 - t0)
            cpus.append(cluster.scheduler_cpu() - cpu0)
        return {"launch": statistics.median(starts[1:]), "total": statistics.median(totals[1:]),
                "cpu": statistics.median(cpus[1:])}
    finally:
        cluster.close()


def torchrun_launch(n: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0, values = peers.run_torchrun("bench_scale:entered", [], nproc=n)
        times.append(max(values) - t0)
    return statistics.median(times)


def results_figures(n: int, records: int) -> dict[str, float]:
    import dask_ddp

    cluster = Cluster(n)
    try:
        cpu0 = cluster.scheduler_cpu()
        job = dask_ddp.submit(cluster.client, report_many, records, n_workers=n,
                              progress=False)
        count, first = 0, 0.0
        for _ in job.metrics():
            count += 1
            if count == 1:
                first = time.time()
        last = time.time()
        job.result(timeout=600)
        cpu = cluster.scheduler_cpu() - cpu0
        # From the first record read to the last: the ranks' start-up is not in it.
        return {"records": count, "seconds": last - first,
                "rate": (count - 1) / max(last - first, 1e-9),
                "cpu_ms_per_1k": 1e6 * cpu / max(count, 1)}
    finally:
        cluster.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="*", default=[2, 4, 8, 16, 32],
                   help="rank counts of the launch figures (none: skip them)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results-ranks", type=int, default=32)
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--no-torchrun", action="store_true", help="skip the torchrun baseline")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("distributed", "dask_ddp"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logger.info("%s (start)", benchenv.load_average())
    rows = []
    for n in args.ranks:
        ours = launch_figures(n, args.repeats)
        base = float("nan") if args.no_torchrun else torchrun_launch(n, args.repeats)
        rows.append((n, ours, base))
        logger.info("%2d ranks: launch %.2f s (torchrun %.2f s, %.2fx), job %.2f s, scheduler "
                    "CPU %.3f s/job (%.1f ms/rank); %s", n, ours["launch"], base,
                    ours["launch"] / base, ours["total"], ours["cpu"],
                    1000 * ours["cpu"] / n, benchenv.load_average())
    if len(rows) >= 2:
        (n0, a, _), (n1, b, _) = rows[0], rows[-1]
        per_rank_cpu = (b["cpu"] - a["cpu"]) / (n1 - n0)
        per_rank_launch = (b["launch"] - a["launch"]) / (n1 - n0)
        logger.info("growth %d -> %d ranks: launch +%.3f s/rank, scheduler CPU +%.1f ms/rank; "
                    "linear extrapolation to 512 ranks: launch ~%.0f s, scheduler CPU ~%.1f "
                    "s/job (assumes 512 worker processes and linear growth)",
                    n0, n1, per_rank_launch, 1000 * per_rank_cpu,
                    b["launch"] + per_rank_launch * (512 - n1),
                    b["cpu"] + per_rank_cpu * (512 - n1))
    if args.results_ranks:
        r = results_figures(args.results_ranks, args.records)
        logger.info("results: %d ranks x %d records: %d records read in %.2f s (first to "
                    "last), %.0f records/s; scheduler CPU %.1f ms per 1,000 records (the "
                    "whole job, launch included); %s", args.results_ranks, args.records,
                    r["records"], r["seconds"], r["rate"], r["cpu_ms_per_1k"],
                    benchenv.load_average())


if __name__ == "__main__":
    main()
