"""A rank's epoch handed to the engine window by window, on a background thread
(internal).

The rank's rows are cut into batches; each batch's rows lie in one window or a few
consecutive ones (:class:`~dask_ddp.data.table.window.Window`). A window's reads start
ahead of the window being gathered, and a window is dropped (its rows freed) once its
batches are out. The batches of each window go to the engine in one call
(:class:`dask_ddp._core.TableBatches`): its own thread gathers them (GIL released) into
tensors that own their buffers, ``prefetch`` batches ahead of the training loop, whose
only work per batch is one call; a batch across windows goes alone, over their segments.
"""

from __future__ import annotations

import dataclasses
import logging
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
    """The feeding thread's work for one loader: an epoch's windows into the engine.

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

    def stream(self, prefetch: int) -> Any:
        """A new engine stream for one iteration."""
        return self.layout.stream(self.pool, self.batch_size, prefetch)

    def produce(self, stream: Any, stop: threading.Event, start: int, epoch: int,
                rank_rows: Callable[[], tuple[np.ndarray, np.ndarray]],
                errors: list[BaseException]) -> None:
        """The feeding thread: the batches from ``start`` on into ``stream``, then its
        end; an exception that ended it goes to ``errors`` (the consumer raises it after
        the batches before it). ``rank_rows`` gives the epoch's rows and window ids."""
        windows: dict[int, Window] = {}
        try:
            self._feed(stream, stop, start, epoch, rank_rows(), windows)
        except BaseException as exc:  # handed to the consumer, which raises it
            if not stop.is_set():
                errors.append(exc)
        finally:
            stream.finish()
            for win in windows.values():
                self.reads.cancel(win)

    def _feed(self, stream: Any, stop: threading.Event, start: int, epoch: int,
              rank_rows: tuple[np.ndarray, np.ndarray], windows: dict[int, Window]) -> None:
        rows, wins = rank_rows
        n = len(rows)
        bs = self.batch_size
        nb = n // bs if self.drop_last else -(-n // bs)
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

        w0 = 0
        b = start
        while b < nb and not stop.is_set():
            lo, hi = b * bs, min(n, (b + 1) * bs)
            while ends[w0] <= lo:
                w0 += 1
            w1 = w0
            while ends[w1] < hi:
                w1 += 1
            for w in [w for w in windows if w < w0]:
                del windows[w]  # its batches are queued: the engine holds its rows
            used = [window(w) for w in range(w0, w1 + 1)]
            if w1 + 1 < len(starts):
                # The next window is read while this one waits and is gathered (and the
                # engine gathers the one queued before it).
                window(w1 + 1)
            if w0 == w1:  # the batches inside this window, in one call: slices, no copy
                b_end = nb if ends[w0] >= n else max(b + 1, ends[w0] // bs)
                z = min(n, b_end * bs)
                seg = used[0].seg[lo - starts[w0]:z - starts[w0]]
                row = used[0].row[lo - starts[w0]:z - starts[w0]]
            else:  # one batch across windows, over their segments side by side
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
                b_end = b + 1
            stream.push(self._engine_window(used), np.ascontiguousarray(seg, np.int32),
                        np.ascontiguousarray(row, np.int64))
            b = b_end

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
