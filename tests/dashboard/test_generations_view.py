"""A live job's generations on its page: listed once each, the world size follows, a
malformed generation is refused with a reason."""

from __future__ import annotations

from typing import Any

import pytest

from dask_ddp._dashboard import intake
from dask_ddp._dashboard.model import Board


def _board() -> Board:
    b = Board()
    intake.take_job_event(b, "a0", {"kind": "started", "run_id": "run", "name": "t",
                                    "attempt": 0, "max_restarts": 0, "time": 100.0,
                                    "workers": ["tcp://h:1", "tcp://h:2", "tcp://h:3"]})
    return b


def _gen(**over: Any) -> dict[str, Any]:
    return {"kind": "generation", "generation": 1, "time": 101.0, "cause": "peer reset",
            "lost": [1], "joined": [], "world_size": 2, "step": 40, "recovery_s": 0.05,
            **over}


def test_generation_listed_once_and_world_size_follows() -> None:
    b = _board()
    intake.take_job_event(b, "a0", _gen())
    intake.take_job_event(b, "a0", _gen())  # sent again at the job's end
    job = b.job_json("run")["job"]
    assert job["world_size"] == 2
    assert [(g["generation"], g["lost"], g["step"]) for g in job["generations"]] == \
        [(1, [1], 40)]


@pytest.mark.parametrize("bad", [{"lost": "1"}, {"lost": [1.5]}, {"world_size": -1},
                                 {"recovery_s": float("nan")}, {"generation": "x"}])
def test_malformed_generation_refused(bad: dict[str, Any]) -> None:
    b = _board()
    with pytest.raises(ValueError):
        intake.take_job_event(b, "a0", _gen(**bad))
    assert b.job_json("run")["job"]["generations"] == []
