"""submit(recovery="live") growing back: a worker that comes (``cluster.scale()``, a
nanny's restart of a killed worker) while the group is below max_workers gets a rank
that joins at a step boundary; real LocalCluster, real gloo, real kills. Every rank ends
with identical state (model, optimizer, LR scheduler, torch's generator) and every sample
of the epoch is trained on once (padding aside)."""

from __future__ import annotations

import os
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

import dask_ddp
import live_util
from cluster_util import client_fixture, local_cluster
from dask_ddp._cluster import cluster_info
from images import file_putter, write_folder
from waits import wait_until

pytestmark = pytest.mark.timeout(300)

client = client_fixture(2)


def _file(folder: Path, name: str, job: Any) -> str | None:
    if job.done():
        job.result()  # raises the job's error: it ended first
    return None if (folder / name).exists() else f"no {name} in {folder}"


def _at_step(folder: Path, uid: int, step: int, job: Any) -> str | None:
    missing = _file(folder, f"step{uid}", job)
    if missing is not None:
        return missing
    now = int((folder / f"step{uid}").read_text() or -1)
    return None if now >= step else f"rank {uid} at step {now}"


def _same_state(values: list[dict[str, Any]], world: int) -> None:
    assert len(values) == world, values
    for key in ("hash", "lr", "rng", "step"):
        assert len({repr(v[key]) for v in values}) == 1, (key, values)
    assert sorted(v["rank"] for v in values) == list(range(world)), values
    assert {v["world"] for v in values} == {world}, values


@pytest.mark.parametrize(("data", "then_lose"), [("images", False), ("table", False),
                                               ("images", True)])
def test_scaled_up_worker_joins(client: Client, tmp_path: Path, data: str,
                                then_lose: bool) -> None:
    """Two ranks, max_workers=3; the cluster grows by one worker mid-epoch: a third rank
    joins, takes the group's state, the epoch's unread samples (a table's rows) are dealt
    over three, and the next epoch is read in three shards. ``then_lose``: later in the
    same epoch rank 0's process is killed: its share of the join's deal is dealt over
    the two left, and the next epoch is read in two shards. The cluster is scaled back
    to two workers first."""
    if len(client.cluster.workers) != 2:
        client.cluster.scale(2)
        wait_until(lambda: None if len(cluster_info(client)["workers"]) == 2 else
                   f"{len(cluster_info(client)['workers'])} workers", 60,
                   "the cluster to scale back to 2 workers")
    n, out = 240, tmp_path / "out"
    out.mkdir()
    if data == "images":
        root: Any = str(tmp_path / "images")
        write_folder(file_putter(root), ["a", "b", "c"], n // 3, sizes=((10, 10),))
    else:
        root = live_util.id_frame(client, n, 8)
    job = dask_ddp.submit(client, live_util.live_train_join, root, n, str(out), 5, 2,
                          recovery="live", min_workers=2, max_workers=3,
                          storage=(tmp_path / "ckpt").as_uri(), progress=False)
    assert job.world_size == 2
    for uid in (0, 1):
        wait_until(lambda u=uid: _at_step(out, u, 5, job), 120, f"rank {uid} at step 5")
    client.cluster.scale(3)
    wait_until(lambda: _file(out, "pid2", job), 120, "the joining rank to start")
    (out / "go").write_text("")
    if then_lose:
        wait_until(lambda: _at_step(out, 0, 15, job), 120, "rank 0 at step 15")
        os.kill(int((out / "pid0").read_text()), 9)
    values = job.result(timeout=180)
    _same_state(values, 2 if then_lose else 3)
    gen, *more = job.generations
    assert gen.joined == (2,) and gen.lost == () and gen.world_size == 3, gen
    assert gen.cause == "a rank joined", gen
    counted = None
    if then_lose:
        (loss,) = more
        assert loss.lost == (0,) and loss.world_size == 2, loss
        counted = loss.step  # rank 0's steps after it did not count
    # Every sample of each epoch once: in the first, each rank's batches before the join
    # (its own shard), then the unread rest of both shards dealt over the three ranks
    # (and rank 0's unread share of them over the two left); the second in three shards
    # (two).
    seen: dict[int, list[int]] = {0: [], 1: []}
    for uid in range(3):
        for line in (out / f"audit{uid}").read_text().splitlines():
            epoch, step, labels = line.split()
            if uid != 0 or counted is None or int(step) <= counted:
                seen[int(epoch)] += [int(v) for v in labels.split(",")]
    for epoch, labels in seen.items():
        counts = Counter(labels)
        assert sorted(counts) == list(range(n)), (epoch, sorted(set(range(n)) - set(counts)))
        pads = (3 - 1) + (2 - 1 if then_lose else 0) if epoch == 0 else len(values) - 1
        assert sum(c - 1 for c in counts.values()) <= pads, (epoch, counts)


@pytest.mark.parametrize("hold", [10, 45])
def test_killed_worker_restarted_by_its_nanny_rejoins(client: Client, tmp_path: Path,
                                                      hold: int) -> None:
    """Three ranks on 240 images (own shards of 40 batches), max_workers=3; rank 2's
    worker is killed (the group shrinks to two, rank 2's unread samples dealt to them)
    and its nanny starts it again under a new address: a rank joins there in the same
    epoch, at step ``hold`` of the others (inside their own shards, or inside the lost
    rank's deal): everything unread is dealt over the three. Every sample once; nothing
    is read from storage."""
    if len(client.cluster.workers) != 3:
        client.cluster.scale(3)  # the module's cluster starts with 2
    client.wait_for_workers(3, timeout=60)
    n, out = 240, tmp_path / "out"
    out.mkdir()
    root = str(tmp_path / "images")
    write_folder(file_putter(root), ["a", "b", "c"], n // 3, sizes=((10, 10),))
    job = dask_ddp.submit(client, live_util.live_train_join, root, n, str(out), hold,
                          recovery="live", min_workers=2, max_workers=3,
                          storage=(tmp_path / "ckpt").as_uri(), progress=False)
    wait_until(lambda: None if job.world_size == 3 else f"{job.world_size} ranks", 60,
               "the job to take the three workers")
    for uid in range(3):
        wait_until(lambda u=uid: _at_step(out, u, 10, job), 120, f"rank {uid} at step 10")
    victim = job.workers[2]
    pids = client.run(os.getpid, workers=[victim])
    os.kill(pids[victim], 9)
    wait_until(lambda: _file(out, "pid3", job), 120, "a rank to start on the restarted worker")
    (out / "go").write_text("")
    values = job.result(timeout=180)
    _same_state(values, 3)
    assert sorted(v["uid"] for v in values) == [0, 1, 3], values
    shrink, grow = job.generations
    assert shrink.lost == (2,) and shrink.world_size == 2, shrink
    assert grow.joined == (3,) and grow.world_size == 3 and grow.step >= shrink.step, grow
    assert (grow.step > 40) == (hold > 40), grow  # inside the deal, or the own shards
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
    # Epoch 0: each rank's own batches, rank 2's up to the loss's agreed step, the lost
    # rank's unread samples dealt over two, then everything unread over three (the
    # joiner read some of them: it joined within the epoch).
    seen: list[int] = []
    joiner_epochs = set()
    for uid in (0, 1, 2, 3):
        for line in (out / f"audit{uid}").read_text().splitlines():
            epoch, step, labels = line.split()
            assert epoch == "0", line
            if uid != 2 or int(step) <= shrink.step:
                seen += [int(v) for v in labels.split(",")]
            if uid == 3:
                joiner_epochs.add(int(epoch))
    assert joiner_epochs == {0}, "the joiner read nothing of the epoch it joined in"
    counts = Counter(seen)
    assert sorted(counts) == list(range(n)), sorted(set(range(n)) - set(counts))
    assert sum(c - 1 for c in counts.values()) <= (3 - 1) + (2 - 1) + (3 - 1), counts


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive free ports on 127.0.0.1."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports in 100 tries")


@pytest.mark.dask
def test_worker_restarted_at_its_address_rejoins(tmp_path: Path) -> None:
    """Workers on fixed ports (as on Kubernetes): rank 2's worker is killed and its nanny
    starts it again at the same address, a new worker there: a rank joins on it (the
    instance whose rank was killed would not take one)."""
    base = _free_ports(3)
    out = tmp_path / "out"
    out.mkdir()
    # A cluster of its own: its workers' fixed ports are under test.
    with local_cluster(3, worker_port=f"{base}:{base + 2}") as cluster, \
            Client(cluster) as c:
        c.wait_for_workers(3, timeout=60)
        job = dask_ddp.submit(c, live_util.live_train_join, None, 60, str(out), 10,
                              recovery="live", min_workers=2, max_workers=3,
                              storage=(tmp_path / "ckpt").as_uri(), progress=False)
        for uid in range(3):
            wait_until(lambda u=uid: _at_step(out, u, 10, job), 120, f"rank {uid} at step 10")
        victim = job.workers[2]
        pids = c.run(os.getpid, workers=[victim])
        os.kill(pids[victim], 9)
        wait_until(lambda: _file(out, "pid3", job), 120,
                   "a rank to start on the worker restarted at its address")
        (out / "go").write_text("")
        values = job.result(timeout=180)
        _same_state(values, 3)
        assert sorted(v["uid"] for v in values) == [0, 1, 3], values
        assert job.workers[3] == victim
        shrink, grow = job.generations
        assert shrink.lost == (2,) and grow.joined == (3,) and grow.world_size == 3, grow
