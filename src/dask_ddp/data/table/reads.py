"""The reads of a rank's windows (internal): the reader of the table's source and the
partitions kept across epochs.

The reader is :class:`~dask_ddp.data.table.fetch.DaskReader` for a Dask table and
:class:`~dask_ddp.data.table.parquet.ParquetReader` for Parquet, made on first use; both
follow one protocol: ``start(partitions, rows)`` begins the reads of those rows (one
pending read per partition), ``finish(pending)`` waits for one and returns its records,
``cancel(pending)`` drops one not finished.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from dask_ddp.data.table.columns import Column, record_layout

if TYPE_CHECKING:
    from dask_ddp.data.table.host_cache import HostCache
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
        # One copy per host when the host's cache can hold it, else one per local rank.
        from dask_ddp.data.table.host_cache import host_root

        local = 1 if os.environ.get("DASK_DDP_JOB_ID") and host_root() else \
            max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        budget = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (4 * local)
    else:
        budget = _config.positive_bytes("dask-ddp.data.table-cache", allow_zero=True)
    if rank == 0:
        logger.info("table cache: %s (%d MB of rows for %d MB allowed)",
                    "on" if need <= budget else "off", need >> 20, budget >> 20)
    return need <= budget


#: Seconds a rank waits for another local rank's read of a partition before reading it
#: itself (a rank that died releases its lock at once).
HOST_WAIT_S = 600.0


class _Claimed:
    """A read this rank started for the host cache (it holds the partition's lock);
    ``written``: the reader writes the host's file itself (a Dask table's)."""

    def __init__(self, pending: Any, written: bool) -> None:
        self.pending, self.written = pending, written
        self.partition = pending.partition


#: A partition another local rank is reading for the host cache.
_WAITING = "waiting"


class WindowReads:
    """A rank's reads of its windows' rows, for one loader.

    Without the cache, each window reads its rows of each partition (started by
    :meth:`request`, finished by :meth:`ready`). With it, a window reads the whole
    partitions not read yet, kept in :attr:`cache` for the rest of the run: in the
    host's cache (:mod:`~dask_ddp.data.table.host_cache`) when there is one, so that the
    local ranks read each partition once between them, else in this process.

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
        #: Whole partitions kept across epochs (partition -> records, or the started
        #: read of them); None: rows are read window by window each epoch.
        self.cache: dict[int, Any] | None = {} if cache else None
        #: Partitions (or pieces of them) this rank read from the table's source.
        self.fetched = 0
        #: The host's cache this rank takes part in (None: the cache is this process's).
        self.host: HostCache | None = None
        self._join_host = cache  # (again) at the next request
        self._reader: Any = None
        self._reader_lock = threading.Lock()
        if table.source == "dask":
            # Connect to the scheduler now, while the training function builds its model:
            # the first batch does not wait for it. Its modules are imported here, not in
            # the thread: a module two threads import at once can be seen half made by one
            # of them (an ImportError "partially initialized module" in the training loop).
            import distributed  # noqa: F401

            from dask_ddp.data.table import fetch  # noqa: F401

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

    def _start(self, partitions: list[int], rows: list[np.ndarray]) -> list[Any]:
        self.fetched += len(partitions)
        return list(self.reader().start(partitions, rows))

    def _start_cached(self, partitions: list[int], rows: list[np.ndarray]) -> list[Any]:
        """Start the reads of whole partitions for the cache: plain reads, or with the
        host's cache (this rank holds their locks) claimed ones, whose file a Dask
        table's worker writes itself (no copy here)."""
        host = self.host
        if host is None:
            return self._start(partitions, rows)
        if self.table.source != "dask":
            return [_Claimed(p, False) for p in self._start(partitions, rows)]
        into = [(host.temp_path(p), host.path(p)) for p in partitions]
        try:
            started = self.reader().start(partitions, rows, into)
        except OSError as exc:  # no room for the files: read here, kept in this rank
            logger.warning("table cache: %s", exc)
            return [_Claimed(p, False) for p in self._start(partitions, rows)]
        self.fetched += len(partitions)
        return [_Claimed(p, True) for p in started]

    def request(self, win: Window) -> None:
        """Start the window's reads (the partitions not cached yet, with the cache)."""
        self._join()
        if self.cache is None:
            win.pending = self._start([int(p) for p in win.partitions], win.rows)
            return
        todo = [i for i, p in enumerate(win.partitions) if int(p) not in self.cache
                and not self._from_host(int(p))]
        if todo:
            for entry in self._start_cached([int(win.partitions[i]) for i in todo],
                                            [win.rows[i] for i in todo]):
                self.cache[entry.partition] = entry

    def _join(self) -> None:
        """Take part in the host's cache (at the first read, and again after close)."""
        if self._join_host:
            from dask_ddp.data.table.host_cache import HostCache

            self._join_host = False
            self.host = HostCache.open(self.table, self.columns,
                                       record_layout(self.columns)[1])
            if self.host is not None:
                atexit.register(self.host.close)

    def _from_host(self, p: int) -> bool:
        """Whether the host cache serves partition ``p`` (mapped into :attr:`cache`, or
        being read by another local rank): False when this rank is to read it (its lock
        taken)."""
        host = self.host
        if host is None:
            return False
        assert self.cache is not None
        records = host.get(p)
        if records is None and host.claim(p, 0):
            records = host.get(p)  # written just before the lock was taken
            if records is None:
                return False
            host.release(p)
        self.cache[p] = _WAITING if records is None else records
        return True

    def _cached(self, win: Window) -> list[np.ndarray]:
        """The window's whole partitions from the cache, read (or finished) when missing."""
        assert self.cache is not None
        self._join()
        data = []
        for i, part in enumerate(win.partitions):
            p = int(part)
            entry = self.cache.get(p)
            if not isinstance(entry, np.ndarray):
                try:
                    entry = self._resolve(p, entry, win.rows[i])
                except BaseException:
                    self._drop(p)  # read again on the next request
                    raise
                self.cache[p] = entry
            data.append(entry)
        return data

    def _resolve(self, p: int, entry: Any, rows: np.ndarray) -> np.ndarray:
        """Partition ``p``'s records, from its cache entry (None: not requested)."""
        reader = self.reader()
        if entry is None:
            if self._from_host(p):
                entry = self.cache[p] if self.cache is not None else None
                if isinstance(entry, np.ndarray):
                    return entry
            else:
                entry = self._start_cached([p], [rows])[0]
        if entry is _WAITING:
            return self._wait(p, rows)
        if isinstance(entry, _Claimed):
            return self._publish(p, reader.finish(entry.pending), entry.written)
        return np.asarray(reader.finish(entry))

    def _wait(self, p: int, rows: np.ndarray) -> np.ndarray:
        """Partition ``p`` once the local rank reading it wrote it (or read here, when
        that rank died or held it beyond HOST_WAIT_S)."""
        assert self.host is not None
        # Finish this rank's own reads first: no local rank then waits on this one while
        # it waits, whatever order the ranks' windows take.
        cache = self.cache
        assert cache is not None
        for q, e in list(cache.items()):
            if isinstance(e, _Claimed):
                try:
                    cache[q] = self._publish(q, self.reader().finish(e.pending), e.written)
                except BaseException:
                    self._drop(q)
                    raise
        if self.host.held_here(p):
            pass  # another Loader of this process reads it, maybe never to the end: here
        elif self.host.claim(p, HOST_WAIT_S):
            records = self.host.get(p)
            if records is not None:
                self.host.release(p)
                return records
        else:
            logger.warning("table cache: another rank of this host held partition %d for "
                           "%.0f s; reading it here", p, HOST_WAIT_S)
        return self._publish(p, self.reader().finish(self._start([p], [rows])[0]))

    def _publish(self, p: int, records: np.ndarray, written: bool = False) -> np.ndarray:
        """Records this rank read, into the host cache (mapped from there; ``written``:
        they are the host's file already), its lock released; kept in this process when
        the host has no room."""
        assert self.host is not None
        try:
            return records if written else self.host.put(p, records)
        except OSError as exc:
            logger.warning("table cache: partition %d kept in this rank only: %s", p, exc)
            return np.asarray(records)
        finally:
            self.host.release(p)

    def _drop(self, p: int) -> None:
        """Forget partition ``p``'s entry (a read that failed), releasing its lock."""
        entry = (self.cache or {}).pop(p, None)
        if isinstance(entry, _Claimed) and self._reader is not None:
            self._reader.cancel(entry.pending)
        if self.host is not None:
            self.host.release(p)

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
        """Drop the cached partitions, cancelling the reads of those not read yet, and
        leave the host cache."""
        if self.cache:
            cache, self.cache = self.cache, {}
            for entry in cache.values():
                if isinstance(entry, _Claimed):
                    entry = entry.pending
                if not isinstance(entry, (np.ndarray, str)) and self._reader is not None:
                    self._reader.cancel(entry)
        if self.host is not None:
            host, self.host = self.host, None
            atexit.unregister(host.close)
            host.close()
            self._join_host = True
