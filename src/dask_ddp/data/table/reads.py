"""The reads of a rank's windows (internal): the reader of the table's source and the
partitions kept across epochs.

The reader is :class:`~dask_ddp.data.table.fetch.DaskReader` for a Dask table and
:class:`~dask_ddp.data.table.parquet.ParquetReader` for Parquet, made on first use; both
follow one protocol: ``start(partitions, rows)`` begins the reads of those rows (one
pending read per partition), ``finish(pending)`` waits for one and returns its records,
``cancel(pending)`` drops one not finished.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from dask_ddp.data.table.columns import Column, record_layout

if TYPE_CHECKING:
    from dask_ddp.data.table.table import Table
    from dask_ddp.data.table.window import Window

__all__ = ["WindowReads", "cache_wanted"]

logger = logging.getLogger(__name__)


def cache_wanted(cache: bool | None, table: Table, columns: list[Column], rank: int) -> bool:
    """Whether to keep the partitions read across epochs: ``cache`` if given, else
    when the rows the loader reads fit ``dask-ddp.data.table-cache``."""
    if cache is not None:
        return bool(cache)
    from dask_ddp import _config

    value = _config.get("dask-ddp.data.table-cache")
    need = len(table) * record_layout(columns)[1]
    if value in (False, None, 0, "0", "off"):
        return False
    if value == "auto":
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        budget = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (4 * local)
    else:
        budget = _config.positive_bytes("dask-ddp.data.table-cache", allow_zero=True)
    if rank == 0:
        logger.info("table cache: %s (%d MB of rows for %d MB allowed per rank)",
                    "on" if need <= budget else "off", need >> 20, budget >> 20)
    return need <= budget


class WindowReads:
    """A rank's reads of its windows' rows, for one loader.

    Without the cache, each window reads its rows of each partition (started by
    :meth:`request`, finished by :meth:`ready`). With it, a window reads the whole
    partitions not read yet, kept in :attr:`cache` for the rest of the run.

    Parameters
    ----------
    table
        The table read.
    columns
        The columns read, side by side in each record.
    cache
        Keep whole partitions across epochs.
    """

    def __init__(self, table: Table, columns: list[Column], *, cache: bool) -> None:
        self.table = table
        self.columns = columns
        #: Whole partitions kept in this process across epochs (partition -> records, or
        #: the started read of them); None: rows are read window by window each epoch.
        self.cache: dict[int, Any] | None = {} if cache else None
        self._reader: Any = None
        self._reader_lock = threading.Lock()
        if table.source == "dask":
            # Connect to the scheduler now, while the training function builds its model:
            # the first batch does not wait for it.
            threading.Thread(target=self._warm, name="dask-ddp-table-connect",
                             daemon=True).start()

    def _warm(self) -> None:
        with contextlib.suppress(Exception):  # the first read raises it again, in context
            self.reader()

    def reader(self) -> Any:
        """The reader of the table's source (made on first use)."""
        with self._reader_lock:
            if self._reader is None:
                if self.table.source == "parquet":
                    from dask_ddp.data.table.parquet import ParquetReader

                    self._reader = ParquetReader(self.table, self.columns)
                else:
                    from dask_ddp.data.table.fetch import DaskReader

                    self._reader = DaskReader(self.table, self.columns)
            return self._reader

    def request(self, win: Window) -> None:
        """Start the window's reads (the partitions not cached yet, with the cache)."""
        reader = self.reader()
        if self.cache is None:
            win.pending = reader.start([int(p) for p in win.partitions], win.rows)
            return
        todo = [i for i, p in enumerate(win.partitions) if int(p) not in self.cache]
        if todo:
            started = reader.start([int(win.partitions[i]) for i in todo],
                                   [win.rows[i] for i in todo])
            for pend in started:
                self.cache[pend.partition] = pend

    def _cached(self, win: Window) -> list[np.ndarray]:
        """The window's whole partitions from the cache, read (or finished) when missing."""
        assert self.cache is not None
        reader = self.reader()
        data = []
        for part, rows in zip(win.partitions, win.rows, strict=True):
            p = int(part)
            entry = self.cache.get(p)
            if entry is None or not isinstance(entry, np.ndarray):
                try:
                    if entry is None:
                        entry = reader.start([p], [rows])[0]
                    entry = reader.finish(entry)
                except BaseException:
                    self.cache.pop(p, None)  # read again on the next request
                    raise
                self.cache[p] = entry
            data.append(entry)
        return data

    def ready(self, win: Window) -> list[np.ndarray]:
        """The window's pieces (records), one per partition, waiting for their reads."""
        if win.data is None and self.cache is not None:
            win.data = self._cached(win)
        if win.data is None:
            reader = self.reader()
            pending, win.pending = win.pending, []
            try:
                win.data = [reader.finish(p) for p in pending]
            finally:
                for p in pending:
                    reader.cancel(p)  # the ones not finished (an error)
        return win.data

    def cancel(self, win: Window) -> None:
        """Drop the window's reads not finished (its batches will not be gathered)."""
        for p in win.pending:
            self._reader.cancel(p)

    def close(self) -> None:
        """Drop the cached partitions, cancelling the reads of those not read yet."""
        if self.cache:
            cache, self.cache = self.cache, {}
            for entry in cache.values():
                if not isinstance(entry, np.ndarray) and self._reader is not None:
                    self._reader.cancel(entry)
