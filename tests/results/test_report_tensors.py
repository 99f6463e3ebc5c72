"""report() of tensors: no ``.item()`` needed, no GPU sync, records in call order.

On the CPU: tensors' values, NaN/inf, the TypeError of a tensor of several elements, the
queue of records waiting for a value (call order, call-time step and time, written by the
next report(), at a checkpoint save and at the rank's exit) with a stand-in for a CUDA
value in real rank processes on a LocalCluster. Tests marked ``gpu`` prove on CUDA that
report() returns while the stream still runs and that the value arrives.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import dask_ddp
from cluster_util import client_fixture
from dask_ddp import _pending, results
from dask_ddp._channel.monitor import iter_job_metrics
from rank_channel import RankChannel
from results_util import JobLike, fake_rank_fixture, launch, read_metrics

pytestmark = pytest.mark.timeout(120)

client = client_fixture(1)
fake_rank = fake_rank_fixture()


class _Late:
    """A record whose value is ready ``delay`` seconds from now (a CUDA copy's stand-in)."""

    def __init__(self, record: dict[str, Any], delay: float) -> None:
        self.record, self.at = record, time.monotonic() + delay

    def ready(self) -> bool:
        return time.monotonic() >= self.at

    def payload(self) -> bytes:
        return b"M" + json.dumps(self.record).encode()


def without_time(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "time"} for r in recs]


# ------------------------------------------------------------------------------ on the CPU


def test_cpu_tensors_are_numbers(fake_rank: int) -> None:
    results.report({"a": torch.tensor(0.5), "b": torch.tensor([2]), "c": torch.ones(1, 1),
                    "d": torch.tensor(1.5, dtype=torch.bfloat16), "e": torch.tensor(True),
                    "f": torch.tensor(3.0, requires_grad=True) * 2}, step=4)
    [rec] = read_metrics(fake_rank)
    assert without_time([rec]) == [{"rank": 0, "step": 4, "a": 0.5, "b": 2, "c": 1.0,
                                    "d": 1.5, "e": True, "f": 6.0}]


@pytest.mark.parametrize("x", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_tensors_give_the_records_of_the_floats(fake_rank: int, x: float) -> None:
    results.report({"loss": torch.tensor(x)}, step=0)
    results.report({"loss": x}, step=0)
    tensor_rec, float_rec = read_metrics(fake_rank)
    assert json.dumps(without_time([tensor_rec])) == json.dumps(without_time([float_rec]))


def test_a_tensor_of_two_elements_is_a_type_error_naming_key_and_shape(fake_rank: int) -> None:
    with pytest.raises(TypeError, match=r"'loss' is a tensor of shape \(2,\)"):
        results.report({"loss": torch.tensor([1.0, 2.0])})
    with pytest.raises(TypeError, match=r"'z' is a tensor of shape \(0,\)"):
        results.report({"z": torch.zeros(0)})
    with pytest.raises(TypeError, match="'c'.*complex"):
        results.report({"c": torch.tensor(1j)})
    with pytest.raises(TypeError, match="'m'.*meta"):
        results.report({"m": torch.empty((), device="meta")})
    assert read_metrics(fake_rank) == []


def test_a_waiting_record_holds_the_later_ones_in_call_order(fake_rank: int) -> None:
    results.report({"x": 0.0}, step=0)
    _pending.put(_Late({"rank": 0, "step": 1, "time": 0.0, "x": 1.0}, 0.5),
                 results._rank_state().writer)
    results.report({"x": torch.tensor(2.0)}, step=2)  # ready, but called after
    assert [r["step"] for r in read_metrics(fake_rank)] == [0]
    assert _pending.waiting() == 2
    assert _pending.flush_pending(timeout=0) is False
    time.sleep(0.6)
    results.report({"x": 3.0}, step=3)  # the next report() writes the ready head first
    assert _pending.waiting() == 0
    assert [r["step"] for r in read_metrics(fake_rank)] == [1, 2, 3]


def test_a_checkpoint_save_is_a_flush_point(fake_rank: int, tmp_path: Path) -> None:
    _pending.put(_Late({"rank": 0, "step": 7, "time": 0.0}, 0.3), results._rank_state().writer)
    upload = dask_ddp.save_checkpoint({"w": torch.zeros(1)}, 7, storage=tmp_path.as_uri())
    assert upload is not None
    upload.result(60)
    assert _pending.waiting() == 0
    assert [r["step"] for r in read_metrics(fake_rank)] == [7]


def test_a_record_whose_value_cannot_be_read_is_dropped_alone(
    fake_rank: int, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(_Late):
        def ready(self) -> bool:
            raise RuntimeError("CUDA error: an illegal memory access")

    _pending.put(Broken({}, 0), results._rank_state().writer)
    results.report({"x": 1.0}, step=1)
    assert [r["step"] for r in read_metrics(fake_rank)] == [1]
    assert any("illegal memory access" in m for m in caplog.messages)


def test_report_takes_its_rank_path_in_the_rank_channel_environment() -> None:
    """The environment the GPU benchmark and the gpu tests give report() (rank_channel):
    there report() sends, through the pending queue, every record in call order; outside
    it (this test process before and after) it returns before sending."""
    assert not results._rank_state().enabled, "the test process is not a rank"
    with RankChannel("unit-channel") as channel:
        assert results._rank_state().enabled
        for i in range(200):  # a training loop's values: grad-tracking, bf16, integer
            loss = torch.tensor(1.0 / (i + 1), requires_grad=True) * 1
            results.report({"loss": loss, "lr": torch.tensor(0.5, dtype=torch.bfloat16),
                            "seen": torch.tensor(i)})
        # A value not ready yet (a CUDA copy's stand-in) holds the records after it, and
        # the background poller writes them once it is: no report() and no flush here.
        _pending.put(_Late({"rank": 0, "step": 200, "time": 0.0, "loss": 0.0}, 0.3),
                     results._rank_state().writer)
        results.report({"loss": torch.tensor(2.0)}, step=201)
        assert _pending.waiting() == 2
        deadline = time.monotonic() + 30
        while len(channel.records()) < 202 and time.monotonic() < deadline:
            time.sleep(0.01)
        recs = channel.records()
    assert [r["step"] for r in recs] == list(range(202))
    assert all(r["loss"] == pytest.approx(1.0 / (r["step"] + 1)) and r["lr"] == 0.5
               and r["seen"] == r["step"] for r in recs[:200])
    assert recs[201]["loss"] == 2.0
    assert not results._rank_state().enabled, "the rank environment outlived its channel"


# A rank whose values come late: report()'s own path, with a stand-in for the CUDA copy
# (ready DELAY seconds after the call) for the metrics named "slow".
LATE_RANK = """
import atexit, os, time
import torch
import dask_ddp.results as r
from dask_ddp import _pending
from dask_ddp._channel.records import encode_metric

DELAY = float(os.environ["DELAY"])

class SlowValues:
    def __init__(self, record, tensors):
        self.record, self.tensors = record, tensors
        self.at = time.monotonic() + DELAY
    def ready(self):
        return time.monotonic() >= self.at
    def payload(self):
        for key, t in self.tensors:
            self.record[key] = t.item()
        return encode_metric(self.record)

plain = r._tensor_value
r._DeviceValues = SlowValues
r._tensor_value = lambda key, value: value if key == "slow" else plain(key, value)

t0 = time.time()
r.report({"x": 0.0})
r.report({"slow": torch.tensor(float("nan")), "x": 1.0})
r.report({"x": torch.tensor(2.0), "t0": t0})
r.report({"slow": torch.tensor(3.0)})
assert _pending.waiting() == 3, _pending.waiting()
if os.environ["END"] == "next-report":
    time.sleep(DELAY + 0.2)
    r.report({"x": 4.0})
    assert _pending.waiting() == 0, _pending.waiting()
# END == "exit": the rank ends as the launcher's ranks do (atexit handlers, os._exit)
atexit._run_exitfuncs()
os._exit(0)
"""


@pytest.mark.parametrize("end", ["next-report", "exit"])
def test_late_values_keep_call_order_step_and_time_in_a_real_rank(
    client: Any, end: str
) -> None:
    delay = 1.5
    job_id, futures = launch(client, LATE_RANK, world_size=1,
                             env={"DELAY": str(delay), "END": end})
    [outcome] = client.gather(futures)
    assert outcome["returncode"] == 0
    recs = list(iter_job_metrics(JobLike(client, job_id, "late", futures, world_size=1)))
    want = [0, 1, 2, 3, 4] if end == "next-report" else [0, 1, 2, 3]
    assert [r["step"] for r in recs] == want
    assert math.isnan(recs[1]["slow"]) and recs[1]["x"] == 1.0
    assert list(recs[1]) == ["job", "rank", "step", "time", "slow", "x"]  # the call's order
    assert recs[2]["x"] == 2.0 and recs[3]["slow"] == 3.0
    t0 = recs[2]["t0"]
    # Each record has the time of its call, not of the moment its value came.
    assert all(t0 <= r["time"] < t0 + delay / 2 for r in recs[:4]), recs


# ---------------------------------------------------------------------------- on a GPU


def _busy_stream() -> torch.Tensor:
    """A value the current stream produces only after about a second of GPU time."""
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # GPU cycles: ~1 s on a 1.5-2 GHz part
    return torch.ones((), device="cuda") * 3


@pytest.mark.gpu
def test_report_of_a_cuda_tensor_does_not_wait_for_the_gpu(fake_rank: int) -> None:
    value = _busy_stream()
    called = time.time()
    results.report({"loss": value, "nan": value * float("nan")}, step=5)
    assert not torch.cuda.current_stream().query(), "report() waited for the stream"
    assert _pending.waiting() == 1
    assert read_metrics(fake_rank) == []
    assert _pending.flush_pending(timeout=60)
    [rec] = read_metrics(fake_rank)
    assert rec["step"] == 5 and rec["loss"] == 3.0 and math.isnan(rec["nan"])
    assert abs(rec["time"] - called) < 0.1  # the call's time, not the value's


@pytest.mark.gpu
def test_a_cuda_value_is_written_by_the_poller_and_keeps_the_order(fake_rank: int) -> None:
    results.report({"x": 0.0}, step=0)
    results.report({"x": _busy_stream()}, step=1)
    results.report({"x": torch.tensor(2.0)}, step=2)  # a CPU value: waits behind step 1
    assert not torch.cuda.current_stream().query()
    assert [r["step"] for r in read_metrics(fake_rank)] == [0]
    torch.cuda.current_stream().synchronize()
    deadline = time.monotonic() + 10
    while _pending.waiting() and time.monotonic() < deadline:
        time.sleep(0.01)  # no report(), no flush: the background poller writes them
    assert [(r["step"], r["x"]) for r in read_metrics(fake_rank)] == [(1, 3.0), (2, 2.0)]


@pytest.mark.gpu
def test_a_cuda_tensor_of_two_elements_is_a_type_error_without_a_sync(fake_rank: int) -> None:
    value = _busy_stream().expand(2)
    with pytest.raises(TypeError, match=r"'loss' is a tensor of shape \(2,\)"):
        results.report({"loss": value})
    assert not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
