"""The examples end to end, as a user runs them: real subprocesses, real clusters, real DDP.

- ``examples/custom_dataset.py --quick``: a LocalCluster of 2 worker processes, the
  example's own ``Dataset`` read by ``DataLoader(num_workers=2)`` workers inside the ranks;
  it must reach its held-out R², report its metrics, checkpoint, and a second run with
  ``--resume`` must train no further epochs and evaluate the restored model the same.
- ``examples/train_script.py``: the same unchanged script through the real ``dask-ddp run``
  command (``python -m dask_ddp``) and under ``torchrun``; both launches must write the
  same result (the all-reduced metrics agree).
- ``examples/resnet_gpu.py``: its CPU path, one rank, 3 steps of 32-pixel images.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from examples_util import EXAMPLES, TORCHRUN, read_jsonl, run

pytestmark = [pytest.mark.slow, pytest.mark.dask, pytest.mark.timeout(400)]


# --- examples/custom_dataset.py -------------------------------------------------------------

def test_custom_dataset_reaches_r2_reports_and_resumes(tmp_path: Path, lease: Any) -> None:
    out = tmp_path / "custom"
    cmd = [sys.executable, str(EXAMPLES / "custom_dataset.py"), "--quick", "--out", str(out)]
    run(cmd, cwd=tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    ranks = summary["ranks"]
    # job.result(): one dict per rank, in rank order.
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 for r in ranks)
    assert summary["epochs"] == 6 and summary["r2"] >= 0.9, summary
    # The R² is all-reduced: every rank computed the same value.
    assert ranks[0]["r2"] == ranks[1]["r2"]
    steps = 6 * math.ceil(6000 / 2 / 64)  # epochs x batches of one rank's half of train.csv
    for r in ranks:
        assert (r["start_epoch"], r["epochs_run"], r["steps"]) == (0, 6, steps), r
        # DataLoader(num_workers=2) for train and for valid: worker processes of the rank.
        assert r["loader_processes"] >= 2, r

    # The example's own Dataset read the CSV files it wrote.
    header = (out / "data" / "train.csv").read_text().split("\n", 1)[0]
    assert header == "x0,x1,x2,x3,x4,x5,x6,x7,y"

    # report(): every training step of both ranks and one validation record per epoch.
    records = read_jsonl(out / "run" / "metrics.jsonl")
    train_recs = [m for m in records if m.get("sample") == "train"]
    valid_recs = [m for m in records if m.get("sample") == "valid"]
    assert len(train_recs) == 2 * steps
    assert sorted((m["rank"], m["epoch"]) for m in valid_recs) == [
        (rank, e) for rank in (0, 1) for e in range(6)]
    curve = [m["r2"] for m in valid_recs if m["rank"] == 0]
    assert curve[-1] == summary["r2"] and curve[-1] > curve[0]

    # save_checkpoint(): rank 0 saved every epoch; the newest 3 are kept.
    saved = sorted(p.name for p in (out / "checkpoints" / "checkpoints").glob("*.json"))
    assert saved == [f"step-{e:012d}.json" for e in (3, 4, 5)]

    # --resume: load_checkpoint() returns the finished run's last epoch; nothing to train,
    # and the restored model evaluates to the same R². On a running cluster (--scheduler,
    # the example's other way to run; the run above started its own).
    with lease(2) as client:
        run([*cmd, "--resume", "--scheduler", client.scheduler.address], cwd=tmp_path)
    resumed = json.loads((out / "summary.json").read_text())
    for r in resumed["ranks"]:
        assert (r["start_epoch"], r["epochs_run"], r["steps"]) == (6, 0, 0), r
    assert resumed["r2"] == pytest.approx(summary["r2"], abs=1e-9)
    again = read_jsonl(out / "run" / "metrics.jsonl")
    assert len([m for m in again if m.get("sample") == "train"]) == 2 * steps


# --- examples/train_script.py ---------------------------------------------------------------

RESULT_KEYS = {"world_size", "backend", "epochs", "seed", "history", "loss", "accuracy",
               "eval_accuracy", "seconds"}


def check_result(result: dict[str, Any], epochs: int) -> None:
    """The result JSON's shape, and a model that learned."""
    assert set(result) == RESULT_KEYS
    assert (result["world_size"], result["backend"], result["epochs"]) == (2, "gloo", epochs)
    assert [h["epoch"] for h in result["history"]] == list(range(epochs))
    assert result["history"][-1]["loss"] < result["history"][0]["loss"]
    assert result["eval_accuracy"] >= 0.85, result


@pytest.fixture(scope="module")
def dask_ddp_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """train_script.py through the real ``dask-ddp run`` command, a LocalCluster of 2."""
    work = tmp_path_factory.mktemp("script-dask")
    # A relative --out: the ranks start in the directory the command ran in.
    proc = run([sys.executable, "-m", "dask_ddp", "run", "--n-workers", "2",
                str(EXAMPLES / "train_script.py"), "--epochs", "3", "--out", "result.json"],
               cwd=work)
    # Each rank's output reaches the terminal, prefixed with its rank.
    assert "[rank 0]" in proc.stderr and "done: 2 ranks (gloo), 3 epochs" in proc.stderr
    result = json.loads((work / "result.json").read_text())
    return dict(result)


def test_train_script_under_dask_ddp_run(dask_ddp_result: dict[str, Any]) -> None:
    check_result(dask_ddp_result, epochs=3)


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not in this environment")
def test_train_script_same_result_under_torchrun(dask_ddp_result: dict[str, Any],
                                                 tmp_path: Path) -> None:
    run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2",
         str(EXAMPLES / "train_script.py"), "--epochs", "3", "--out", "result.json"],
        cwd=tmp_path)
    result = json.loads((tmp_path / "result.json").read_text())
    check_result(result, epochs=3)
    # The same script, data, seed and world size: the same all-reduced metrics.
    for a, b in zip(result["history"], dask_ddp_result["history"], strict=True):
        assert a["accuracy"] == b["accuracy"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert result["eval_accuracy"] == dask_ddp_result["eval_accuracy"]


# --- examples/resnet_gpu.py -----------------------------------------------------------------

def test_resnet_example_runs_on_the_cpu(tmp_path: Path) -> None:
    """The GPU example's CPU path, as small as it goes: one rank, tiny images, 3 steps; its
    loss tensors reach metrics.jsonl through report() without .item()."""
    out = tmp_path / "resnet"
    run([sys.executable, str(EXAMPLES / "resnet_gpu.py"), "--n-workers", "1", "--steps", "3",
         "--batch-size", "4", "--image-size", "32", "--out", str(out)], cwd=tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    [rank] = summary["ranks"]
    assert (rank["device"], rank["steps"]) == ("cpu", 3)
    losses = [m["loss"] for m in read_jsonl(out / "metrics.jsonl")]
    assert len(losses) == 3 and all(isinstance(x, float) and x > 0 for x in losses)
    assert losses[0] == pytest.approx(rank["first_loss"])
