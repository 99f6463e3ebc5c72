"""A rank's epoch handed to the engine window by window, on a background thread
(internal).

The rank's rows are cut into batches; each batch's rows lie in one window or a few
consecutive ones (:class:`~dask_ddp.data.table.window.Window`). A window's reads start
ahead of the window being gathered, and a window is dropped (its rows freed) once its
batches are out. The batches of each window go to the engine in one call
(:class:`dask_ddp._core.TableBatches`): its own thread gathers them (GIL released) into
the device stage's lent buffers or its own, ``prefetch`` batches ahead of the loop, whose
only work per batch is one call (or, for a rank with one core, that call gathers the
batch); a batch across windows goes alone, over their segments.
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


@dataclasses.dataclass(eq=False)
class _EpochStart:
    """What an epoch's feeding starts from (made ahead while the epoch before runs)."""

    epoch: int
    rows: np.ndarray
    starts: list[int]  # each window's first position
    ends: list[int]
    first: Window  # the first window, reads not started
    engine: Any = None  # the engine's window over the first one, when cached


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
    gather_ahead
        Gather batches ahead on the engine's thread; False: in the training loop's
        thread, at each batch (a rank with one core: no hand-over between threads).
    """

    layout: BatchLayout
    reads: WindowReads
    pool: Any
    offsets: np.ndarray
    batch_size: int
    drop_last: bool
    rank: int
    shuffle: bool | str
    gather_ahead: bool = True
    #: The next epoch's start, made ahead by the feeding thread (epoch -> start).
    ahead: dict[int, _EpochStart] = dataclasses.field(default_factory=dict)

    def stream(self, prefetch: int) -> Any:
        """A new engine stream for one iteration."""
        return self.layout.stream(self.pool, self.batch_size, prefetch, self.gather_ahead)

    def produce(self, stream: Any, stop: threading.Event, start: int, epoch: int,
                rank_rows: Callable[[], tuple[np.ndarray, np.ndarray]],
                errors: list[BaseException],
                ahead: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        """The feeding thread: the batches from ``start`` on into ``stream``, then its
        end; an exception that ended it goes to ``errors`` (the consumer raises it after
        the batches before it). ``rank_rows`` gives the epoch's rows and window ids;
        ``ahead``, the next epoch's, made while this one is gathered."""
        windows: dict[int, Window] = {}
        try:
            self._feed(stream, stop, start, epoch, rank_rows(), windows, ahead)
        except BaseException as exc:  # handed to the consumer, which raises it
            if not stop.is_set():
                errors.append(exc)
        finally:
            stream.finish()
            for win in windows.values():
                self.reads.cancel(win)

    def _epoch_start(self, epoch: int, rank_rows: tuple[np.ndarray, np.ndarray]
                     ) -> _EpochStart:
        """The epoch's windows' bounds and its first window (no reads started)."""
        rows, wins = rank_rows
        n = len(rows)
        # Where each window after the first starts (the ids are non-decreasing): a search
        # per window, not a pass over the rows.
        bounds = np.unique(np.searchsorted(wins, np.arange(wins[0] + 1, wins[-1] + 1))
                           ).tolist() if n else []
        starts: list[int] = [0, *bounds]
        ends: list[int] = [*bounds, n]
        first = Window(rows[starts[0]:ends[0]], self.offsets,
                       whole=self.reads.cache is not None)
        return _EpochStart(epoch, rows, starts, ends, first)

    def _prepare(self, epoch: int, ahead: Callable[[], tuple[np.ndarray, np.ndarray]]
                 ) -> None:
        """Make epoch ``epoch``'s start ahead: its rows, windows and first window, and
        with every partition of that window cached, the engine's window over it."""
        try:
            es = self._epoch_start(epoch, ahead())
            cache = self.reads.cache
            if cache is not None and all(isinstance(cache.get(int(p)), np.ndarray)
                                         for p in es.first.partitions):
                es.engine = self._engine_window([es.first])
        except Exception as exc:  # noqa: BLE001 - made again (and raised) when it starts
            logger.debug("the next epoch's start could not be made ahead: %s", exc)
            return
        self.ahead.clear()
        self.ahead[epoch] = es

    def _feed(self, stream: Any, stop: threading.Event, start: int, epoch: int,
              rank_rows: tuple[np.ndarray, np.ndarray], windows: dict[int, Window],
              ahead: Callable[[], tuple[np.ndarray, np.ndarray]] | None) -> None:
        es = self.ahead.pop(epoch, None)
        self.ahead.clear()
        if es is None or es.rows is not rank_rows[0]:
            es = self._epoch_start(epoch, rank_rows)
        rows, starts, ends = es.rows, es.starts, es.ends
        n = len(rows)
        bs = self.batch_size
        nb = n // bs if self.drop_last else -(-n // bs)
        if self.rank == 0 and start == 0:
            logger.info("table plan, epoch %d (shuffle=%r): %d rows per rank in %d batches, "
                        "%d windows", epoch, self.shuffle, n, nb, len(starts) if n else 0)

        def window(w: int) -> Window:
            if w not in windows:
                windows[w] = es.first if w == 0 else \
                    Window(rows[starts[w]:ends[w]], self.offsets,
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
            engine = es.engine if w0 == w1 == 0 and es.engine is not None else \
                self._engine_window(used)
            stream.push(engine, np.ascontiguousarray(seg, np.int32),
                        np.ascontiguousarray(row, np.int64))
            if ahead is not None:
                # The engine gathers the first batches meanwhile.
                self._prepare(epoch + 1, ahead)
                ahead = None
            b = b_end

    def _engine_window(self, used: list[Window]) -> Any:
        """The engine's window over the segments of ``used`` (waiting for their rows)."""
        segs, names, nrows = [], [], []
        for win in used:
            for p, size, seg in zip(win.partitions, win.sizes, self.reads.ready(win),
                                    strict=True):
                segs.append(seg)
                names.append(f"partition {int(p)}")
                nrows.append(int(size))
        return self.layout.window(segs, names, nrows)
