"""A rank's epoch gathered into batches on a background thread (internal).

The rank's rows are cut into batches; each batch's rows lie in one window or a few
consecutive ones (:class:`~dask_ddp.data.table.window.Window`). A window's reads start
two windows ahead of the batch being gathered, and a window is dropped (its rows freed)
once its batches are out. Each batch is gathered in C++ (:class:`dask_ddp._core.TableWindow`,
GIL released) into tensors that own their buffers and put in a bounded queue, the
loader's prefetch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dask_ddp.data.table.layout import BatchLayout
from dask_ddp.data.table.reads import WindowReads
from dask_ddp.data.table.window import Window

__all__ = ["POLL_S", "EpochBatches"]

logger = logging.getLogger(__name__)

#: Seconds between checks of a stopped iteration while waiting on the gather thread.
POLL_S = 0.5


@dataclasses.dataclass(frozen=True, eq=False)
class EpochBatches:
    """The gather thread's work for one loader: an epoch's batches into a queue.

    Attributes
    ----------
    layout, reads
        The batches' layout and the reads of the windows' rows.
    pool
        The engine's gather threads (:class:`dask_ddp._core.GatherPool`).
    offsets
        The table's partition offsets (the first row of each partition, then the rows).
    batch_size, drop_last
        As the loader's.
    rank, shuffle
        For the log of the epoch's plan (rank 0 logs it).
    """

    layout: BatchLayout
    reads: WindowReads
    pool: Any
    offsets: np.ndarray
    batch_size: int
    drop_last: bool
    rank: int
    shuffle: bool | str

    def produce(self, out: queue.Queue[Any], stop: threading.Event, start: int, epoch: int,
                rank_rows: Callable[[], tuple[np.ndarray, np.ndarray]]) -> None:
        """The gather thread: batches ``(index, batch)`` from ``start`` on into ``out``,
        then None (or the exception that ended it); ``rank_rows`` gives the epoch's rows
        and window ids."""
        windows: dict[int, Window] = {}
        try:
            self._gather(out, stop, start, epoch, rank_rows(), windows)
            if not stop.is_set():
                out.put(None)
        except BaseException as exc:  # handed to the consumer, which raises it
            with contextlib.suppress(Exception):
                out.put(exc, timeout=60)
        finally:
            for win in windows.values():
                self.reads.cancel(win)

    def _gather(self, out: queue.Queue[Any], stop: threading.Event, start: int, epoch: int,
                rank_rows: tuple[np.ndarray, np.ndarray], windows: dict[int, Window]) -> None:
        rows, wins = rank_rows
        n = len(rows)
        nb = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        if self.rank == 0 and start == 0:
            parts = np.searchsorted(self.offsets, rows, side="right") - 1
            logger.info("table plan, epoch %d (shuffle=%r): %d rows per rank in %d batches, "
                        "%d windows; rank 0 reads %d partitions", epoch, self.shuffle, n,
                        nb, int(np.count_nonzero(np.diff(wins))) + 1 if n else 0,
                        int(np.count_nonzero(np.bincount(parts, minlength=1))))
        bounds = (np.flatnonzero(np.diff(wins)) + 1).tolist()
        starts: list[int] = [0, *bounds]
        ends: list[int] = [*bounds, n]

        def window(w: int) -> Window:
            if w not in windows:
                windows[w] = Window(rows[starts[w]:ends[w]], self.offsets,
                                    whole=self.reads.cache is not None)
                self.reads.request(windows[w])
            return windows[w]

        cached: tuple[tuple[int, ...], Any] | None = None
        w0 = 0
        for b in range(start, nb):
            lo, hi = b * self.batch_size, min(n, (b + 1) * self.batch_size)
            while ends[w0] <= lo:
                w0 += 1
            w1 = w0
            while ends[w1] < hi:
                w1 += 1
            for w in [w for w in windows if w < w0]:
                del windows[w]  # its batches are out: its rows are freed
            used = [window(w) for w in range(w0, w1 + 1)]
            for ahead in (w1 + 1, w1 + 2):
                if ahead < len(starts):
                    window(ahead)  # the next windows are read while this one is gathered
            key = tuple(range(w0, w1 + 1))
            if cached is None or cached[0] != key:
                cached = (key, self._engine_window(used))
            if w0 == w1:  # the common case: slices, no copy
                seg, row = used[0].seg[lo - starts[w0]:hi - starts[w0]], \
                    used[0].row[lo - starts[w0]:hi - starts[w0]]
            else:
                seg_idx, row_idx = [], []
                base = 0
                for w, win in zip(range(w0, w1 + 1), used, strict=True):
                    a, z = max(lo, starts[w]), min(hi, ends[w])
                    if a < z:
                        seg_idx.append(win.seg[a - starts[w]:z - starts[w]] + base)
                        row_idx.append(win.row[a - starts[w]:z - starts[w]])
                    base += len(win.partitions)
                seg = np.concatenate(seg_idx).astype(np.int32, copy=False)
                row = np.concatenate(row_idx).astype(np.int64, copy=False)
            tensors = cached[1].gather(self.pool, seg, row)
            item = (b, self.layout.assemble(tensors))
            while not stop.is_set():
                try:
                    out.put(item, timeout=POLL_S)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return

    def _engine_window(self, used: list[Window]) -> Any:
        """The engine's window over the segments of ``used`` (waiting for their rows)."""
        segs, names, nrows = [], [], []
        for win in used:
            for p, rows, seg in zip(win.partitions, win.rows, self.reads.ready(win),
                                    strict=True):
                segs.append(seg)
                names.append(f"partition {int(p)}")
                nrows.append(len(rows))
        return self.layout.window(segs, names, nrows)
