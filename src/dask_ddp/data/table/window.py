"""One window of a rank's epoch: the rows it reads of each partition, and where each
position of the window finds its row once they are read (internal; numpy only)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Window"]


class Window:
    """The rows of one window of a rank's epoch: per partition, its sorted rows.

    Split by the engine (``index_window``) in time linear in the window's rows and its
    partitions' sizes (no sort, no Python per row).

    Attributes
    ----------
    partitions : numpy.ndarray
        The partitions the window reads, in table order.
    sizes : numpy.ndarray
        Rows of each partition's piece.
    rows : list of numpy.ndarray
        Each partition's rows read (sorted, within the partition); made when first asked
        for (a whole partition's are its row numbers).
    seg, row : numpy.ndarray
        For each position of the window: its partition's index in ``partitions`` and its
        row in that partition's piece.
    pending, data
        The started reads of the pieces, then the pieces read (records), set by the
        reads (:class:`~dask_ddp.data.table.reads.WindowReads`).
    """

    def __init__(self, rows: np.ndarray, offsets: np.ndarray, *, whole: bool = False) -> None:
        from dask_ddp import _core

        self.whole = whole
        self.partitions, self.sizes, self.seg, self.row, self._pieces = _core.index_window(
            np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(offsets, np.int64),
            whole)
        self.data: list[np.ndarray] | None = None
        self.pending: list[Any] = []
        self._rows: list[np.ndarray] | None = None

    @property
    def rows(self) -> list[np.ndarray]:
        if self._rows is None:
            if self.whole:
                self._rows = [np.arange(k, dtype=np.int64) for k in self.sizes]
            else:
                ends = np.cumsum(self.sizes)
                self._rows = [self._pieces[e - k:e] for e, k in zip(ends, self.sizes,
                                                                     strict=True)]
        return self._rows
