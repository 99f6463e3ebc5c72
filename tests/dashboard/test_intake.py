"""The job pages' intake refuses malformed messages with a reason and changes nothing; the
pages render after any message (each case below broke a page before the intake's checks)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from dask_ddp._dashboard import intake
from dask_ddp._dashboard.extension import page_json
from dask_ddp._dashboard.model import Board


def _board() -> Board:
    b = Board()
    intake.take_job_event(b, "a0", {"kind": "started", "run_id": "run", "name": "t",
                                    "attempt": 0, "max_restarts": 0, "time": 100.0,
                                    "workers": ["tcp://10.0.0.1:1", "tcp://10.0.0.2:1"]})
    return b


def _pages(b: Board) -> None:
    for text in (page_json(b.jobs_json()), page_json(b.job_json("run")),
                 page_json(b.job_json("run", "*"))):
        json.loads(text, parse_constant=lambda t: pytest.fail(f"page JSON holds {t}"))


BAD_SAMPLES: dict[str, Any] = {
    "a rate that is text": {"rank": 0, "steps_per_s": "fast"},
    "a rank that is text": {"rank": "0"},
    "a negative rank": {"rank": -1},
    "metrics that are a list": {"rank": 0, "metrics": [1, 2]},
    "a curve of bad points": {"rank": 0, "points": {"loss": [[1.0]]}},
    "a non-finite curve point": {"rank": 0, "points": {"loss": [[1.0, math.nan]]}},
    "an unknown state": {"rank": 1, "state": "dancing"},
    "bytes": {"rank": 0, "exit": b"\x00"},
    "not a dict": [1, 2, 3],
    "too deep": {"rank": 0, "metrics": {"a": [[[[[[[[[[1]]]]]]]]]]}},
}


@pytest.mark.parametrize("name", list(BAD_SAMPLES))
def test_a_bad_sample_is_refused_and_the_page_renders(name: str) -> None:
    b = _board()
    with pytest.raises(ValueError):
        intake.take_rank_sample(b, "a0", BAD_SAMPLES[name])
    _pages(b)


def test_a_failure_record_without_a_rank_renders() -> None:
    """A job-wide failure record (``rank: None``, as a stall's) is taken and shown."""
    b = _board()
    intake.take_failure(b, "a0", {"rank": None, "kind": "stalled", "message": "stuck"})
    intake.take_failure(b, "a0", {"rank": 1, "kind": "raised", "message": "boom"})
    _pages(b)


def test_good_samples_and_non_finite_metrics_are_taken() -> None:
    b = _board()
    intake.take_rank_sample(b, "a0", {"rank": 0, "state": "running", "time": 101.0,
                                      "steps_per_s": 2.0, "metrics": {"loss": math.nan},
                                      "points": {"loss": [[0.0, 1.0]]}, "step": 3})
    job = json.loads(page_json(b.job_json("run")))["job"]
    assert job["ranks"][0]["metrics"] == {"loss": "NaN"} and job["state"] == "running"


JOB_ID = "0123456789abcdef0123456789abcdef"

BAD_RESULTS_EVENTS: dict[str, Any] = {
    "no state": {"topic": "results/x"},
    "an unknown state": {"state": "angry", "topic": "results/x"},
    "a topic that is not text": {"state": "unread", "topic": 7},
    "an over-long topic": {"state": "unread", "topic": "t" * 201},
    "writers that are not a list": {"state": "unread", "topic": "t", "writers": "w"},
    "too many writers": {"state": "unread", "topic": "t", "writers": ["w"] * 65},
    "a non-finite since": {"state": "unread", "topic": "t", "since": math.inf},
    "not a dict": ["unread"],
}


@pytest.mark.parametrize("name", list(BAD_RESULTS_EVENTS))
def test_a_bad_results_event_is_refused(name: str) -> None:
    b = Board()
    intake.take_job_event(b, JOB_ID, {"kind": "started", "name": "t", "time": 100.0,
                                      "workers": ["tcp://10.0.0.1:1"]})
    with pytest.raises(ValueError):
        intake.take_results_unread(b, BAD_RESULTS_EVENTS[name])
    assert json.loads(page_json(b.job_json(JOB_ID)))["job"]["unread"] == []


def test_an_unread_topic_is_listed_on_its_job_until_read() -> None:
    b = Board()
    intake.take_job_event(b, JOB_ID, {"kind": "started", "name": "t", "time": 100.0,
                                      "workers": ["tcp://10.0.0.1:1"]})
    intake.take_job_event(b, "f" * 32, {"kind": "started", "name": "u", "time": 100.0,
                                        "workers": ["tcp://10.0.0.1:1"]})
    intake.take_results_unread(b, {"state": "unread", "topic": "results/k", "since": 50.0,
                                   "used": 10, "budget": 10,
                                   "writers": [f"train-{JOB_ID}-0", "other-key"]})
    unread = json.loads(page_json(b.job_json(JOB_ID)))["job"]["unread"]
    assert [(u["topic"], u["used"]) for u in unread] == [("results/k", 10)]
    assert unread[0]["seconds"] > 0
    assert json.loads(page_json(b.job_json("f" * 32)))["job"]["unread"] == []
    intake.take_results_unread(b, {"state": "read", "topic": "results/k"})
    assert json.loads(page_json(b.job_json(JOB_ID)))["job"]["unread"] == []
