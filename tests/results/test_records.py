"""The client's results folder: which result paths are refused, and one bad record never
costs the others (real files in a real folder)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dask_ddp._channel.reader import Record
from dask_ddp._channel.records import (
    KIND_RESULT,
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    ResultWriter,
    check_path,
    encode_result,
)

BAD = {
    ".": "'.'",
    "a/./b": "'.'",
    "..": "'..'",
    "a/../../b": "'..'",
    "a//b": "empty",
    "a/": "empty",
    "/etc/passwd": "absolute",
    "a\\b": "backslash",
    "a\x00b": "control character",
    "line\nbreak": "control character",
    "x" * (MAX_NAME_BYTES + 1): f"over {MAX_NAME_BYTES} bytes",
    "/".join(["y" * 200] * 6): f"at most {MAX_PATH_BYTES}",
    "\udcff": "UTF-8",
}


@pytest.mark.parametrize("path", list(BAD), ids=list(range(len(BAD))))
def test_a_bad_path_is_refused_naming_the_rule(path: str) -> None:
    with pytest.raises(ValueError, match="refused") as info:
        check_path(path)
    assert BAD[path] in str(info.value)


@pytest.mark.parametrize("path", ["a.json", "0/1/x.txt", "dir.d/.hidden", "é/ü.bin",
                                  "x" * MAX_NAME_BYTES])
def test_good_paths_pass(path: str) -> None:
    assert check_path(path) == path


def _record(rank: int, seq: int, path: str, body: bytes, kind: bytes = b"b") -> Record:
    return Record("s", rank, seq, encode_result(path, kind, body))


def test_one_bad_record_costs_no_other(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Records whose path is refused (as a rank that skipped the check would send them),
    or that are malformed, are logged, counted and skipped; every other record is written,
    and nothing is left in or beside the folder but the good results."""
    root = tmp_path / "results"  # not made yet: "." must not write the folder as a file
    writer = ResultWriter(root)
    records = [
        _record(0, 0, "good-0.bin", b"zero"),
        _record(1, 0, ".", b"replaces the folder?"),
        _record(1, 1, "a\x00b", b"nul"),
        _record(0, 1, "x" * 300, b"long"),
        Record("s", 1, 2, KIND_RESULT + b"\xff"),  # truncated: no path length
        _record(1, 3, "../outside", b"escape"),
        _record(0, 2, "good/1.txt", b"line", kind=b"s"),
        _record(1, 4, "good-2.bin", b"two"),
    ]
    with caplog.at_level(logging.ERROR, logger="dask_ddp._channel.records"):
        written = [writer.write(r) for r in records]
    writer.close()
    assert written == [True, False, False, False, False, False, True, True]
    assert writer.failed == 5 and [r for r, _ in writer.failures] == [1, 1, 0, 1, 1]
    assert root.is_dir()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "results", "results/good", "results/good-0.bin", "results/good-2.bin",
        "results/good/1.txt"]
    assert (root / "good-0.bin").read_bytes() == b"zero"
    assert (root / "good/1.txt").read_bytes() == b"line\n"
    assert len([r for r in caplog.records if "was not written" in r.getMessage()]) == 5


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    root = tmp_path / "results"
    (root / "taken").mkdir(parents=True)  # a folder where the result's file would go
    writer = ResultWriter(root)
    assert not writer.write(_record(0, 0, "taken", b"data"))
    assert sorted(p.name for p in root.iterdir()) == ["taken"]
