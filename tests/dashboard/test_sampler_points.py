"""The supervisor's sampler turns a rank's metric records into the page's curve points: a
metric sent by records of its own (an eval/ score beside the training loss) keeps its
points, and an older step's record does not set the rank's step back."""

from __future__ import annotations

import json
from pathlib import Path

from dask_ddp._dashboard.sampler import RankSampler


def _records(*recs: dict[str, object]) -> list[bytes]:
    return [b"M" + json.dumps({"rank": 0, "time": 1.0, **r}).encode() for r in recs]


def test_each_metric_keeps_its_latest_point_and_the_step_never_goes_back(
        tmp_path: Path) -> None:
    s = RankSampler(None, "j", 0, str(tmp_path))
    first = s._curve_points(_records({"step": 0, "loss": 2.0}))
    assert first == {"loss": [[0.0, 2.0]]}
    s._reports = 4
    points = s._curve_points(_records(
        {"step": 10, "loss": 1.0}, {"step": 5, "eval/mse": 0.5},  # an older checkpoint's
        {"step": 11, "loss": 0.9}))
    assert points == {"loss": [[11.0, 0.9]], "eval/mse": [[5.0, 0.5]]}
    assert s._last_step == 11
    assert s._last_metrics == {"loss": 0.9, "eval/mse": 0.5}
