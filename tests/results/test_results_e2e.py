"""Results, metrics and checkpoints through the real launcher (dispatch.run / submit).

Real LocalCluster worker processes, real rank processes with gloo DDP, real files.
"""

from __future__ import annotations

import json
import pickle
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from distributed import Client

import dask_ddp
from cluster_util import client_fixture
from dask_ddp import dispatch, results
from dask_ddp.checkpoint import load_checkpoint
from dask_ddp.plot import main as plot_main

pytestmark = [pytest.mark.dask, pytest.mark.slow, pytest.mark.timeout(300)]


client = client_fixture(2, threads_per_worker=2)


def make_seed_training(rh: results.DaskResultsHandler) -> Callable[..., None]:
    """The seed tutorial's training loop, shrunk: a real DDP model on random data."""

    def run_transfer_learning(n_epochs: int, n_batches: int, base_lr: float) -> None:
        import torch
        import torch.distributed as dist
        from torch import nn, optim
        from torch.nn.parallel import DistributedDataParallel as DDP

        worker_rank = int(dist.get_rank())
        torch.manual_seed(worker_rank)
        model = DDP(nn.Linear(8, 3))
        criterion = nn.CrossEntropyLoss()
        optimizer = optim.SGD(model.parameters(), lr=base_lr * dist.get_world_size())
        x, y = torch.randn(n_batches * 16, 8), torch.randint(0, 3, (n_batches * 16,))
        count = t_count = 0
        for epoch in range(n_epochs):
            model.train()
            for i in range(n_batches):
                inputs, labels = x[i * 16 : (i + 1) * 16], y[i * 16 : (i + 1) * 16]
                outputs = model(inputs)
                _, preds = torch.max(outputs, 1)
                loss = criterion(outputs, labels)
                correct = (preds == labels).sum().item()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                count += 1
                current_lr = optimizer.param_groups[0]["lr"]
                rh.submit_result(
                    f"worker/{worker_rank}.json",
                    json.dumps(
                        {
                            "loss": loss.item(),
                            "learning_rate": current_lr,
                            "correct": correct,
                            "epoch": epoch,
                            "count": count,
                            "worker": worker_rank,
                            "sample": "train",
                        }
                    ),
                )
                if (count % 10) == 0 and worker_rank == 0:
                    rh.submit_result(f"checkpoint-{count}.pkl", pickle.dumps(model.state_dict()))
            with torch.no_grad():
                model.eval()
                for i in range(n_batches // 2):
                    outputs_t = model(x[i * 16 : (i + 1) * 16])
                    loss_t = criterion(outputs_t, y[i * 16 : (i + 1) * 16])
                    correct_t = (outputs_t.argmax(1) == y[i * 16 : (i + 1) * 16]).sum().item()
                    t_count += 1
                    rh.submit_result(
                        f"worker/{worker_rank}.json",
                        json.dumps(
                            {
                                "loss": loss_t.item(),
                                "correct": correct_t,
                                "epoch": epoch,
                                "count": t_count,
                                "worker": worker_rank,
                                "sample": "eval",
                            }
                        ),
                    )

    return run_transfer_learning


def test_seed_results_flow_then_plot(client: Client, tmp_path: Path) -> None:
    key = uuid.uuid4().hex
    rh = results.DaskResultsHandler(key)
    futures = dispatch.run(client, make_seed_training(rh), n_epochs=2, n_batches=20, base_lr=0.01)
    out = tmp_path / "pt8_2wk"
    rh.process_results(str(out), futures, raise_errors=False)
    for rank in range(2):
        rows = [json.loads(x) for x in (out / "worker" / f"{rank}.json").read_text().splitlines()]
        train = [r["count"] for r in rows if r["sample"] == "train"]
        evals = [r["count"] for r in rows if r["sample"] == "eval"]
        assert train == list(range(1, 41)) and evals == list(range(1, 21))
    state = pickle.loads((out / "checkpoint-40.pkl").read_bytes())
    assert set(state) == {"module.weight", "module.bias"}
    png = tmp_path / "figure.png"
    assert plot_main([str(out), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def reporting_training(steps: int, big: int) -> int:
    import os

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    rh = results.DaskResultsHandler(os.environ["KEY"])
    if big:  # above dask-ddp.results.inline-max: goes through the job's storage
        rh.submit_result(f"big-{rank}.bin", bytes([rank]) * big)
    for step in range(steps):
        t = torch.tensor([float(step)])
        dist.all_reduce(t)
        dask_ddp.report({"loss": 1.0 / (step + 1), "sum": t.item(), "epoch": step // 50}, step)
        if step % 100 == 99:  # the last one (40 MB) is the rank's very last action
            big = torch.ones(10_000_000) if step == steps - 1 else torch.ones(1)
            dask_ddp.save_checkpoint({"model": model.state_dict(), "step": step, "big": big}, step)
    return rank


def test_job_metrics_jsonl_and_checkpoints(client: Client, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    key = uuid.uuid4().hex
    rh = results.DaskResultsHandler(key)
    job = dask_ddp.submit(
        client,
        reporting_training,
        300,
        5_000_000,
        env={"KEY": key},
        output_dir=tmp_path / "run",
        storage=url,
        progress=True,
    )
    seen = list(job.metrics())
    rh.process_results(tmp_path / "res", job.futures)
    assert job.result() == [0, 1]
    for rank in range(2):
        steps = [r["step"] for r in seen if r["rank"] == rank]
        assert steps == list(range(300))
        assert (tmp_path / "res" / f"big-{rank}.bin").read_bytes() == bytes([rank]) * 5_000_000
    assert all(r["sum"] == 2 * r["step"] for r in seen)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert sorted((json.loads(x)["rank"], json.loads(x)["step"]) for x in lines) == sorted(
        (r["rank"], r["step"]) for r in seen
    )
    ckpt = load_checkpoint(url)
    assert ckpt["step"] == 299 and set(ckpt["model"]) == {"weight", "bias"}
    assert ckpt["big"].numel() == 10_000_000
    from dask_ddp import storage

    assert not storage.open(url).list("_results/")  # stored results are cleaned up
    png = tmp_path / "m.png"
    assert plot_main([str(tmp_path / "run"), str(tmp_path / "run"), "-o", str(png)]) == 0
    assert png.stat().st_size > 10_000


def failing_after_report(n: int) -> None:
    import os

    import torch.distributed as dist

    for i in range(n):
        dask_ddp.report({"loss": float(i)}, step=i)
    if dist.get_rank() == 1:
        os._exit(7)  # no cleanup at all: the records must still arrive
    dist.barrier()


def test_rank_crash_keeps_its_records(client: Client) -> None:
    job = dask_ddp.submit(client, failing_after_report, 500, progress=False)
    with pytest.raises(dask_ddp.JobError):
        job.result()
    recs = list(job.metrics())
    assert [r["step"] for r in recs if r["rank"] == 1] == list(range(500))


def hostile_stored_records(key: str, unused: str, other_url: str) -> int:
    """A rank that sends stored-result records pointing outside its job's own results:
    at another file of the job's storage, and at another storage; then one good result."""
    import os

    import torch.distributed as dist

    from dask_ddp._channel.rank_writer import write
    from dask_ddp._channel.records import StoredRef, encode_stored

    rank = dist.get_rank()
    rh = results.DaskResultsHandler(key)
    if rank == 0:
        storage = os.environ["DASK_DDP_STORAGE"]
        write(rh.topic, encode_stored(StoredRef("stolen.bin", storage, "victim.txt", "b")))
        job = os.environ["DASK_DDP_JOB_ID"]
        write(rh.topic, encode_stored(StoredRef("elsewhere.bin", other_url,
                                                f"_results/{job}/{'0' * 32}", "b")))
    rh.submit_result(f"good-{rank}.txt", f"rank {rank}")
    return rank


def test_stored_results_are_confined_to_the_jobs_own_prefix(client: Client,
                                                            tmp_path: Path) -> None:
    """A stored-result record made the client copy, then delete, any file it could reach
    (the key and URL were taken from the record). Now a stored result comes only from the
    storage the job was launched with, under its own ``_results/<job id>/``: the victim
    files stay, the other records of every rank are written, and the error comes last."""
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    (store_dir / "victim.txt").write_text("precious")
    other = tmp_path / "other"
    (other / "_results").mkdir(parents=True)
    key = uuid.uuid4().hex
    rh = results.DaskResultsHandler(key)
    job = dask_ddp.submit(client, hostile_stored_records, key, "", other.as_uri(),
                          storage=store_dir.as_uri(), progress=False)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="outside its job's _results"):
        rh.process_results(out, job.futures)
    assert job.result() == [0, 1]
    assert (store_dir / "victim.txt").read_text() == "precious"
    assert sorted(p.name for p in out.iterdir()) == ["good-0.txt", "good-1.txt"]
