"""The columns of a table: dtype, row shape, storage kind, and the error for the others
(internal; shared by the Table, its metadata readers and the rank's reader)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = ["Column", "TableColumnError", "numeric", "unsupported"]


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
