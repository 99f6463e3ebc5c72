"""One window of a rank's epoch: the rows it reads of each partition, and where each
position of the window finds its row once they are read (internal; numpy only)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Window"]


class Window:
    """The rows of one window of a rank's epoch: per partition, its sorted rows.

    Linear in the window's rows and its partitions' sizes (no sort): a mark per row of
    the window's partitions, laid end to end in partition order; the marked ones are the
    distinct rows in table order, and a running count of the marks gives each position
    its row inside its partition's piece.

    Attributes
    ----------
    partitions : numpy.ndarray
        The partitions the window reads, in table order.
    rows : list of numpy.ndarray
        Each partition's rows read (sorted, within the partition).
    seg, row : numpy.ndarray
        For each position of the window: its partition's index in ``partitions`` and its
        row in that partition's piece.
    pending, data
        The started reads of the pieces, then the pieces read (records), set by the
        reads (:class:`~dask_ddp.data.table.reads.WindowReads`).
    """

    def __init__(self, rows: np.ndarray, offsets: np.ndarray, *, whole: bool = False) -> None:
        part = np.searchsorted(offsets, rows, side="right") - 1
        present = np.zeros(len(offsets) - 1, bool)
        present[part] = True
        self.partitions = np.flatnonzero(present)
        self.data: list[np.ndarray] | None = None
        self.pending: list[Any] = []
        self.rows: list[np.ndarray]  # each partition's rows read, sorted
        seg_of = np.zeros(len(offsets) - 1, np.int32)
        seg_of[self.partitions] = np.arange(len(self.partitions), dtype=np.int32)
        self.seg = seg_of[part]
        if whole:
            # Whole partitions (the loader's cache): a row's index is its row in the
            # partition.
            self.row = rows - offsets[part]
            self.rows = [np.arange(offsets[p + 1] - offsets[p], dtype=np.int64)
                         for p in self.partitions]
            return
        sizes = offsets[self.partitions + 1] - offsets[self.partitions]
        # Where each present partition starts in the marks (partitions in table order).
        base = np.zeros(len(offsets) - 1, np.int64)
        base[self.partitions] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        compact = base[part] + (rows - offsets[part])
        marks = np.zeros(int(sizes.sum()), bool)
        marks[compact] = True
        rank_of = np.cumsum(marks, dtype=np.int64) - 1  # index among the distinct rows
        firsts = rank_of[base[self.partitions] + sizes - 1] + 1  # distinct rows so far
        seg_start = np.concatenate([[0], firsts[:-1]])
        self.rows = [
            np.flatnonzero(marks[b:b + k]).astype(np.int64)
            for b, k in zip(base[self.partitions], sizes, strict=True)]
        self.row = rank_of[compact] - seg_start[self.seg]
