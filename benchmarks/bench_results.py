"""Results channel and checkpoint benchmarks (see BENCHMARKS.md, "Results and checkpoints").

1. End-to-end records/s from 2 ranks (``dask_ddp.submit`` on a LocalCluster) to the
   client's ``Job.metrics()``, counting lost/duplicated records; baselines in the same run:
   the same frames written to a bare pipe drained by ``cat`` (the channel's ceiling) and
   Dask's own ``Worker.log_event`` / ``Client.get_events`` (lossy: keeps the last events).
2. Median cost of one ``report()`` call: in the ranks of run 1 (the real channel, with its
   back-pressure) and in-process on a pipe drained by ``cat``; baseline: ``json.dumps`` of
   the same record alone.
3. A 200 MB state dict checkpoint to ``file://``: how long the training loop is blocked
   (``save_checkpoint`` returns) vs serialising it alone (``torch.save`` to memory), and
   the time until it is complete in storage.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_results.py [--records 100000]``
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
from pathlib import Path
from typing import Any

import benchenv  # first: the clean environment, before distributed is imported

logger = logging.getLogger("bench_results")


def rank_reporting(n: int) -> dict[str, float]:
    """The rank function: report n records, timing each call."""
    import torch.distributed as dist

    import dask_ddp

    dist.barrier()
    clock = time.perf_counter_ns
    costs = []
    t0 = time.time()
    for i in range(n):
        a = clock()
        dask_ddp.report({"loss": 1.0 / (i + 1), "epoch": i // 1000, "lr": 0.01}, step=i)
        costs.append(clock() - a)
    costs.sort()
    return {
        "start": t0,
        "end": time.time(),
        "median_us": costs[len(costs) // 2] / 1e3,
        "p99_us": costs[int(len(costs) * 0.99)] / 1e3,
    }


def bench_end_to_end(client: Any, n: int) -> dict[str, float]:
    import dask_ddp

    job = dask_ddp.submit(client, rank_reporting, n, progress=False, name="bench-report")
    count = 0
    seen: set[tuple[int, int]] = set()
    dups = 0
    for rec in job.metrics():
        key = (rec["rank"], rec["step"])
        dups += key in seen
        seen.add(key)
        count += 1
    t_end = time.time()
    ranks = job.result()
    start = min(r["start"] for r in ranks)
    lost = 2 * n - len(seen)
    return {
        "records": count,
        "lost": lost,
        "duplicates": dups,
        "seconds": t_end - start,
        "rate": count / (t_end - start),
        "rank_send_rate": 2 * n / (max(r["end"] for r in ranks) - start),
        "rank_median_us": statistics.median(r["median_us"] for r in ranks),
        "rank_p99_us": max(r["p99_us"] for r in ranks),
    }


def _log_event_task(n: int, topic: str) -> float:
    from distributed import get_worker

    w = get_worker()
    t0 = time.perf_counter()
    for i in range(n):
        w.log_event(topic, {"loss": 1.0 / (i + 1), "step": i})
    return time.perf_counter() - t0


def bench_log_event(client: Any, n: int) -> dict[str, float]:
    topic = f"bench-{time.time_ns()}"
    workers = sorted(client.scheduler_info()["workers"])
    t0 = time.perf_counter()
    futs = [client.submit(_log_event_task, n, topic, workers=[w], pure=False) for w in workers[:2]]
    client.gather(futs)
    time.sleep(1.0)  # let the batched streams flush
    events = client.get_events(topic)
    dt = time.perf_counter() - t0
    return {"received": len(events), "sent": 2 * n, "seconds": dt}


def bench_raw_pipe(n: int) -> dict[str, float]:
    """The frames report() writes, to a pipe drained by cat: the channel's ceiling."""
    code = (
        "import os, time, json, struct\n"
        "h = struct.Struct('!QQH'); fd = int(os.environ['FD']); t = b'metrics/x'\n"
        f"n = {n}\n"
        "t0 = time.perf_counter()\n"
        "for i in range(n):\n"
        "    p = b'M' + json.dumps({'rank': 0, 'step': i, 'time': time.time(),"
        " 'loss': 1.0 / (i + 1), 'epoch': i // 1000, 'lr': 0.01}).encode()\n"
        "    os.write(fd, h.pack(len(p), i, len(t)) + t + p)\n"
        "print(time.perf_counter() - t0)\n"
    )
    r, w = os.pipe()
    cat = subprocess.Popen(["cat"], stdin=r, stdout=subprocess.DEVNULL)
    os.close(r)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=(w,),
            env=dict(os.environ, FD=str(w)),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    t0 = time.perf_counter()
    for p in procs:
        p.communicate()
    dt = time.perf_counter() - t0
    os.close(w)
    cat.wait()
    return {"rate": 2 * n / dt, "seconds": dt}


def bench_report_inprocess(n: int) -> dict[str, float]:
    from dask_ddp import _channel, results

    r, w = os.pipe()
    cat = subprocess.Popen(["cat"], stdin=r, stdout=subprocess.DEVNULL)
    os.close(r)
    os.environ.update(DASK_DDP_CHANNEL_FD=str(w), RANK="0", DASK_DDP_JOB_ID="bench")
    _channel.reset_writer()
    results._state = None
    clock = time.perf_counter_ns
    costs, base = [], []
    for i in range(n):
        m = {"loss": 1.0 / (i + 1), "epoch": i // 1000, "lr": 0.01}
        a = clock()
        results.report(m, step=i)
        b = clock()
        json.dumps({"rank": 0, "step": i, "time": time.time(), **m}).encode()
        c = clock()
        costs.append(b - a)
        base.append(c - b)
    os.close(w)
    cat.wait()
    del os.environ["DASK_DDP_CHANNEL_FD"]
    return {
        "median_us": statistics.median(costs) / 1e3,
        "p99_us": sorted(costs)[int(n * 0.99)] / 1e3,
        "json_median_us": statistics.median(base) / 1e3,
    }


def bench_checkpoint(mb: int) -> dict[str, float]:
    import io

    import torch

    from dask_ddp.checkpoint import load_checkpoint, save_checkpoint

    n_tensors = 20
    numel = mb * (1 << 20) // 4 // n_tensors
    state = {f"layer{i}.weight": torch.randn(numel) for i in range(n_tensors)}
    nbytes = sum(t.numel() * 4 for t in state.values())
    with tempfile.TemporaryDirectory() as d:
        url = Path(d).as_uri()
        # Alternate the two so that load from other processes hits both alike.
        serialise, blocked, complete = [], [], []
        for step in range(5):
            t0 = time.perf_counter()
            buf = io.BytesIO()
            torch.save(state, buf)
            serialise.append(time.perf_counter() - t0)
            del buf
            t0 = time.perf_counter()
            fut = save_checkpoint(state, step, storage=url, keep=2)
            blocked.append(time.perf_counter() - t0)
            assert fut is not None
            fut.result()
            complete.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with open(Path(d) / "sync.pt", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        sync_save = time.perf_counter() - t0
        os.unlink(Path(d) / "sync.pt")
        loaded = load_checkpoint(url)
        assert torch.equal(loaded["layer0.weight"], state["layer0.weight"])
    return {
        "mb": nbytes / 1e6,
        "serialise_s": statistics.median(serialise),
        "blocked_s": statistics.median(blocked),
        "complete_s": statistics.median(complete),
        "sync_torch_save_s": sync_save,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="records per rank")
    parser.add_argument("--checkpoint-mb", type=int, default=200)
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    benchenv.log_load_around_run(logger)
    from distributed import Client, LocalCluster

    n = args.records
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        e2e = bench_end_to_end(client, n)
        ev = bench_log_event(client, n)
    raw = bench_raw_pipe(n)
    inproc = bench_report_inprocess(n)
    ck = bench_checkpoint(args.checkpoint_mb)
    log = logger.info
    log("== end to end, 2 ranks x %d records (load average %.1f) ==", n, os.getloadavg()[0])
    log(
        "dask-ddp channel: %d records in %.2f s = %.0f records/s, lost %d, duplicates %d",
        e2e["records"],
        e2e["seconds"],
        e2e["rate"],
        e2e["lost"],
        e2e["duplicates"],
    )
    log("the ranks submitted at %.0f records/s (report() returning)", e2e["rank_send_rate"])
    log(
        "baseline raw pipe -> cat (ceiling): %.0f records/s; channel/raw = %.2f",
        raw["rate"],
        e2e["rate"] / raw["rate"],
    )
    log(
        "baseline Worker.log_event: %d of %d events retrievable (%.1f%% lost) in %.2f s",
        ev["received"],
        ev["sent"],
        100 * (1 - ev["received"] / ev["sent"]),
        ev["seconds"],
    )
    log("== report() cost ==")
    log(
        "in the ranks above (real channel): median %.2f us, p99 %.2f us",
        e2e["rank_median_us"],
        e2e["rank_p99_us"],
    )
    log(
        "in-process, pipe drained by cat: median %.2f us, p99 %.2f us; json.dumps alone "
        "%.2f us (ratio %.2f)",
        inproc["median_us"],
        inproc["p99_us"],
        inproc["json_median_us"],
        inproc["median_us"] / inproc["json_median_us"],
    )
    log("== checkpoint of a %.0f MB state dict to file:// ==", ck["mb"])
    log(
        "training loop blocked %.3f s vs serialising alone %.3f s (ratio %.2f); complete in "
        "storage after %.3f s; a synchronous torch.save+fsync to a file takes %.3f s",
        ck["blocked_s"],
        ck["serialise_s"],
        ck["blocked_s"] / ck["serialise_s"],
        ck["complete_s"],
        ck["sync_torch_save_s"],
    )
    return 0 if e2e["lost"] == 0 and e2e["duplicates"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
