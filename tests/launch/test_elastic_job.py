"""Restarts and elastic jobs on a real LocalCluster: SIGKILLed workers, raising ranks,
retired workers, and exact resume from checkpoints (weights bitwise equal)."""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from distributed import Client

import dask_ddp
from cluster_util import wait_no_rank_processes
from elastic_util import collectives_until, raise_with_attempt, resumable_train
from images import file_putter, write_folder
from waits import wait_until

TIMEOUT = pytest.mark.timeout(150)


def wait_marks(folder: Path, names: list[str], timeout: float = 60.0) -> float:
    """Wait until every mark file exists; return when (monotonic)."""
    wait_until(lambda: [n for n in names if not (folder / n).exists()], timeout,
               f"marks missing in {folder}", interval=0.02)
    return time.monotonic()


def kill_worker(client: Client, addr: str) -> None:
    pid = client.run(os.getpid, workers=[addr])[addr]
    os.kill(pid, signal.SIGKILL)


def assert_settled(client: Client, job: dask_ddp.ElasticJob) -> None:
    """No future of any attempt pending, no rank process of this cluster left."""
    for attempt in job.attempts:
        assert all(f.status in ("finished", "error", "cancelled", "lost")
                   for f in attempt.futures), [f.status for f in attempt.futures]
    wait_no_rank_processes(client.scheduler.address, 30)


# -- argument checks and the resume helpers, in this process ------------------------------

@pytest.mark.dask
def test_arguments_are_validated(lease: Any) -> None:
    with lease(1) as client:
        for kwargs, name in (({"max_restarts": -1}, "max_restarts"),
                             ({"min_workers": 0}, "min_workers"),
                             ({"min_workers": 2, "max_workers": 1}, "max_workers"),
                             ({"min_workers": 1, "n_workers": 1}, "n_workers"),
                             ({"max_restarts": 1, "elastic_timeout": -1}, "elastic_timeout")):
            with pytest.raises(ValueError, match=name):
                dask_ddp.submit(client, raise_with_attempt, **kwargs)  # type: ignore[arg-type]
        t0 = time.monotonic()
        with pytest.raises(dask_ddp.GangStartError, match="at least 2 workers"):
            dask_ddp.submit(client, raise_with_attempt, min_workers=2, elastic_timeout=0.5)
        assert time.monotonic() - t0 < 30  # elastic_timeout=0.5 was honoured (default 60 s)


def test_training_state_round_trip_restores_every_rng(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    torch.manual_seed(5)
    np.random.seed(6)
    random.seed(7)
    ckpt = dask_ddp.Checkpointer(model, opt, storage=f"file://{tmp_path}")
    assert ckpt.restore() == {} and ckpt.restored_step is None
    ckpt.save(3, note="x").result(30)
    want = (torch.rand(4), np.random.rand(4), [random.random() for _ in range(4)])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    assert ckpt.restore() == {"step": 3, "note": "x"} and ckpt.restored_step == 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    got = (torch.rand(4), np.random.rand(4), [random.random() for _ in range(4)])
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1])
    assert want[2] == got[2]
    with pytest.raises(ValueError, match="training_state"):
        dask_ddp.restore_training_state({"model": {}}, model)


def test_other_world_size_keeps_the_epoch_fraction(tmp_path: Path) -> None:
    from dask_ddp.data import ImageFolder, Loader
    from dask_ddp.data import transforms as T

    write_folder(file_putter(str(tmp_path)), ("a", "b"), 8, sizes=((16, 16),))
    tf = T.Compose([T.Resize(8), T.CenterCrop(8), T.ToTensor()])
    ds = ImageFolder(tmp_path)
    two = Loader(ds, 2, transform=tf, rank=0, world_size=2, num_threads=1)  # 4 batches
    two.set_epoch(3)
    it = iter(two)
    next(it), next(it)
    model = torch.nn.Linear(1, 1)
    state = dask_ddp.training_state(model, loader=two)
    state["ranks"] = state["ranks"] * 2  # as gathered from the 2 ranks
    one = Loader(ds, 2, transform=tf, rank=0, world_size=1, num_threads=1)  # 8 batches
    dask_ddp.restore_training_state(state, model, loader=one)
    one.set_epoch(3)  # the restored epoch: keeps the position
    assert one.state_dict()["batch"] == 4 and len(list(one)) == 4
    two.close()
    one.close()


# -- the launcher restarts --------------------------------------------------------------

@TIMEOUT
@pytest.mark.dask
@pytest.mark.slow
def test_sigkill_mid_epoch_resumes_bitwise(tmp_path: Path, lease: Any) -> None:
    images = tmp_path / "images"
    write_folder(file_putter(str(images)), ("a", "b", "c"), 8, sizes=((20, 16), (16, 24)))
    marks = tmp_path / "marks"
    marks.mkdir()
    # 24 images, 2 ranks, batches of 4: 3 steps an epoch; 12 steps = 4 epochs.
    args = (str(images), 12, 2)
    with lease(2) as client:
        ref = dask_ddp.submit(client, resumable_train, *args, None, 0.0, progress=False,
                              storage=f"file://{tmp_path}/ref").result(timeout=90)
        job = dask_ddp.submit(client, resumable_train, *args, str(marks), 0.4,
                              progress=False, storage=f"file://{tmp_path}/killed",
                              max_restarts=1)
        assert isinstance(job, dask_ddp.ElasticJob)
        victim = job.workers[1]
        # Step 5 is mid-epoch (epoch 1, batch 2 of 3); the step-4 checkpoint is mid-epoch.
        wait_marks(marks, ["step-a0-r0-s5", "step-a0-r1-s5"])
        kill_worker(client, victim)
        t_kill = time.monotonic()
        back = wait_marks(marks, ["start-a1-r0", "start-a1-r1"])
        out = job.result(timeout=90)
        assert back - t_kill < 90, f"ranks running again {back - t_kill:.1f}s after the kill"
        assert len(job.restarts) == 1 and len(job.attempts) == 2
        r = job.restarts[0]
        assert r.attempt == 0 and r.rank == 1 and r.worker == victim and r.kind == "lost"
        assert victim in r.reason
        assert [o["restart"] for o in out] == [1, 1] and [o["world"] for o in out] == [2, 2]
        # Resumed from a mid-epoch checkpoint (step 4 = epoch 1, batch 1; step 2 if the
        # step-4 upload had not completed), not from scratch.
        assert out[0]["resumed_at"] in (2, 4)
        assert 0 < out[0]["resumed_batch"] < 3
        assert not (marks / "step-a1-r0-s1").exists()
        for o in out:
            assert o["epoch"] == ref[0]["epoch"]
            for k, v in ref[0]["weights"].items():
                assert torch.equal(o["weights"][k], v), f"{k} differs from the uninterrupted run"
        assert_settled(client, job)


@TIMEOUT
@pytest.mark.dask
@pytest.mark.slow
def test_rank_raising_twice_reports_both_attempts(lease: Any) -> None:
    with lease(2) as client:
        job = dask_ddp.submit(client, raise_with_attempt, progress=False, max_restarts=1)
        with pytest.raises(dask_ddp.RankFailedError) as info:
            job.result(timeout=90)
        err = info.value
        assert err.rank == 1 and isinstance(err.__cause__, ValueError)
        assert "bad batch in attempt 1" in str(err)
        assert [a.attempt for a in err.attempts] == [0, 1]
        assert "bad batch in attempt 0" in err.attempts[0].reason
        assert "bad batch in attempt 1" in err.attempts[1].reason
        assert all(a.rank == 1 for a in err.attempts)
        assert "attempt 0" in str(err) and "earlier attempts" in str(err)
        assert len(job.restarts) == 1 and len(job.attempts) == 2
        assert_settled(client, job)


@TIMEOUT
@pytest.mark.dask
@pytest.mark.slow
def test_retired_worker_continues_smaller(tmp_path: Path, lease: Any) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    with lease(2) as client:
        job = dask_ddp.submit(client, collectives_until, 600.0, 0.5, 1, str(marks),
                              progress=False, max_restarts=1, min_workers=1, max_workers=2)
        assert job.world_size == 2
        wait_marks(marks, ["start-a0-r0", "start-a0-r1"])
        gone = job.workers[1]
        client.retire_workers([gone], close_workers=True, remove=True)
        out = job.result(timeout=90)
        assert [o["world"] for o in out] == [1] and out[0]["restart"] == 1
        assert job.world_size == 1 and gone not in job.workers
        assert len(job.restarts) == 1 and job.restarts[0].worker == gone
        assert_settled(client, job)


@TIMEOUT
@pytest.mark.dask
@pytest.mark.slow
def test_repeated_kills_leave_nothing_behind(tmp_path: Path, lease: Any) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    with lease(2) as client:
        job = dask_ddp.submit(client, collectives_until, 600.0, 0.5, 2, str(marks),
                              progress=False, max_restarts=3, output_dir=tmp_path / "out")
        metrics = tmp_path / "out" / "metrics.jsonl"
        for attempt in (0, 1):
            wait_marks(marks, [f"start-a{attempt}-r0", f"start-a{attempt}-r1"])
            # A record still in its worker's pipe dies with the worker: kill only once this
            # attempt's record has reached the client.
            wait_until(lambda a=attempt: not metrics.exists() or len(
                metrics.read_text().splitlines()) <= a, 60,
                f"attempt {attempt}'s metric record not in {metrics}")
            kill_worker(client, job.workers[attempt % 2])
        out = job.result(timeout=90)
        assert [o["restart"] for o in out] == [2, 2]
        assert [r.attempt for r in job.restarts] == [0, 1]
        assert all(r.kind == "lost" for r in job.restarts)
        # Every attempt's metric records, each once, through one metrics.jsonl.
        records = list(job.metrics())
        assert [r["attempt"] for r in records] == [0, 1, 2]
        lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 3
        assert_settled(client, job)
        # A cancelled elastic job starts no new attempt and leaves nothing either.
        marks2 = tmp_path / "marks2"
        marks2.mkdir()
        job2 = dask_ddp.submit(client, collectives_until, 600.0, 600.0, 9, str(marks2),
                               progress=False, max_restarts=2)
        wait_marks(marks2, [f"start-a0-r{r}" for r in (0, 1)])
        job2.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            job2.result(timeout=60)
        assert len(job2.attempts) == 1
        assert_settled(client, job2)
