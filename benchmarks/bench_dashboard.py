"""The job page's cost (see BENCHMARKS.md, "Job page").

1. Step time of a 2-rank gloo DDP job with its job page closed against open and
   refreshing, in the same run and the same job: the run alternates phases (closed, open,
   closed, open, ..., then a stress phase). "Open" makes the page's own requests (its
   HTML once, then ``api/job/<id>`` every 2 s as the page's script does, plus the jobs
   list); "stress" asks ``api/job/<id>`` 20 times a second. Each rank reports its own
   step time with ``report()``; the ratio is the median step time of the open phases over
   that of the closed ones. The scheduler's answer time for ``api/job/<id>`` is printed
   too.
2. What a Loader batch pays for the page: the two clock reads and two shared-memory adds
   per batch (``counters.add_batch``), against an empty loop, in this process.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_dashboard.py [--phase-s 10]``
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
import urllib.request

import benchenv  # first: the clean environment, before distributed is imported

logger = logging.getLogger("bench_dashboard")


def train(seconds: float) -> int:
    """The rank function: a small MLP under DDP; reports its step time every step."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dask_ddp

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    dist.barrier()
    deadline = time.time() + seconds
    step = 0
    while True:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        dask_ddp.report({"loss": loss.item(), "step_ms": 1e3 * dt}, step=step)
        step += 1
        # Every rank stops at the same step (a collective decides), so none waits alone.
        flag = torch.tensor([1.0 if time.time() >= deadline else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            return step


class Poller:
    """Makes a page's requests in a thread while ``active``; times each answer."""

    def __init__(self, root: str, job_id: str) -> None:
        self.root, self.job_id = root, job_id
        self.interval = 2.0
        self.active = threading.Event()
        self.stop = threading.Event()
        self.latencies: dict[str, list[float]] = {}
        self.phase = ""
        self.thread = threading.Thread(target=self.run, daemon=True)

    def get(self, path: str) -> None:
        t0 = time.perf_counter()
        with urllib.request.urlopen(self.root + path, timeout=10) as r:
            r.read()
        self.latencies.setdefault(self.phase, []).append(time.perf_counter() - t0)

    def run(self) -> None:
        opened = False
        while not self.stop.is_set():
            if not self.active.is_set():
                opened = False
                self.stop.wait(0.05)
                continue
            if not opened:  # the page's HTML and script, once per opening
                self.get(f"job/{self.job_id}")
                self.get("static/dashboard.js")
                opened = True
            self.get(f"api/job/{self.job_id}")
            if self.interval >= 1.0:
                self.get("api/jobs")
            self.stop.wait(self.interval)


def bench_page(phase_s: float) -> None:
    from distributed import Client, LocalCluster

    import dask_ddp

    logging.getLogger("distributed").setLevel(logging.WARNING)  # set to INFO on its import
    phases = ["closed", "open", "closed", "open", "closed", "open", "closed", "stress"]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0", scheduler_port=0) as cluster, \
            Client(cluster) as client:
        root = client.dashboard_link.rsplit("/", 1)[0] + "/dask-ddp/"
        warmup = 6.0
        job = dask_ddp.submit(client, train, warmup + phase_s * len(phases), progress=False,
                              name="bench-dashboard")
        poller = Poller(root, job.id)
        poller.thread.start()
        bounds: list[tuple[str, float, float]] = []
        time.sleep(warmup)  # ranks started, samples flowing
        for name in phases:
            poller.phase = name
            poller.interval = 0.05 if name == "stress" else 2.0
            if name == "closed":
                poller.active.clear()
            else:
                poller.active.set()
            t0 = time.time()
            time.sleep(phase_s)
            bounds.append((name, t0, time.time()))
        poller.active.clear()
        poller.stop.set()
        poller.thread.join(15)
        steps = job.result(timeout=120 + phase_s * len(phases))
        records = list(job.metrics())
    logger.info("steps per rank: %s; %d records", steps, len(records))
    by_phase: dict[str, list[float]] = {}
    for name, t0, t1 in bounds:
        # Leave out the first second of a phase (requests of the last one in flight).
        by_phase.setdefault(name, []).extend(
            r["step_ms"] for r in records if t0 + 1.0 <= r["time"] < t1)
    closed = statistics.median(by_phase["closed"])
    logger.info(f"step time (median of both ranks' steps), {benchenv.load_average()}:")
    for name in ("closed", "open", "stress"):
        xs = by_phase[name]
        med = statistics.median(xs)
        lat = poller.latencies.get(name, [])
        lat_text = (f"; api/job answered in median {1e3 * statistics.median(lat):.2f} ms "
                    f"over {len(lat)} requests" if lat else "")
        logger.info(f"  page {name:6s}: {med:7.3f} ms over {len(xs):6d} steps, "
              f"ratio to closed {med / closed:.3f}{lat_text}")


def bench_counters(n: int) -> None:
    import os
    import tempfile

    from dask_ddp._dashboard import counters

    with tempfile.TemporaryDirectory() as d:
        c = counters.create(os.path.join(d, "c"))
        clock = time.perf_counter_ns

        def with_counters() -> None:
            for _ in range(n):
                t0 = clock()
                c.add_batch(clock() - t0)

        def empty() -> None:
            for _ in range(n):
                pass

        best = {}
        for name, fn in (("empty loop", empty), ("counters", with_counters)):
            runs = []
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                runs.append(time.perf_counter() - t0)
            best[name] = min(runs) / n * 1e9
    logger.info(f"per Loader batch, best of 5 x {n}, {benchenv.load_average()}: counters "
          f"{best['counters']:.0f} ns, empty loop {best['empty loop']:.0f} ns, "
          f"added {best['counters'] - best['empty loop']:.0f} ns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase-s", type=float, default=10.0,
                        help="seconds per phase (closed/open/stress)")
    parser.add_argument("--batches", type=int, default=200_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("distributed", "dask_ddp"):
        logging.getLogger(name).setLevel(logging.WARNING)
    benchenv.log_load_around_run(logger)
    bench_counters(args.batches)
    bench_page(args.phase_s)


if __name__ == "__main__":
    main()
