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


def pack(columns: Sequence[Column], arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """Column arrays of equal length packed into records (uint8 [rows, record bytes])."""
    offsets, size = record_layout(columns)
    n = len(arrays[columns[0].name]) if columns else 0
    records = np.empty((n, size), np.uint8)
    for c, off in zip(columns, offsets, strict=True):
        column_view(records, c, off)[...] = arrays[c.name]
    return records
