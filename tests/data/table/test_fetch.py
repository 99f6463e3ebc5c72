"""The worker side of a table read, without a cluster: rows written as records into a
memory file the reader made, the fallback when that file is not reachable, and the
errors that name the column and partition."""

from __future__ import annotations

import mmap
import os
import secrets

import numpy as np
import pandas as pd
import pytest

from dask_ddp.data.table.columns import (
    Column,
    TableColumnError,
    fill_records,
    pack,
    record_layout,
)
from dask_ddp.data.table.fetch import _HEADER, _TOKEN_BYTES, _file_size, export_many

COLS = [Column("id", "<i8"), Column("a", "<f4"), Column("emb", "<f4", (2,), "object_list")]


def _frame(n: int = 10) -> pd.DataFrame:
    ids = np.arange(n, dtype=np.int64)
    return pd.DataFrame({"id": ids, "a": (ids * 0.5).astype(np.float32),
                         "emb": pd.Series([np.array([i, -i], np.float32) for i in ids],
                                          dtype=object)})


def _expected(rows: list[int]) -> np.ndarray:
    ids = np.asarray(rows, np.int64)
    return pack(COLS, {"id": ids, "a": (ids * 0.5).astype(np.float32),
                       "emb": np.stack([ids, -ids], 1).astype(np.float32)})


def test_rows_land_in_the_readers_memory_file() -> None:
    rows = np.array([1, 4, 7], np.int64)
    size = _file_size(COLS, len(rows))
    fd = os.memfd_create("table-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        token = secrets.token_bytes(_TOKEN_BYTES)
        os.pwrite(fd, token, 0)
        target = {"path": f"/proc/{os.getpid()}/fd/{fd}", "token": token, "size": size}
        (out,) = export_many([_frame()], [rows], COLS, [target], [3])
        assert out == {"shm": True}
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as mm:
            got = np.frombuffer(mm, np.uint8, 3 * record_layout(COLS)[1], _HEADER).copy()
        assert np.array_equal(got.reshape(3, -1), _expected([1, 4, 7]))
    finally:
        os.close(fd)


def test_an_unreachable_file_returns_the_records() -> None:
    # Another host's reader: its file does not exist here (or holds another token).
    target = {"path": "/proc/0/fd/12345", "token": b"x" * _TOKEN_BYTES, "size": 1}
    (out,) = export_many([_frame()], [(2, 5)], COLS, [target], [0])
    assert out["shm"] is False
    assert np.array_equal(out["records"], _expected([2, 3, 4]))


def test_ragged_lists_name_the_column_and_partition() -> None:
    frame = _frame(4)
    frame.loc[2, "emb"] = np.array([1.0, 2.0, 3.0], np.float32)
    target = {"path": "/nonexistent", "token": b"", "size": 0}
    with pytest.raises(TableColumnError, match=r"column 'emb' in partition 5"):
        export_many([frame], [np.array([0, 2])], COLS, [target], [5])


def test_a_numpy_block_of_an_array_table() -> None:
    block = np.arange(24, dtype=np.float32).reshape(6, 4)
    cols = [Column("x", "<f4", (4,))]
    target = {"path": "/nonexistent", "token": b"", "size": 0}
    (out,) = export_many([block], [np.array([5, 0])], cols, [target], [0])
    assert np.array_equal(out["records"].view(np.float32), block[[5, 0]])


def test_engine_packing_equals_numpy_per_column() -> None:
    """pack (the engine, one pass) against a column-by-column numpy reference: picked
    rows, a range, strided and reversed sources, bools and a 3-wide list column."""
    cols = [Column("i", "<i8"), Column("b", "|b1"), Column("e", "<f4", (3,)),
            Column("h", "<i2")]
    rng = np.random.default_rng(0)
    n = 5000
    block = rng.standard_normal((n, 8)).astype(np.float32)
    arrays = {"i": rng.integers(-9, 9, n), "b": rng.random(n) < 0.5,
              "e": block[:, 2:5],  # strided rows, each contiguous
              "h": np.arange(n, dtype=np.int16)[::-1]}  # a negative stride
    offsets, size = record_layout(cols)
    for rows in (rng.permutation(n)[:3000], (17, 4017), None):
        picked = np.arange(*rows) if isinstance(rows, tuple) else \
            np.arange(n) if rows is None else rows
        want = np.zeros((len(picked), size), np.uint8)
        for c, off in zip(cols, offsets, strict=True):
            view = want[:, off:off + c.row_bytes].view(np.dtype(c.dtype))
            view[:] = arrays[c.name][picked].reshape(len(picked), -1)
        assert np.array_equal(pack(cols, arrays, rows), want), rows


def test_engine_packing_names_a_row_out_of_range() -> None:
    cols = [Column("id", "<i8")]
    records = np.zeros((2, 8), np.uint8)
    with pytest.raises(ValueError, match=r"row 10 of column 'id' in partition 4, which holds 10"):
        fill_records(records, cols, [(np.arange(10), np.array([1, 10]))], "partition 4")
