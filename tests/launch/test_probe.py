"""The probe's reader: a rank's activity as :class:`RankActivity` members, and its latest
c10d collective from torch's flight recorder (no cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dask_ddp._launch.rank import probe
from dask_ddp._launch.wire import probe_file
from dask_ddp._launch.worker.probe import RankState
from dask_ddp._states import RankActivity

pytestmark = [pytest.mark.timeout(30)]


def test_reader_names_the_activity_with_the_enum(tmp_path: Path) -> None:
    reader = RankState(str(tmp_path))
    try:
        assert reader.read() is None  # the rank has not written its file yet
        writer = probe._State(str(tmp_path / probe_file.STATE_FILE))
        seen = reader.read()
        assert seen is not None and seen[:2] == (RankActivity.WORKING, "")
        writer.set(probe_file.FIRST_COLLECTIVE + probe_file.COLLECTIVES.index("all_reduce"))
        seen = reader.read()
        assert seen is not None and seen[:2] == (RankActivity.BLOCKED, "all_reduce")
        assert seen[2] >= 0.0
        writer.set(probe_file.RETURNED)
        seen = reader.read()
        assert seen is not None and seen[0] is RankActivity.RETURNED
        # The progress topic carries the plain value.
        assert seen[0].value == "returned"
    finally:
        reader.close()


def test_latest_c10d_of_a_dump_and_its_round_trip(tmp_path: Path) -> None:
    dump = {"entries": [
        {"record_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 7,
         "profiling_name": "gloo:all_reduce", "time_created_ns": 10**18, "retired": True,
         "state": "scheduled", "is_p2p": False},
        {"record_id": 1, "process_group": ("1", "undefined"), "collective_seq_id": 2,
         "profiling_name": "gloo:broadcast", "time_created_ns": 10**18, "retired": True,
         "state": "scheduled", "is_p2p": False},
        {"record_id": 2, "process_group": ("0", "default_pg"), "collective_seq_id": 8,
         "profiling_name": "gloo:all_reduce", "time_created_ns": 2 * 10**18,
         "retired": False, "state": "scheduled", "is_p2p": False},
        {"record_id": 3, "process_group": ("0", "default_pg"), "collective_seq_id": 0,
         "profiling_name": "gloo:send", "time_created_ns": 3 * 10**18, "is_p2p": True}]}
    record = probe.latest_c10d(dump)
    assert record == {"seq": 8, "group": "0", "name": "gloo:all_reduce", "since": 2e9,
                      "done": False, "counts": {"0": 8, "1": 2}}
    assert probe.latest_c10d({}) is None  # no process group yet: no entries
    reader = RankState(str(tmp_path))
    try:
        writer = probe._State(str(tmp_path / probe_file.STATE_FILE))
        assert reader.read_c10d() is None  # not written yet
        writer.set_c10d(record)
        assert reader.read_c10d() == record
        assert reader.read() is not None  # the state beside it is intact
    finally:
        reader.close()


RECORDED = """
import os, sys, time
from dask_ddp._launch.rank import probe
probe.install(sys.argv[1])
import torch, torch.distributed as dist
store = dist.HashStore()
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
for _ in range(3):
    dist.all_reduce(torch.ones(1))
from dask_ddp._launch.worker.probe import RankState
reader = RankState(sys.argv[1])
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    seen = reader.read_c10d()
    if seen is not None and seen["seq"] == 3:
        print(seen["name"], seen["seq"], seen["done"], os.environ["TORCH_FR_BUFFER_SIZE"])
        break
    time.sleep(0.1)
else:
    print("no c10d record within 30 s:", reader.read_c10d())
os._exit(0)
"""


def test_the_probe_reads_the_flight_recorder_of_a_real_process_group(
        tmp_path: Path) -> None:
    # The probe turns torch's flight recorder on and its thread publishes the rank's
    # latest collective: gloo's all-reduce, its count, completed.
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", RECORDED, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["gloo:all_reduce", "3", "True", "64"], out.stdout


def test_the_flight_recorder_is_on_unless_the_user_sized_it() -> None:
    from dask_ddp._launch.wire.collective_env import collective_defaults

    added = collective_defaults({})
    assert added["TORCH_FR_BUFFER_SIZE"] == "64"
    assert added["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "TORCH_FR_BUFFER_SIZE" not in collective_defaults({"TORCH_FR_BUFFER_SIZE": "0"})
    assert "TORCH_FR_BUFFER_SIZE" not in collective_defaults(
        {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in collective_defaults(
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
