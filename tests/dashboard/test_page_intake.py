"""What the job page receives from real ranks: metric records of any size, and a diverged
loss (NaN, infinity), over the real HTTP API of a real LocalCluster's scheduler."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import dask_ddp
from cluster_util import client_fixture
from dashboard_util import dashboard_root, diverging, get, wait_job

pytestmark = [pytest.mark.timeout(240)]

client = client_fixture(2)


def test_large_and_non_finite_metrics_reach_the_page(client: Any, tmp_path: Path) -> None:
    root = dashboard_root(client)
    stop = tmp_path / "stop"  # the ranks stay until the page was read
    job = dask_ddp.submit(client, diverging, 8, 120.0, str(stop), name="diverged",
                          progress=False)
    try:
        seen = wait_job(root, job.id, "both ranks' metrics with the loss",
                        lambda j: len(j["ranks"]) == 2 and all(
                            "loss" in (r.get("metrics") or {}) and r.get("step") == 7
                            for r in j["ranks"]))
        status, _, body = get(f"{root}api/job/{job.id}?metric=*")
        assert status == 200

        def refuse(token: str) -> Any:
            raise AssertionError(f"the job page's JSON holds {token}")

        strict = json.loads(body, parse_constant=refuse)["job"]
        losses = {r["rank"]: r["metrics"]["loss"] for r in strict["ranks"]}
        assert losses == {0: "NaN", 1: "Infinity"}, losses
        for r in seen["ranks"]:
            assert len(r["metrics"]) <= 48 and "grad_norm/layer000" in r["metrics"]
        diverged = {r["rank"]: r["diverged"] for r in strict["ranks"]}
        assert diverged == {0: {"metric": "loss", "value": "NaN", "step": 3},
                            1: {"metric": "loss", "value": "Infinity", "step": 3}}, diverged
        # The loss curve holds the finite points only.
        for curve in strict["curves"].values():
            for x, y in curve.get("loss", []):
                assert math.isfinite(y) and x < 3, curve["loss"]
    finally:
        stop.touch()
        assert job.result(timeout=120) == [0, 1]
