"""The job page's JSON stays strict when a metric is NaN or infinite (a diverged loss)."""

from __future__ import annotations

import json
import math
from typing import Any

from dask_ddp._dashboard.extension import page_json
from dask_ddp._dashboard.model import Board


def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"the page's JSON holds {token}, which browsers cannot parse")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_metrics_are_strict_json_and_curves_skip_them() -> None:
    board = Board()
    board.job_started({"job_id": "j0", "run_id": "run", "name": "diverged", "attempt": 0,
                       "workers": ["tcp://10.0.0.1:1", "tcp://10.0.0.2:1"], "max_restarts": 0,
                       "time": 100.0})
    for rank, loss in ((0, math.nan), (1, math.inf)):
        board.rank_sample("j0", {"rank": rank, "state": "running", "time": 101.0, "step": 7,
                                 "metrics": {"loss": loss, "lr": -math.inf, "acc": 0.5},
                                 "curves": {"acc": [[7.0, 0.5]]}})
    detail = _strict(page_json(board.job_json("run")))
    metrics = {r["rank"]: r["metrics"] for r in detail["job"]["ranks"]}
    assert metrics == {0: {"loss": "NaN", "lr": "-Infinity", "acc": 0.5},
                       1: {"loss": "Infinity", "lr": "-Infinity", "acc": 0.5}}
    assert _strict(page_json(board.jobs_json()))["jobs"][0]["name"] == "diverged"


def test_finite_bodies_are_unchanged() -> None:
    body = {"a": [1, 2.5, {"b": None, "c": "NaN"}], "d": True}
    assert json.loads(page_json(body)) == body
