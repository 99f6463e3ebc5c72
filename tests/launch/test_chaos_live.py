"""Random faults on live jobs: after each, the survivors agree, every sample was read once.

Each run starts a 3-rank ``recovery="live"`` job over one epoch of images whose labels are
their indices, and at a random step SIGKILLs a rank's worker (its nanny brings it back),
SIGKILLs a rank process, SIGSTOPs a rank (the stall rule ends it and the others go on),
retires a rank's worker, SIGKILLs rank 0's worker (the one a torchrun job keeps its store
on), or SIGKILLs a rank and then a second one soon after (while the group re-forms or
reads the first one's samples). After each: the job
returns on every survivor with bit-identical parameters, buffers and optimizer state; every
sample of the epoch was trained on exactly once across the job (the lost ranks' batches up
to the step the group agreed on, the rest dealt to the survivors), plus at most the
padding repeats of each group; no rank process, task, results topic or work dir of the job
is left. The seed is printed; ``DASK_DDP_CHAOS_SEED=N`` replays it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, LocalCluster

import dask_ddp
from cluster_util import client_fixture, rank_processes, worker_fates
from dask_ddp._cluster import cluster_info
from dask_ddp._launch.worker.workdir import clean_orphans
from images import file_putter, write_folder
from launch_util import active_tasks, results_topics, wait_until, work_dirs
from waits import WORKER_CHECK

pytestmark = [pytest.mark.dask, pytest.mark.slow, pytest.mark.timeout(900)]

WORLD = 3
IMAGES = 120        # 20 steps of 2 images on each of 3 ranks
PAUSE = 0.05        # seconds between steps: a strike lands mid-epoch
STALL_S = 6 * WORKER_CHECK
CLEAN_S = 30.0
FAULTS = ("worker", "rank", "stop", "retire", "rank0-worker", "second")
#: ``make test``'s smoke run: the fault no deterministic test runs on a cluster (two
#: kills, the second while the group re-forms; test_live_regroup.py runs it on forked
#: ranks). Each other fault has a test of its own: a killed worker (test_live_join.py),
#: a killed rank, a frozen rank, a retired worker, rank 0's worker (test_live_job.py).
SMOKE = ("second",)
#: ``make stress`` sets DASK_DDP_CHAOS_RUNS=12 (each fault twice) and repeats the module
#: 20 times.
RUNS = int(os.environ.get("DASK_DDP_CHAOS_RUNS", "0")) or None


def chaos_live_train(root: str, folder: str, pause: float) -> dict[str, Any]:
    """One epoch of a DDP model over the images through a Loader in the Checkpointer;
    before each step the batch's labels go to ``folder/audit-<first rank>-<pid>``."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dask_ddp.data import ImageList, Loader
    from dask_ddp.data import transforms as T
    from live_util import audited_epoch

    start = dask_ddp.rank_info()
    keys = sorted(str(p.relative_to(root)) for p in Path(root).rglob("*.jpg"))
    loader = Loader(ImageList(root, keys, list(range(len(keys)))), 2, seed=5,
                    transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]), num_threads=1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dask_ddp.Checkpointer(model, opt, loader=loader)
    Path(folder, f"pid{start.rank}").write_text(str(os.getpid()))
    # The first victim waits a few steps after the strike's step until the strike came.
    victim, hold_at = (int(v) for v in Path(folder, "hold").read_text().split())
    return audited_epoch(loader, model, opt, folder, f"audit-{start.rank}-{os.getpid()}",
                         start.rank, pause, hold_at=hold_at if start.rank == victim else None)


@dataclass
class Run:
    index: int
    fault: str
    victims: tuple[int, ...]
    at_step: int
    gap: float  # seconds between the two kills of "second"


def plan(seed: int) -> list[Run]:
    rng = random.Random(seed)
    kinds = list(SMOKE) if RUNS is None else [FAULTS[i % len(FAULTS)] for i in range(RUNS)]
    rng.shuffle(kinds)
    runs = []
    for i, fault in enumerate(kinds):
        if fault == "rank0-worker":
            victims: tuple[int, ...] = (0,)
        elif fault == "second":
            victims = tuple(rng.sample(range(WORLD), 2))
        else:
            victims = (rng.randrange(WORLD),)
        runs.append(Run(i, fault, victims, rng.randint(2, 9), rng.uniform(0.0, 0.3)))
    return runs


client = client_fixture(WORLD)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chaos-live-images")
    write_folder(file_putter(str(root)), ["a", "b", "c"], IMAGES // 3, sizes=((10, 10),))
    return root


def test_random_faults_on_live_jobs(client: Client, images: Path, tmp_path: Path) -> None:
    seed = int(os.environ.get("DASK_DDP_CHAOS_SEED", random.randrange(1 << 30)))
    print(f"\nchaos seed {seed} (replay: DASK_DDP_CHAOS_SEED={seed})",  # noqa: T201
          file=sys.stderr)
    cluster = client.cluster
    for run in plan(seed):
        t = time.monotonic()
        out = tmp_path / str(run.index)
        out.mkdir()
        try:
            back_to_full_size(cluster, client)
            job = strike(cluster, client, run, images, out)
            check_outcome(job, run, out)
            check_nothing_left(client, job.id, sweep=run.fault == "retire")
        except BaseException as exc:
            raise AssertionError(f"chaos seed {seed}, {run}: {exc}\nthe cluster's record "
                                 f"of workers leaving:\n{worker_fates(client)}") from exc
        print(f"  {run}: ok in {time.monotonic() - t:.1f} s",  # noqa: T201
              file=sys.stderr)


def back_to_full_size(cluster: LocalCluster, client: Client) -> None:
    """A retired worker is gone for good: the cluster is scaled back before a run."""
    cluster.scale(WORLD)
    client.wait_for_workers(WORLD, timeout=60)


def _step(out: Path, rank: int) -> int:
    with contextlib.suppress(FileNotFoundError, ValueError):
        return int((out / f"step{rank}").read_text())
    return -1


def strike(cluster: LocalCluster, client: Client, run: Run, images: Path,
           out: Path) -> Any:
    """Start the job, then strike when the first victim reached ``run.at_step``: it holds
    two steps later until ``out/struck`` (written here after the strike), so a strike
    that comes late on a loaded machine still lands mid-epoch."""
    first = run.victims[0]
    (out / "hold").write_text(f"{first} {run.at_step + 2}")
    job = dask_ddp.submit(client, chaos_live_train, str(images), str(out), PAUSE,
                          recovery="live", stall_timeout=STALL_S, name=f"live{run.index}",
                          progress=False)

    def started() -> str | None:
        if job.done():
            job.result()  # its error: it ended before the strike
            return None
        missing = [r for r in range(WORLD) if not (out / f"pid{r}").exists()]
        return f"no pid file of ranks {missing}" if missing else None

    def ready() -> str | None:
        if started() is not None:
            return started()
        return None if _step(out, first) >= run.at_step else \
            f"rank {first} at step {_step(out, first)}"

    wait_until(started, 120, "every rank to start")
    pids = {r: int((out / f"pid{r}").read_text()) for r in run.victims}
    worker_pid = 0
    if run.fault in ("worker", "rank0-worker"):  # found before the strike: no call in it
        worker = job.workers[first]
        worker_pid = client.run(os.getpid, workers=[worker])[worker]
    wait_until(ready, 120, f"rank {first} to reach step {run.at_step}")
    try:
        _strike(cluster, client, run, job, pids, worker_pid)
    finally:
        (out / "struck").write_text("")
    return job


def _strike(cluster: LocalCluster, client: Client, run: Run, job: Any, pids: dict[int, int],
            worker_pid: int) -> None:
    first = run.victims[0]
    if run.fault in ("worker", "rank0-worker"):
        os.kill(worker_pid, signal.SIGKILL)
    elif run.fault == "retire":
        # As adapt() scales down: retire the worker, then drop it from the cluster's spec
        # (back_to_full_size makes a new one for the next run).
        name = cluster_info(client)["workers"][job.workers[first]]["name"]
        client.retire_workers([job.workers[first]], close_workers=True)
        cluster.sync(cluster.scale_down, [name])
    elif run.fault == "stop":
        os.kill(pids[first], signal.SIGSTOP)
    else:
        os.kill(pids[first], signal.SIGKILL)
        if run.fault == "second":
            time.sleep(run.gap)
            os.kill(pids[run.victims[1]], signal.SIGKILL)


def check_outcome(job: Any, run: Run, out: Path) -> None:
    try:
        values = job.result(timeout=120)
    finally:
        if run.fault == "stop":  # the stall rule killed it; never leave it stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((out / f"pid{run.victims[0]}").read_text()), signal.SIGKILL)
    world = len(values)
    assert len({v["hash"] for v in values}) == 1, values
    assert sorted(v["rank"] for v in values) == list(range(world)), values
    assert {v["world"] for v in values} == {world}, values
    gens = job.generations
    lost_at: dict[int, int] = {}
    for g in gens:
        for r in g.lost:
            lost_at.setdefault(r, g.step)
    assert set(lost_at) == set(run.victims), (run, gens)
    assert not {v["first_rank"] for v in values} & set(run.victims), values
    check_exactly_once(out, lost_at, gens)


def check_exactly_once(out: Path, lost_at: dict[int, int], gens: list[Any]) -> None:
    """Every sample once across the job: a lost rank's batches count up to the step its
    group agreed on (later ones were dealt again); padding repeats at most world-1 for
    each group the epoch ran in."""
    seen: list[int] = []
    for path in out.glob("audit-*"):
        first = int(path.name.split("-")[1])
        cut = lost_at.get(first)
        for line in path.read_text().splitlines():
            it, labels = line.split()
            if cut is None or int(it) <= cut:
                seen += [int(v) for v in labels.split(",")]
    counts = Counter(seen)
    assert sorted(counts) == list(range(IMAGES)), \
        f"never read: {sorted(set(range(IMAGES)) - set(counts))}, generations {gens}"
    sizes = [WORLD] + [g.world_size for g in gens]
    repeats = sum(c - 1 for c in counts.values())
    assert repeats <= sum(s - 1 for s in sizes), (
        {k: c for k, c in counts.items() if c > 1}, gens)


def check_nothing_left(client: Client, job_id: str, sweep: bool = False) -> None:
    """``sweep``: a retired worker's process ends before its supervisor removed its rank's
    work dir; the next rank or worker started on the host removes it (its sweep, run
    here on the workers while waiting)."""
    addr = client.scheduler.address

    def alive() -> list[int]:
        found = []
        for p in rank_processes(addr):
            with contextlib.suppress(Exception):
                if p.status() != "zombie":
                    found.append(p.pid)
        return found

    wait_until(alive, CLEAN_S, "rank processes alive")
    wait_until(lambda: client.run_on_scheduler(active_tasks, job_id), CLEAN_S,
               "tasks of the job active on the scheduler")
    wait_until(lambda: [t for t in client.run_on_scheduler(results_topics) if job_id in t],
               CLEAN_S, "results topics left")

    def left() -> list[str]:
        if sweep:
            client.run(clean_orphans)
        return work_dirs(job_id)

    wait_until(left, CLEAN_S, "work dirs left")
