"""Live recovery keeps "every sample exactly once" on a loaded machine: an audit.

Each run starts a 3-rank ``recovery="live"`` job (``min_workers=2, max_workers=3``) over
two epochs of images, tar shards or a Parquet table whose labels are the samples' ids, and
at a random (seeded) step strikes one rank: ``kill`` SIGKILLs its process (its worker
stays, so no rank joins), ``retire`` retires its worker (the graceful leave: the rank
finishes its step and leaves), ``kill-join`` SIGKILLs its worker, whose nanny brings it
back: a new rank joins the smaller group mid-run. Every rank logs each batch's ids before
its step and the step's end after it; the test checks that every id of each epoch was
trained on exactly once (a lost rank's batches count up to the step its group agreed on,
the padding of each group and deal aside), that a graceful leave dropped none of the
leaver's steps, and measures the time from the strike to the smaller group's first step.

``DASK_DDP_AUDIT_RUNS=N`` runs each scenario N times in a row (seeds ``S, S+1, ...``);
``DASK_DDP_AUDIT_SEED=S`` replays (default: a random seed, printed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import random
import signal
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

import dask_ddp
from cluster_util import client_fixture, worker_fates
from dask_ddp._cluster import cluster_info
from images import encode, file_putter, photo, write_folder
from stress import STRESS, variants
from waits import wait_until

RUNS = int(os.environ.get("DASK_DDP_AUDIT_RUNS", "1"))
# A run takes 20-70 s beside the stress hogs (a worker's restart in kill-join).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300 + 200 * RUNS)]

WORLD = 3
N = 60              # samples: 10 batches of 2 per rank at 3 ranks, 15 at 2 (no padding)
BATCH = 2
EPOCHS = 2
PAUSE = 0.03        # seconds between steps
KINDS = ("images", "shards", "table")

client = client_fixture(WORLD)


# -- the rank's side ------------------------------------------------------------------------
def audit_train(kind: str, data: Any, folder: str) -> dict[str, Any]:
    """Two epochs of a DDP model over ``data`` (labels: the samples' ids) through a Loader
    in the Checkpointer. Before each step ``b <epoch> <step> <ids>`` and after it ``s
    <step> <world size> <time>`` go to ``folder/audit-<uid>-<pid>``. The victim holds
    after its strike step until ``folder/struck``; in ``kill-join``, the survivors hold a
    few steps after the loss until ``folder/go`` (the joining rank is about to ask); in
    ``retire``, the victim holds until it is asked to leave (however late the retirement
    comes on a loaded host, it lands mid-run), in ``kill-join`` until it dies."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dask_ddp._launch.rank.live import group as live
    from dask_ddp.data import ImageList, Loader, Source, TableLoader, TarShards
    from dask_ddp.data import transforms as T

    group = live.current()
    assert group is not None
    uid, joining = group.uid, group.joining
    Path(folder, f"pid{uid}").write_text(str(os.getpid()))
    tf = T.Compose([T.Resize((6, 6)), T.ToTensor()])
    width = 3 * 6 * 6
    loader: Any
    if kind == "images":
        keys = sorted(str(p.relative_to(data)) for p in Path(data).rglob("*.jpg"))
        loader = Loader(ImageList(data, keys, list(range(len(keys)))), BATCH, seed=7,
                        transform=tf, num_threads=1)
    elif isinstance(data, Source):  # a data kind of a test's own (tests/data/test_fifth_kind)
        loader = Loader(data, BATCH, seed=7, num_threads=1)
    elif kind == "shards":
        loader = Loader(TarShards(data, shuffle_buffer=4), BATCH, seed=7, transform=tf,
                        num_threads=1)
    else:
        loader, width = TableLoader(data, BATCH, seed=7, features=["x"], label="id",
                                    num_threads=1), 1
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(width, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if joining:
        Path(folder, "joining").write_text("")
    ckpt = dask_ddp.Checkpointer(model, opt, loader=loader,  # a joiner joins here
                                 storage=Path(folder, "ckpt").as_uri())
    step = ckpt.restore().get("step", 0)
    victim, hold_at, hold_after, mode = (int(v) for v in
                                         Path(folder, "plan").read_text().split())
    smaller = 0
    with Path(folder, f"audit-{uid}-{os.getpid()}").open("a") as audit:
        while loader.epoch < EPOCHS:
            for x, y in loader:
                audit.write(f"b {loader.epoch} {step + 1} "
                            f"{','.join(str(int(v)) for v in y)}\n")
                audit.flush()
                loss = model(x.view(len(x), -1)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                world = dist.get_world_size()
                audit.write(f"s {step} {world} {time.time():.4f}\n")
                audit.flush()
                Path(folder, f"step{uid}").write_text(str(step))
                time.sleep(PAUSE)
                smaller += world < WORLD
                if uid == victim and step == hold_at:
                    _hold(_struck(mode, group, Path(folder, "struck")))
                elif hold_after and smaller == hold_after:
                    _hold(Path(folder, "go").exists)
            loader.set_epoch(loader.epoch + 1)
    return {"uid": uid, "world": dist.get_world_size(), "rank": dist.get_rank(),
            "step": step, "hash": _state_hash(model, opt)}


def _struck(mode: int, group: Any, struck: Path) -> Callable[[], bool]:
    """When the holding victim goes on: kill (0), at the strike (it is dead by then);
    retire (1), once asked to leave; kill-join (2), never: its worker's SIGKILL ends it
    a moment later, with the worker's template, and it must not step meanwhile."""
    if mode == 1:
        return lambda: bool(group.leaving)
    if mode == 2:
        return lambda: False
    return struck.exists


def _hold(until: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 120
    while not until() and time.monotonic() < deadline:
        time.sleep(0.01)


def _state_hash(model: Any, opt: Any) -> str:
    from live_util import state_hash

    return state_hash(model, opt)


# -- the data -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Images, tar shards and a Parquet table of N samples labelled by their ids."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dask_ddp.data import Table

    root = tmp_path_factory.mktemp("live-audit")
    images = root / "images"
    write_folder(file_putter(str(images)), ["a", "b", "c"], N // 3, sizes=((6, 6),))
    shards = root / "shards"
    shards.mkdir()
    per_shard = 10
    for s in range(N // per_shard):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(s * per_shard, (s + 1) * per_shard):
                for name, blob in ((f"{i:06d}.jpg", encode(photo(6, 6, i), "jpeg")),
                                   (f"{i:06d}.cls", str(i).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(blob)
                    tar.addfile(info, io.BytesIO(blob))
        (shards / f"shard-{s}.tar").write_bytes(buf.getvalue())
    ids = np.arange(N, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": ids.astype(np.float32)}),
                   str(root / "t.parquet"), row_group_size=10)
    return {"images": str(images),
            "shards": str(shards / f"shard-{{0..{N // per_shard - 1}}}.tar"),
            "table": Table.from_parquet(str(root / "t.parquet"))}


# -- a run ----------------------------------------------------------------------------------
@dataclass
class Run:
    seed: int
    scenario: str
    kind: str
    victim: int
    at_step: int      # the victim's step the strike waits for
    delay: float      # then this long (a random part of a step)
    hold_after: int   # kill-join: the survivors' steps in the smaller group before "go"


def plan(scenario: str, seed: int) -> Run:
    if scenario == "kill-join-rank0":  # rank 0's worker, whatever the seed says
        return dataclasses.replace(plan("kill-join", seed), victim=0)
    rng = random.Random(f"{scenario}-{seed}")
    steps = EPOCHS * N // (BATCH * WORLD)
    # kill-join: the kill in the first epoch, so the new rank joins well before the end.
    last = steps // 2 - 2 if scenario == "kill-join" else steps - 4
    return Run(seed, scenario, rng.choice(KINDS), rng.randrange(WORLD),
               rng.randint(2, last), rng.uniform(0.0, 0.06),
               rng.randint(1, 4) if scenario == "kill-join" else 0)


def _seeds() -> list[int]:
    base = int(os.environ.get("DASK_DDP_AUDIT_SEED", random.randrange(1 << 30)))
    return [base + i for i in range(RUNS)]


# Under make stress (beside its CPU hogs) also rank 0's worker every time: the README's
# fault-tolerance example at its worst, which a random victim reaches one run in three.
@pytest.mark.parametrize("scenario", ["kill", "retire", "kill-join",
                                      *(["kill-join-rank0"] if STRESS else [])])
def test_every_sample_once_after_a_live_change(client: Client, datasets: dict[str, Any],
                                               tmp_path: Path, scenario: str) -> None:
    failed: list[str] = []
    seeds = _seeds()
    for seed in seeds:
        run = plan(scenario, seed)
        out = tmp_path / str(seed)
        out.mkdir()
        t0 = time.monotonic()
        try:
            _full_size(client)
            job, struck_at = _strike(client, run, datasets[run.kind], out)
            first_step = _check(job, run, out, struck_at)
        except Exception as exc:  # the next seeds run too: the count is the result
            failed.append(f"audit seed {seed} (replay: DASK_DDP_AUDIT_SEED={seed} "
                          f"DASK_DDP_AUDIT_RUNS=1), {run}: {exc}\nthe cluster's record of "
                          f"workers leaving:\n{worker_fates(client)}")
            print(f"  {run}: FAILED: {str(exc)[:300]}", file=sys.stderr)  # noqa: T201
            continue
        print(f"  {run}: ok in {time.monotonic() - t0:.1f} s; the smaller group's first "  # noqa: T201
              f"step {first_step:.3f} s after the strike; load "
              f"{os.getloadavg()[0]:.1f}", file=sys.stderr)
    assert not failed, f"{len(failed)} of {len(seeds)} runs failed; the first: {failed[0]}"


def _full_size(client: Client) -> None:
    """A retired worker is gone for good: the cluster is scaled back before a run."""
    cluster: Any = client.cluster
    cluster.scale(WORLD)
    wait_until(lambda: None if len(cluster_info(client)["workers"]) == WORLD else
               f"{len(cluster_info(client)['workers'])} workers", 60,
               f"the cluster to be back to {WORLD} workers")


def _step(out: Path, uid: int) -> int:
    with contextlib.suppress(FileNotFoundError, ValueError):
        return int((out / f"step{uid}").read_text())
    return -1


def _strike(client: Client, run: Run, data: Any, out: Path) -> tuple[Any, float]:
    """Start the job, strike when the victim reached ``run.at_step`` (it holds two steps
    later until the strike was made, or it was asked to leave, so that a late strike
    still lands mid-run); the strike's time (``time.time()``)."""
    mode = ("kill", "retire", "kill-join").index(run.scenario)
    (out / "plan").write_text(f"{run.victim} {run.at_step + 2} {run.hold_after} {mode}")
    job = dask_ddp.submit(client, audit_train, run.kind, data, str(out), recovery="live",
                          min_workers=2, max_workers=WORLD, name=f"audit-{run.scenario}",
                          progress=False)

    def at_step() -> str | None:
        if job.done():
            job.result()  # its error: it ended before the strike
        now = _step(out, run.victim)
        return None if now >= run.at_step else f"rank {run.victim} at step {now}"

    wait_until(lambda: None if all((out / f"pid{r}").exists() for r in range(WORLD)) else
               "a rank without its pid file", 120, "every rank to start")
    pid = int((out / f"pid{run.victim}").read_text())
    worker = job.workers[run.victim]
    worker_pid = client.run(os.getpid, workers=[worker])[worker] \
        if run.scenario == "kill-join" else 0
    wait_until(at_step, 120, f"rank {run.victim} to reach step {run.at_step}")
    time.sleep(run.delay)
    struck_at = time.time()
    try:
        if run.scenario == "kill":
            os.kill(pid, signal.SIGKILL)
        elif run.scenario == "kill-join":
            os.kill(worker_pid, signal.SIGKILL)
        else:
            # As adapt() scales down: retire the worker, then drop it from the cluster's
            # spec (_full_size makes a new one for the next run).
            name = cluster_info(client)["workers"][worker]["name"]
            client.retire_workers([worker], close_workers=True)
            cluster: Any = client.cluster
            cluster.sync(cluster.scale_down, [name])
    finally:
        (out / "struck").write_text("")
    if run.scenario == "kill-join":
        wait_until(lambda: None if (out / "joining").exists() or job.done() else
                   "no joining rank yet", 120, "a rank to start joining")
        (out / "go").write_text("")
    return job, struck_at


@dataclass
class Audit:
    uid: int
    batches: list[tuple[int, int, list[int]]]   # (epoch, step, ids)
    steps: list[tuple[int, int, float]]          # (step, world size, time)


def _read_audits(out: Path) -> list[Audit]:
    audits = []
    for path in sorted(out.glob("audit-*")):
        audit = Audit(int(path.name.split("-")[1]), [], [])
        for line in path.read_text().splitlines():
            what, *rest = line.split()
            if what == "b" and len(rest) == 3:
                audit.batches.append((int(rest[0]), int(rest[1]),
                                      [int(v) for v in rest[2].split(",")]))
            elif what == "s" and len(rest) == 3:
                audit.steps.append((int(rest[0]), int(rest[1]), float(rest[2])))
        audits.append(audit)
    return audits


def _check(job: Any, run: Run, out: Path, struck_at: float) -> float:
    """The job's outcome, every id once per epoch; the seconds from the strike to the
    smaller group's first step."""
    values = job.result(timeout=180)
    assert len({v["hash"] for v in values}) == 1, values
    world = len(values)
    assert sorted(v["rank"] for v in values) == list(range(world)), values
    assert {v["world"] for v in values} == {world}, values
    gens = job.generations
    lost_at: dict[int, int] = {}
    for g in gens:
        for u in g.lost:
            lost_at.setdefault(u, g.step)
    assert set(lost_at) == {run.victim}, (run, gens)
    if run.scenario == "kill-join":
        assert any(g.joined for g in gens), f"no rank joined: {gens}"
        assert world == WORLD, values
    audits = _read_audits(out)
    if run.scenario == "retire":
        # A graceful leave, not a kill by its worker's exit; it drops no step: the leaver's
        # loop completed every step the group counted (its post-step code ran), and took
        # no further one.
        assert "left" in gens[0].cause, f"the retired rank did not leave gracefully: {gens}"
        taken = [s for a in audits if a.uid == run.victim for s, _, _ in a.steps]
        assert max(taken) == lost_at[run.victim], (
            f"the leaver took steps up to {max(taken)}, the group counted them up to "
            f"{lost_at[run.victim]}: {gens}")
    _check_exactly_once(audits, lost_at, gens)
    after = [t for a in audits for _, w, t in a.steps if w < WORLD and t >= struck_at]
    assert after, "the smaller group never stepped"
    return min(after) - struck_at


def _check_exactly_once(audits: list[Audit], lost_at: dict[int, int], gens: list[Any]
                        ) -> None:
    """Every id of each epoch once: a lost rank's batches count up to the step its group
    agreed on (the rest were dealt again); the padding repeats at most ``size - 1`` for
    each deal made in the epoch (N divides evenly over 3 and 2 ranks: no padding of the
    epoch's own shards)."""
    counted: dict[int, list[int]] = {e: [] for e in range(EPOCHS)}
    epoch_of: dict[int, int] = {}
    for a in audits:
        cut = lost_at.get(a.uid)
        for epoch, step, ids in a.batches:
            epoch_of.setdefault(step, epoch)
            if cut is None or step <= cut:
                counted[epoch] += ids
    for epoch, seen in counted.items():
        counts = Counter(seen)
        missing = sorted(set(range(N)) - set(counts))
        assert not missing, (f"epoch {epoch}: {len(missing)} ids never trained on: "
                             f"{missing}; generations {gens}")
        deals = [g.world_size - 1 for g in gens
                 if epoch in (epoch_of.get(g.step), epoch_of.get(g.step + 1))]
        repeats = {i: c for i, c in counts.items() if c > 1}
        assert sum(c - 1 for c in repeats.values()) <= sum(deals), (
            f"epoch {epoch}: ids trained on more than once {repeats} (padding at most "
            f"{sum(deals)}); generations {gens}")


@pytest.mark.parametrize("max_restarts", variants([0, 1], once=0))
def test_a_second_loss_before_the_cluster_heals(client: Client, datasets: dict[str, Any],
                                                tmp_path: Path, max_restarts: int) -> None:
    """Rank 0's worker is SIGKILLed, and a second worker before the first is back (their
    nannies restart both): one rank survives, fewer than ``min_workers=2``. The job says
    so (no restart left) or restarts whole once the workers are back and completes; either
    way the cluster heals to its size. (Both under ``make stress``, beside its CPU hogs;
    the error in ``make test``.)"""
    _full_size(client)
    out = tmp_path / "run"
    out.mkdir()
    run = Run(0, "kill-join", "images", victim=0, at_step=3, delay=0.0, hold_after=0)
    (out / "plan").write_text(f"{run.victim} {run.at_step + 2} 0 2")  # rank 0 holds
    job = dask_ddp.submit(client, audit_train, run.kind, datasets[run.kind], str(out),
                          recovery="live", min_workers=2, max_workers=WORLD,
                          max_restarts=max_restarts, name="audit-second-loss",
                          progress=False)
    wait_until(lambda: None if all((out / f"pid{r}").exists() for r in range(WORLD)) else
               "a rank without its pid file", 120, "every rank to start")
    workers = job.workers[:2]  # rank 0's, then rank 1's
    pids = client.run(os.getpid, workers=workers)
    wait_until(lambda: None if _step(out, 0) >= run.at_step else "rank 0 not there yet",
               120, f"rank 0 to reach step {run.at_step}")
    for w in workers:
        os.kill(pids[w], signal.SIGKILL)
    (out / "struck").write_text("")
    if max_restarts == 0:
        with pytest.raises(Exception, match="min_workers=2") as failed:
            job.result(timeout=180)
        assert "fewer than min_workers" in str(failed.value), failed.value
    else:
        (out / "plan").write_text("-1 0 0 0")  # the restarted attempt strikes no one
        values = job.result(timeout=240)
        assert len({v["hash"] for v in values}) == 1 and len(values) >= 2, values
    wait_until(lambda: None if len(cluster_info(client)["workers"]) == WORLD else
               f"{len(cluster_info(client)['workers'])} workers", 120,
               f"the cluster to heal to {WORLD} workers")
