"""examples/predict.py end to end, as a user runs it (``--quick``): a LocalCluster of 2 worker
processes trains a classifier on 2 ranks with checkpoints in the job's storage, then
``dask_ddp.predict`` scores a held-out DataFrame with the newest checkpoint and writes
Parquet. The files are checked row by row against the same model and checkpoint run here,
in this process, with plain torch."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest
import torch

import dask_ddp
from examples_util import EXAMPLES, run

pytestmark = [pytest.mark.slow, pytest.mark.dask, pytest.mark.timeout(400)]


def example_module() -> ModuleType:
    """examples/predict.py imported (its model and data makers; main() is not run)."""
    spec = importlib.util.spec_from_file_location("predict_example", EXAMPLES / "predict.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_predict_example_scores_match_a_local_computation(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run([sys.executable, str(EXAMPLES / "predict.py"), "--quick", "--out", str(out)],
        cwd=tmp_path, timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    # A checkpoint per epoch (5), the newest 3 kept; predict read the newest (epoch 4).
    assert summary["checkpoints"] == [2, 3, 4], summary
    assert summary["storage"] == (out / "checkpoints").resolve().as_uri()

    # The held-out frame and the newest checkpoint's model, made here without Dask.
    ex = example_module()
    held = summary["held_out"]
    frame = pd.concat([ex.make_partition(held["seed"], p, held["rows"])
                       for p in range(held["partitions"])])
    state = dask_ddp.load_checkpoint(summary["storage"])
    assert state is not None and state["extra"]["step"] == 4
    model = ex.make_model()
    model.load_state_dict(state["model"])
    with torch.inference_mode():
        want = model.eval()(torch.from_numpy(frame[ex.FEATURES].to_numpy().copy())).numpy()

    got = pd.read_parquet(out / "scores")
    assert len(got) == len(frame) == held["partitions"] * held["rows"]
    assert got.index.name == "id" and list(got.index) == list(frame.index)  # every row once
    assert list(got.columns) == [*ex.LOGITS, "label", "pred"]
    np.testing.assert_allclose(got[ex.LOGITS].to_numpy(), want, rtol=1e-5, atol=1e-5)
    assert (got["label"].to_numpy() == frame["label"].to_numpy()).all()
    assert (got["pred"].to_numpy() == want.argmax(axis=1)).all()
    accuracy = float((want.argmax(axis=1) == frame["label"].to_numpy()).mean())
    assert summary["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    # The model learned (a random one is right about a third of the time).
    assert accuracy >= summary["min_accuracy"] == 0.85
