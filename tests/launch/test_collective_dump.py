"""Reading the flight recorder's dump of a rank that a collective's timeout ended: plain
data only (a pickle naming any class or function is refused, never run), bounded in size,
summarised newest last. The end-to-end case is in test_stall_ddp.py."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from dask_ddp._launch.worker import collective_dump


def _entry(seq: int, retired: bool) -> dict[str, object]:
    return {"record_id": seq, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "profiling_name": "nccl:all_reduce", "input_sizes": [[1024]], "state": "started",
            "retired": retired, "is_p2p": False}


def test_the_summary_lists_the_last_collectives(tmp_path: Path) -> None:
    dump = {"version": "2.10", "entries": [_entry(i, i < 11) for i in range(1, 12)]}
    (tmp_path / f"{collective_dump.DUMP_PREFIX}3").write_bytes(pickle.dumps(dump))
    text = collective_dump.dump_summary(str(tmp_path), 3)
    lines = text.strip().splitlines()
    assert "last collectives of rank 3 in the flight recorder's dump (of 11)" in lines[0]
    assert len(lines) == 1 + collective_dump.SHOWN
    assert lines[-1].strip() == ("nccl:all_reduce #11 of process group '0': started "
                                 "sizes [[1024]]")
    assert "#10 of process group '0': completed" in lines[-2]
    assert collective_dump.dump_summary(str(tmp_path), 4) == ""  # no dump: nothing added


class _Hostile:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch pwned",))


def test_a_dump_naming_a_function_is_refused_not_run(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{collective_dump.DUMP_PREFIX}0").write_bytes(
        pickle.dumps({"entries": [_Hostile()]}))
    text = collective_dump.dump_summary(str(tmp_path), 0)
    assert "unreadable" in text and "only plain data is read" in text, text
    assert not (tmp_path / "pwned").exists()


def test_an_oversized_or_malformed_dump_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"\x80" * (collective_dump.MAX_DUMP_BYTES + 1))
    with pytest.raises(ValueError, match="not read"):
        collective_dump.read_dump(str(big))
    for junk in (b"", b"garbage", pickle.dumps([1, 2]), pickle.dumps({"entries": 5})):
        bad = tmp_path / "bad"
        bad.write_bytes(junk)
        with pytest.raises(ValueError, match="not a flight recorder dump"):
            collective_dump.read_dump(str(bad))


def test_the_dump_goes_into_the_work_directory_unless_set(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    collective_dump.dump_environment(str(tmp_path), env)
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / collective_dump.DUMP_PREFIX)
    mine = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/nccl_trace_rank_"}
    collective_dump.dump_environment(str(tmp_path), mine)
    assert mine["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/scratch/nccl_trace_rank_"
