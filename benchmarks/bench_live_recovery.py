"""Live recovery benchmark: a lost rank costs one step, not a restart.

A 3-rank DDP job (an MLP, SGD with momentum, a Checkpointer) on a LocalCluster of 3
worker processes. Each rank writes the wall time of every optimizer step it completes.
In the same run:

- ``recovery="live"``: SIGKILL rank 1's process mid-training; *kill to the first step of
  the re-formed group* is the first step a survivor completes after the kill; the job's
  generation record gives the regroup's own time (survivor noticing -> state agreed);
- ``recovery="restart"`` (``max_restarts=1``, today's whole-group restart): the same kill;
  kill to the first step completed by the new attempt;
- a join: the live job on 2 of the workers, ``max_workers=3``; the third worker comes
  (``cluster.scale(3)``) mid-training: seconds from its registration, and from the
  joining rank's ``Checkpointer(...)`` (where it asks to join), to its first step in the
  group;
- steady state: the median step time of a job with ``recovery="live"`` and of the same
  job without it, no kill, run in turn (``--steady-pairs``); the median of the pairs'
  ratios (the hook's cost: each bucket's all-reduce through the comm hook and a
  callback per step; a copy of each bucket only with ``gradient_as_bucket_view=True``).

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_live_recovery.py [--steps 400]
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
from typing import Any

import benchenv  # first: the clean environment, before distributed is imported

logger = logging.getLogger("bench_live_recovery")


def train(marks: str, steps: int, width: int, wait_for: int = 0) -> int:
    """Rank side: the README's loop; every completed step's wall time in ``marks``.
    ``wait_for``: after a quarter of the steps, step slowly (every 20 ms more) until the
    group has that many ranks (a join: it comes at a step boundary)."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dask_ddp

    info = dask_ddp.rank_info()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                              nn.ReLU(), nn.Linear(width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    Path(marks, f"ckpt-a{info.restart}-r{info.rank}").write_text(repr(time.time()))
    ckpt = dask_ddp.Checkpointer(model, opt)  # a joining rank joins here
    # A joiner goes on from the group's step (no checkpoint is read).
    done = ckpt.restore().get("step", 0) if os.environ.get("DASK_DDP_STORAGE") else 0
    gen = torch.Generator().manual_seed(info.rank)
    Path(marks, f"pid-a{info.restart}-r{info.rank}").write_text(str(os.getpid()))
    with open(Path(marks, f"steps-a{info.restart}-r{info.rank}"), "a") as out:
        for _ in range(steps - done):
            x = torch.randn(64, width, generator=gen)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.write(f"{time.time()!r}\n")
            out.flush()
            done += 1
            if wait_for and steps // 4 < done < steps - 20 \
                    and dask_ddp.rank_info().world_size < wait_for:
                time.sleep(0.02)
    return info.restart


def _times(folder: Path, attempt: int, rank: int) -> list[float]:
    path = folder / f"steps-a{attempt}-r{rank}"
    if not path.exists():
        return []
    return [float(x) for x in path.read_text().split()]


def _wait(check: Any, what: str, timeout: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(0.01)
    return value


def kill_run(client: Any, folder: Path, recovery: str, steps: int, width: int,
             kill_at: int) -> tuple[float, Any]:
    """Kill rank 1's process at step ``kill_at``; seconds from the kill to the first step
    completed afterwards by the group that goes on, and the job."""
    import dask_ddp

    folder.mkdir()
    extra = {"max_restarts": 1} if recovery == "restart" else {}
    job = dask_ddp.submit(client, train, str(folder), steps, width, recovery=recovery,
                          progress=False, **extra)
    _wait(lambda: len(_times(folder, 0, 1)) >= kill_at, f"step {kill_at}")
    pid = int((folder / "pid-a0-r1").read_text())
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    if recovery == "live":
        first = _wait(lambda: [t for t in _times(folder, 0, 0) if t > t_kill],
                      "a step after the kill")[0]
    else:
        first = _wait(lambda: _times(folder, 1, 0), "the restart's first step")[0]
    job.result(timeout=600)
    return first - t_kill, job


def join_run(client: Any, cluster: Any, folder: Path, steps: int, width: int
             ) -> tuple[float, float]:
    """A live job on 2 workers, max_workers=3; a third worker comes at step steps // 4
    (the two step every ~20 ms more until it joined): seconds from its registration,
    and from the joiner's Checkpointer, to its first step."""
    import dask_ddp

    folder.mkdir()
    cluster.scale(2)
    _wait(lambda: len(client.scheduler_info(n_workers=-1)["workers"]) == 2, "2 workers")
    job = dask_ddp.submit(client, train, str(folder), steps, width, 3, recovery="live",
                          min_workers=2, max_workers=3, storage=(folder / "ckpt").as_uri(),
                          progress=False)
    _wait(lambda: len(_times(folder, 0, 0)) >= steps // 4, f"step {steps // 4}")
    before = set(client.scheduler_info(n_workers=-1)["workers"])
    cluster.scale(3)
    _wait(lambda: set(client.scheduler_info(n_workers=-1)["workers"]) - before,
          "the third worker", timeout=120)
    t_worker = time.time()
    first = _wait(lambda: _times(folder, 0, 2), "the joiner's first step")[0]
    t_ckpt = float((folder / "ckpt-a0-r2").read_text())
    job.result(timeout=600)
    if len(job.generations) != 1 or job.generations[0].joined != (2,):
        raise RuntimeError(f"expected one join, got {job.generations}")
    return first - t_worker, first - t_ckpt


def steady(client: Any, folder: Path, recovery: str, steps: int, width: int,
           n_workers: int | None = None) -> float:
    """The median step time of rank 0 over the second half of a run."""
    import dask_ddp

    folder.mkdir()
    dask_ddp.submit(client, train, str(folder), steps, width, recovery=recovery,
                    n_workers=n_workers, progress=False).result(timeout=600)
    t = _times(folder, 0, 0)[steps // 2:]
    return statistics.median(b - a for a, b in zip(t, t[1:], strict=False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steady-pairs", type=int, default=7,
                        help="steady-state runs with and without live recovery, in turn")
    parser.add_argument("--steady-only", action="store_true",
                        help="measure the steady state only (no kills, no joins)")
    parser.add_argument("--steady-ranks", type=int, default=None,
                        help="ranks of the steady-state jobs (default: every worker)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    benchenv.log_load_around_run(logger)
    logger.setLevel(logging.INFO)
    from distributed import Client, LocalCluster

    with tempfile.TemporaryDirectory() as tmp, LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0",
            scheduler_port=0) as cluster, Client(cluster) as client:
        root = Path(tmp)
        steady(client, root / "warm", "restart", 40, args.width)  # the workers' imports
        live: list[float] = []
        restart: list[float] = []
        regroup: list[float] = []
        for i in range(0 if args.steady_only else args.repeats):
            took, job = kill_run(client, root / f"live{i}", "live", args.steps, args.width,
                                 args.steps // 4)
            live.append(took)
            regroup += [g.recovery_s for g in job.generations]
            took, _ = kill_run(client, root / f"restart{i}", "restart", args.steps,
                               args.width, args.steps // 4)
            restart.append(took)
            logger.info("kill %d: live %.3f s, whole-group restart %.2f s", i + 1, live[-1],
                        restart[-1])
        # Long enough that the slow steps outlast a worker's start on a busy host.
        if not args.steady_only:
            joins = [join_run(client, cluster, root / f"join{i}", max(args.steps, 3000),
                              args.width) for i in range(args.repeats)]
            logger.info("a join: the new worker's registration -> the joiner's first step "
                        "%.3f s; its Checkpointer (asking to join) -> its first step %.3f s "
                        "(medians of %d)", statistics.median(j[0] for j in joins),
                        statistics.median(j[1] for j in joins), args.repeats)
            m_live, m_restart = statistics.median(live), statistics.median(restart)
            logger.info("kill -> first step of the group that goes on (median of %d): live "
                        "%.3f s (regroup itself %.3f s), whole-group restart %.2f s; ratio "
                        "%.3fx", args.repeats, m_live, statistics.median(regroup),
                        m_restart, m_live / m_restart)
        # In turn, so that the machine's drift falls on both alike; the ratio of each pair.
        with_live, without = [], []
        for i in range(args.steady_pairs):
            with_live.append(steady(client, root / f"sl{i}", "live", args.steps, args.width,
                                    args.steady_ranks))
            without.append(steady(client, root / f"sr{i}", "restart", args.steps,
                                  args.width, args.steady_ranks))
        ratios = [a / b for a, b in zip(with_live, without, strict=True)]
        logger.info("steady-state step: recovery='live' %.2f ms, without %.2f ms (medians "
                    "of %d); median of the pairs' ratios %.3fx (each: %s)",
                    1e3 * statistics.median(with_live), 1e3 * statistics.median(without),
                    len(ratios), statistics.median(ratios),
                    " ".join(f"{r:.3f}" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
