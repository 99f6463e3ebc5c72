"""The launch record a supervisor writes and its rank reads (no cluster)."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from dask_ddp._launch.wire.launch_record import RECORD_FILE, LaunchRecord, LaunchRecordError

pytestmark = [pytest.mark.timeout(30)]


def record() -> LaunchRecord:
    return LaunchRecord(payload=b"fn", init_kwargs=b"{}", backend="gloo",
                        pass_local_rank=True, sys_path=("/a", "/b"), worker="tcp://h:1",
                        rendezvous_timeout=30.0)


def test_record_round_trips_and_is_frozen(tmp_path: Path) -> None:
    written = record()
    written.write(str(tmp_path))
    assert LaunchRecord.read(str(tmp_path)) == written
    with pytest.raises(dataclasses.FrozenInstanceError):
        written.backend = "nccl"  # type: ignore[misc]


def test_rank_refuses_what_is_not_a_record(tmp_path: Path) -> None:
    (tmp_path / RECORD_FILE).write_bytes(pickle.dumps({"payload": b"fn"}))
    with pytest.raises(LaunchRecordError, match="holds a dict, not a LaunchRecord"):
        LaunchRecord.read(str(tmp_path))
    (tmp_path / RECORD_FILE).unlink()
    with pytest.raises(LaunchRecordError, match=RECORD_FILE):
        LaunchRecord.read(str(tmp_path))
