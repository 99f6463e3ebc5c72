"""Evaluation while training: a real job's checkpoints scored on the cluster by
dask_ddp.Evaluate; the scores arrive as eval/ metrics in metrics.jsonl, Job.metrics() and
the job page, at their checkpoint's step, and equal predict over the same checkpoint."""

from __future__ import annotations

import contextlib
import json
import pickle
from pathlib import Path
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client

import dask_ddp
from cluster_util import client_fixture
from dashboard_util import dashboard_root, get_json
from predict_util import make_model, mse, train_with_evaluation

pytestmark = pytest.mark.timeout(300)

client = client_fixture(2)


def test_checkpoints_scored_while_training(client: Client, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    val = pd.DataFrame(x[:128], columns=["a", "b", "c"]).assign(y=y[:128])
    ddf = dd.from_pandas(val, npartitions=4)
    storage = (tmp_path / "ckpt").as_uri()
    ev = dask_ddp.Evaluate(make_model, ddf, score=mse, columns=["a", "b", "c"])
    job = dask_ddp.submit(client, train_with_evaluation, x, y, 30, 10, storage, ev,
                          n_workers=1, progress=False, output_dir=str(tmp_path / "out"),
                          name="evaluated")
    assert job.result(timeout=240) == [30]
    records = list(job.metrics())
    evals = {r["step"]: r["eval/mse"] for r in records if "eval/mse" in r}
    assert sorted(evals) == [10, 20, 30], records[-5:]
    assert evals[30] < evals[10]
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    in_file = {r["step"]: r["eval/mse"] for r in map(json.loads, lines) if "eval/mse" in r}
    assert in_file == evals
    # The checkpoint the job wrote loads into predict and gives the same score.
    out = dask_ddp.predict(make_model, ddf, columns=["a", "b", "c"], checkpoint=storage,
                           checkpoint_step=20)
    assert float(mse(out, ddf)["mse"].compute()) == pytest.approx(evals[20], rel=1e-5)
    # The job page lists the metric and draws it at the checkpoints' steps (a curve keeps
    # one point per sampling interval: the last record's).
    root = dashboard_root(client)
    page = get_json(f"{root}api/job/{job.id}?metric=eval/mse")["job"]
    assert "eval/mse" in page["metric_names"], page["metric_names"]
    points = [p for curve in page["curves"].values() for p in curve.get("eval/mse", [])]
    assert points and {int(s) for s, _ in points} <= {10, 20, 30}, page["curves"]
    assert all(v == pytest.approx(evals[int(s)]) for s, v in points), page["curves"]


class _NoCluster:
    """Stands for the evaluation thread's client where no Dask collection is computed."""

    def as_current(self) -> Any:
        return contextlib.nullcontext()

    def compute(self, values: list[Any], **options: Any) -> list[Any]:
        return values

    def gather(self, values: list[Any]) -> list[Any]:
        return values


def _count(out: Any, data: Any) -> dict[str, int]:
    return {"n": len(out)}


def test_the_evaluation_runs_on_the_cpu_unless_a_device_is_chosen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def fake_predict(model: Any, data: Any, **options: Any) -> Any:
        seen.append(options["device"])
        return data

    monkeypatch.setattr("dask_ddp.predict.api.predict", fake_predict)
    frame = pd.DataFrame({"a": [1.0]})
    for chosen, want in (({}, "cpu"), ({"device": "cuda:1"}, "cuda:1"), ({"device": None}, None)):
        ev = pickle.loads(pickle.dumps(dask_ddp.Evaluate(make_model, frame, score=_count,
                                                         **chosen)))
        ev._client = _NoCluster()
        assert ev._scores(1, "memory://nowhere") == {"n": 1}
        assert seen.pop() == want
