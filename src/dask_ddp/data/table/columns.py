"""The columns of a table: dtype, row shape, storage kind, and the error for the others
(internal; shared by the Table, its metadata readers and the rank's reader)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Column", "TableColumnError", "column_view", "numeric", "pack",
           "record_layout", "unsupported"]


class TableColumnError(TypeError, ValueError):
    """A column a table cannot turn into tensors (strings, objects, ragged lists); the
    message names the column and its dtype (and the partition or file, when read)."""


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its name, numpy dtype, shape of one row, and how it is stored."""

    name: str
    dtype: str  # numpy dtype string, e.g. "<f4"
    shape: tuple[int, ...] = ()
    #: "numpy" (a numpy column), "ext" (a pandas extension dtype: nullable ints, ...),
    #: "object_list" (lists or arrays in an object column), "arrow_list" (a pyarrow list).
    kind: str = "numpy"

    @property
    def row_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * math.prod(self.shape))


def unsupported(name: str, dtype: Any, where: str = "") -> TableColumnError:
    return TableColumnError(
        f"column {name!r}{where} has dtype {dtype}, which is not numeric, bool or a "
        "fixed-length list of numbers; leave it out with columns=[...] (e.g. "
        "Table(ddf, columns=[...]))")


def numeric(dt: np.dtype) -> bool:
    return dt.kind in "biuf"


def record_layout(columns: Sequence[Column]) -> tuple[list[int], int]:
    """Byte offset of each column inside a row's record (the columns side by side, in
    order), and the record's size."""
    offsets, pos = [], 0
    for c in columns:
        offsets.append(pos)
        pos += c.row_bytes
    return offsets, pos


def column_view(records: np.ndarray, c: Column, offset: int) -> np.ndarray:
    """Column ``c`` of ``records`` (uint8, one row per record) as an array of its dtype
    and row shape: a strided view, writable when ``records`` is."""
    n = records.shape[0]
    return records[:, offset:offset + c.row_bytes].view(np.dtype(c.dtype)).reshape(n, *c.shape)


def _engine_array(array: np.ndarray, c: Column) -> np.ndarray:
    """``array`` as the engine packs it: ``c``'s dtype, rows along a positive first axis,
    each row contiguous (a copy only when it is not already)."""
    if array.dtype != np.dtype(c.dtype):
        array = array.astype(c.dtype)
    if array.ndim == 0 or (array.ndim > 1 and not array[:1].flags.c_contiguous) \
            or (len(array) > 1 and array.strides[0] <= 0):
        array = np.ascontiguousarray(array)
    return array.reshape(len(array), *c.shape)


def fill_records(records: np.ndarray, columns: Sequence[Column],
                 sources: Sequence[tuple[np.ndarray, Any]], where: str = "") -> None:
    """Write each column's values into ``records`` (uint8 [rows, record bytes]) in one
    pass in the engine, the GIL released (a block of rows at a time: the records being
    written stay in the cache). ``sources[i]`` is ``(array, index)`` for ``columns[i]``:
    ``index`` None (the array's rows are the records' rows), or a ``(start, stop)`` range
    or an integer array of the array's rows to take, the same for every column given
    one. An index out of range raises ``ValueError`` naming the column and ``where``."""
    from dask_ddp import _core  # the engine: no torch (it runs in Dask workers too)

    offsets, _ = record_layout(columns)
    indices = [index for _, index in sources if index is not None]
    index = indices[0] if indices else None
    if any(i is not index for i in indices):
        raise ValueError("fill_records: the columns given an index must share it")
    begin, rows = 0, None
    if isinstance(index, tuple):
        begin = int(index[0])
    elif index is not None:
        rows = np.ascontiguousarray(index, np.int64)
    specs = [(c.name, _engine_array(array, c), off, idx is not None)
             for c, off, (array, idx) in zip(columns, offsets, sources, strict=True)]
    _core.pack_records(records, specs, begin, rows, where)


def pack(columns: Sequence[Column], arrays: Mapping[str, np.ndarray],
         rows: np.ndarray | tuple[int, int] | None = None) -> np.ndarray:
    """Column arrays of equal length packed into records (uint8 [rows, record bytes]);
    with ``rows`` (an integer array, or a ``(start, stop)`` range), only those rows of
    each array, in that order (one copy)."""
    _, size = record_layout(columns)
    if isinstance(rows, tuple):
        n = rows[1] - rows[0]
    elif rows is not None:
        n = len(rows)
    else:
        n = len(arrays[columns[0].name]) if columns else 0
    records = np.empty((n, size), np.uint8)
    fill_records(records, columns, [(arrays[c.name], rows) for c in columns])
    return records
