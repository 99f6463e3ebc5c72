"""A window of a rank's epoch (data/table/window.py): its pieces and positions, numpy
alone (no cluster)."""

from __future__ import annotations

import numpy as np
import pytest

from dask_ddp.data.table.window import Window


@pytest.mark.parametrize("whole", [False, True])
def test_window_pieces_and_positions_match_a_sort(whole: bool) -> None:
    """A window's pieces (distinct rows of each partition, sorted) and each position's
    (piece, row) agree with np.unique, repeats and empty partitions included."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        counts = rng.integers(0, 40, rng.integers(1, 8))
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if offsets[-1] == 0:
            continue
        rows = rng.integers(0, offsets[-1], rng.integers(1, 3 * offsets[-1] + 1))
        w = Window(rows.astype(np.int64), offsets, whole=whole)
        parts = np.searchsorted(offsets, np.unique(rows), side="right") - 1
        assert w.partitions.tolist() == sorted(set(parts.tolist()))
        for p, piece in zip(w.partitions, w.rows, strict=True):
            if whole:
                assert piece.tolist() == list(range(counts[p]))
            else:
                want = np.unique(rows[(rows >= offsets[p]) & (rows < offsets[p + 1])])
                assert piece.tolist() == (want - offsets[p]).tolist()
        got = [offsets[w.partitions[s]] + w.rows[s][r] for s, r in zip(w.seg, w.row,
                                                                        strict=True)]
        assert got == rows.tolist()
