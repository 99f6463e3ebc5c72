"""atheris target: what the job pages take in (job events, rank samples, failure records).

Messages built from the fuzzer's bytes (plain data of any shape, and near-valid samples with
one field of a wrong type or a non-finite number) go through the extension's intake into a
real :class:`~dask_ddp._dashboard.model.Board`; after each one every job's page JSON is made
and parsed as strict JSON. The contract checked: a message is taken or refused with
``ValueError``/``KeyError``/``TypeError`` (logged by the extension), and the pages never
fail to render.

    PYTHONPATH=src .venv/bin/python tools/fuzz/page_intake_fuzz.py -atheris_runs=1000000
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import atheris

with atheris.instrument_imports():
    from dask_ddp._dashboard import intake
    from dask_ddp._dashboard.extension import page_json
    from dask_ddp._dashboard.model import Board

logging.disable(logging.CRITICAL)
_FIELDS = ("rank", "state", "time", "steps", "steps_per_s", "wait_fraction", "step_ms",
           "wait_ms_per_step", "cpu_percent", "rss_bytes", "pid", "worker", "exit",
           "metrics", "points", "step", "reports", "step_source", "kind", "workers",
           "attempt", "world_size", "max_restarts", "name", "run_id", "ranks", "stacks",
           "collective", "message", "traceback", "type", "topic", "since", "used", "budget")
_HEX = "0123456789abcdef" * 2  # a job id as the results events' writers carry it
_STATES = ("starting", "running", "exited", "done", "failed", "cancelled", "stalled",
           "unread", "read", f"train-{_HEX}-0", f"metrics/{_HEX}")


def _value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    kind = fdp.ConsumeIntInRange(0, 9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-3, 5)
    if kind == 3:
        return fdp.PickValueInList([0.5, float("nan"), float("inf"), -float("inf"), 1e308])
    if kind == 4:
        return fdp.PickValueInList(list(_STATES))
    if kind == 5:
        return fdp.ConsumeUnicode(6)
    if kind == 6:
        return fdp.ConsumeBytes(3)
    if kind == 7:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if kind == 8:
        return [[_value(fdp, depth + 1), _value(fdp, depth + 1)]
                for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {fdp.PickValueInList(list(_FIELDS)) if fdp.ConsumeBool() else fdp.ConsumeUnicode(3):
            _value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))}


def _message(fdp: atheris.FuzzedDataProvider) -> Any:
    if fdp.ConsumeIntInRange(0, 3) == 0:
        return _value(fdp)
    return {fdp.PickValueInList(list(_FIELDS)): _value(fdp)
            for _ in range(fdp.ConsumeIntInRange(0, 8))}


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    board = Board()
    intake.take_job_event(board, "a0", {"kind": "started", "job_id": "a0", "run_id": "run",
                                        "name": "fuzz", "attempt": 0, "max_restarts": 1,
                                        "workers": ["tcp://10.0.0.1:1", "tcp://10.0.0.2:1"],
                                        "time": 100.0})
    intake.take_job_event(board, _HEX, {"kind": "started", "name": "hex", "time": 100.0,
                                        "workers": ["tcp://10.0.0.1:1"]})
    takes = (intake.take_job_event, intake.take_rank_sample, intake.take_failure,
             lambda b, _job, msg: intake.take_results_unread(b, msg))
    for _ in range(fdp.ConsumeIntInRange(1, 6)):
        take = takes[fdp.ConsumeIntInRange(0, 3)]
        job = fdp.PickValueInList(["a0", "a1", "run", "", 5])
        try:
            take(board, job, _message(fdp))
        except (ValueError, KeyError, TypeError):
            pass
        for text in [page_json(board.jobs_json())] + [
                page_json(board.job_json(key, metric)) for key in ("run", "a0", "a1", _HEX)
                for metric in (None, "*", "loss")]:
            json.loads(text, parse_constant=_refuse)


def _refuse(token: str) -> Any:
    raise AssertionError(f"the page's JSON holds {token}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
