"""The Loader over a :class:`~dask_ddp.data.Table` (internal; made by
:class:`dask_ddp.data.Loader` when given a table).

Per epoch, the rank's rows come from the epoch plan (:mod:`dask_ddp.data.table.plan`);
they are read window by window, one piece per partition (:mod:`~dask_ddp.data.table.fetch`
for Dask tables, :mod:`~dask_ddp.data.table.parquet` for Parquet), the next window
requested while the current one is gathered. A background thread gathers each batch in
C++ (:class:`dask_ddp._core.TableWindow`, GIL released) into tensors that own their
buffers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from dask_ddp import _core
from dask_ddp._identity import cores_per_rank
from dask_ddp.data.table import plan
from dask_ddp.data.table.columns import Column, record_layout
from dask_ddp.data.table.table import Table
from dask_ddp.data.world import rank_and_world

__all__ = ["TableLoader"]

logger = logging.getLogger(__name__)

_SHUFFLES = (True, False, "local")
#: Seconds between checks of a stopped iteration while waiting on the gather thread.
_POLL_S = 0.5
_DLPACK_CODE = {"i": 0, "u": 1, "f": 2, "b": 6}


class _Window:
    """The rows of one window of a rank's epoch: per partition, its sorted rows.

    Linear in the window's rows and its partitions' sizes (no sort): a mark per row of
    the window's partitions, laid end to end in partition order; the marked ones are the
    distinct rows in table order, and a running count of the marks gives each position
    its row inside its partition's piece.
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


class TableLoader:
    """Batches of a :class:`Table` in a rank; see :class:`dask_ddp.data.Loader`."""

    def __init__(self, table: Table, batch_size: int, *, shuffle: bool | str = True,
                 seed: int = 0, features: Sequence[str] | None = None,
                 label: str | None = None, drop_last: bool = False, rank: int | None = None,
                 world_size: int | None = None, num_threads: int | None = None,
                 prefetch: int = 4, window: int = 4, cache: bool | None = None) -> None:
        if shuffle not in _SHUFFLES or isinstance(shuffle, int) and not isinstance(shuffle, bool):
            raise ValueError(f"shuffle must be True, False or 'local', got {shuffle!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if prefetch < 1 or window < 1:
            raise ValueError(f"prefetch and window must be >= 1, got {prefetch}, {window}")
        rank, world_size = rank_and_world(rank, world_size)
        self.table = table
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self.prefetch = int(prefetch)
        self.window = int(window)
        self.num_threads = int(num_threads or cores_per_rank())
        self.epoch = 0
        self._start = 0  # batch to start the next iteration at
        self._position = 0  # batches handed out in the current epoch
        self._resume: dict[str, Any] | None = None  # a state saved on another world size
        self._outputs, self._columns = self._output_layout(features, label)
        self._offsets = np.concatenate([[0], np.cumsum(np.asarray(table.partition_rows,
                                                                  np.int64))])
        self._pieces: list[list[tuple[int, int, int]]] | None = None
        self._rows_cache: tuple[Any, tuple[np.ndarray, np.ndarray]] | None = None
        if shuffle == "local":
            self._pieces = self._local_pieces()
        self._pool = _core.GatherPool(self.num_threads)
        #: Whole partitions kept in this process across epochs (partition -> records, or
        #: the started read of them); None: rows are read window by window each epoch.
        self._cache: dict[int, Any] | None = {} if self._use_cache(cache) else None
        self._reader: Any = None
        self._reader_lock = threading.Lock()
        self._stop: threading.Event | None = None
        if table.source == "dask":
            # Connect to the scheduler now, while the training function builds its model:
            # the first batch does not wait for it.
            threading.Thread(target=self._warm, name="dask-ddp-table-connect",
                             daemon=True).start()

    def _use_cache(self, cache: bool | None) -> bool:
        """Whether to keep the partitions read across epochs: ``cache`` if given, else
        when the rows this loader reads fit ``dask-ddp.data.table-cache``."""
        if cache is not None:
            return bool(cache)
        from dask_ddp import _config

        value = _config.get("dask-ddp.data.table-cache")
        need = len(self.table) * record_layout(self._columns)[1]
        if value in (False, None, 0, "0", "off"):
            return False
        if value == "auto":
            local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
            budget = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (4 * local)
        else:
            budget = _config.positive_bytes("dask-ddp.data.table-cache", allow_zero=True)
        if self.rank == 0:
            logger.info("table cache: %s (%d MB of rows for %d MB allowed per rank)",
                        "on" if need <= budget else "off", need >> 20, budget >> 20)
        return need <= budget

    def _warm(self) -> None:
        with contextlib.suppress(Exception):  # the first read raises it again, in context
            self._get_reader()

    # -- layout of the batches ------------------------------------------------------------
    def _output_layout(self, features: Sequence[str] | None, label: str | None
                       ) -> tuple[list[dict[str, Any]], list[Column]]:
        """The outputs (one tensor each) and the columns read."""
        t = self.table
        if features is None and label is None:
            self._tuple = False
            cols = [t.column(n) for n in t.columns]
            return [{"name": c.name, "columns": [c]} for c in cols], cols
        self._tuple = True
        if features is None:
            features = [n for n in t.columns if n != label]
        feats = [t.column(n) for n in features]
        if not feats:
            raise ValueError("features is empty")
        outs: list[dict[str, Any]] = []
        if len({c.dtype for c in feats}) == 1:
            outs.append({"name": "x", "columns": feats})  # stacked in C++
        else:
            outs.extend({"name": "x", "columns": [c], "part": True} for c in feats)
        cols = list(feats)
        if label is not None:
            lab = t.column(label)
            outs.append({"name": "y", "columns": [lab]})
            if lab not in cols:
                cols.append(lab)
        return outs, cols

    def _window_obj(self, segments: list[np.ndarray], names: list[str],
                    nrows: list[int]) -> Any:
        """The engine's window over segments of records (``self._columns`` side by side)."""
        src_offsets, record = record_layout(self._columns)
        where = {c.name: off for c, off in zip(self._columns, src_offsets, strict=True)}
        bufs = [seg.reshape(-1) for seg in segments]
        specs: list[list[Any]] = []
        outputs = []
        for o, out in enumerate(self._outputs):
            offset = 0
            for c in out["columns"]:
                last = specs[-1] if specs else None
                if last is not None and last[4] == o and last[3] + last[1] == where[c.name]:
                    last[1] += c.row_bytes  # adjacent in the record and the output: one copy
                    last[0] += f"+{c.name}"
                else:
                    specs.append([c.name, c.row_bytes, record, where[c.name], o, offset, bufs])
                offset += c.row_bytes
            c0 = out["columns"][0]
            dt = np.dtype(c0.dtype)
            # One column keeps its row shape; stacked columns make one row of their widths.
            width = sum(int(np.prod(c.shape)) for c in out["columns"])
            tail = list(c0.shape) if len(out["columns"]) == 1 else [width]
            outputs.append((_DLPACK_CODE[dt.kind], dt.itemsize * 8, tail, offset))
        return _core.TableWindow([tuple(x) for x in specs], names, nrows, outputs)

    def _assemble(self, tensors: list[torch.Tensor]) -> Any:
        if not self._tuple:
            return {o["name"]: t for o, t in zip(self._outputs, tensors, strict=True)}
        xs = [t for o, t in zip(self._outputs, tensors, strict=True) if o["name"] == "x"]
        if len(xs) == 1:
            x = xs[0]
        else:
            dtype = xs[0].dtype
            for t in xs[1:]:
                dtype = torch.promote_types(dtype, t.dtype)
            x = torch.cat([t.reshape(len(t), -1).to(dtype) for t in xs], 1)
        if self._outputs[-1]["name"] != "y":
            return x
        return x, tensors[-1]

    # -- the plan -------------------------------------------------------------------------
    def _local_pieces(self) -> list[list[tuple[int, int, int]]]:
        """Each rank's rows for shuffle="local", from the ranks' workers (gathered once)."""
        me = os.environ.get("DASK_DDP_WORKER", "")
        workers = [me] * self.world_size
        if self.world_size > 1 and torch.distributed.is_available() \
                and torch.distributed.is_initialized():
            got: list[Any] = [None] * self.world_size
            torch.distributed.all_gather_object(got, me)
            workers = [str(w) for w in got]
        pieces = plan.local_assignment(self.table.partition_rows, self.table.workers,
                                             workers, drop_last=self.drop_last)
        if self.rank == 0:
            local = sum(b - a for r, ps in enumerate(pieces) for p, a, b in ps
                        if self.table.workers[p] == workers[r])
            logger.info("table plan (shuffle='local'): %d ranks, %d of %d rows read on the "
                        "worker holding them; rank 0 pieces: %s", self.world_size, local,
                        sum(b - a for ps in pieces for _, a, b in ps), pieces[0][:8])
        return pieces

    def _sequence(self, epoch: int, world: int) -> plan.EpochSequence:
        counts = self.table.partition_rows
        if self._pieces is not None and world == self.world_size:
            return plan.local_sequence(counts, self._pieces, seed=self.seed,
                                             epoch=epoch, window=self.window)
        return plan.epoch_sequence(counts, world=world, shuffle=bool(self.shuffle),
                                         seed=self.seed, epoch=epoch,
                                         drop_last=self.drop_last, window=self.window)

    def _rank_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows of the current epoch and their window ids (computed once per
        epoch: ``len(loader)`` and the iteration share them)."""
        resume = self._resume if self._resume is not None \
            and self._resume["epoch"] == self.epoch else None
        key = (self.epoch, repr(resume))
        if self._rows_cache is None or self._rows_cache[0] != key:
            self._rows_cache = (key, self._compute_rank_rows(resume))
        return self._rows_cache[1]

    def _compute_rank_rows(self, resume: dict[str, Any] | None
                           ) -> tuple[np.ndarray, np.ndarray]:
        if resume is not None:
            r = resume
            old = self._sequence_for_world(r["world_size"], r.get("pieces"))
            seq = plan.resumed_sequence(old, consumed_per_rank=r["consumed"],
                                              old_world=r["world_size"],
                                              new_world=self.world_size,
                                              drop_last=self.drop_last)
        else:
            seq = self._sequence(self.epoch, self.world_size)
        rows, wins = seq.for_rank(self.rank, self.world_size)
        return np.ascontiguousarray(rows), np.ascontiguousarray(wins)

    def _sequence_for_world(self, world: int, pieces: Any) -> plan.EpochSequence:
        if pieces is not None:
            return plan.local_sequence(self.table.partition_rows,
                                             [[tuple(p) for p in ps] for ps in pieces],
                                             seed=self.seed, epoch=self.epoch,
                                             window=self.window)
        return plan.epoch_sequence(self.table.partition_rows, world=world,
                                         shuffle=bool(self.shuffle), seed=self.seed,
                                         epoch=self.epoch, drop_last=self.drop_last,
                                         window=self.window)

    @property
    def num_samples(self) -> int:
        """Rows this rank reads in the current epoch (padding included)."""
        return len(self._rank_rows()[0])

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        n = self.num_samples
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order (as ``DistributedSampler.set_epoch``); after
        :meth:`load_state_dict`, setting the restored epoch keeps the restored position."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if int(epoch) != self.epoch:
            self._start = 0
            self._resume = None
        self.epoch = int(epoch)

    # -- reading --------------------------------------------------------------------------
    def _get_reader(self) -> Any:
        with self._reader_lock:
            if self._reader is None:
                if self.table.source == "parquet":
                    from dask_ddp.data.table.parquet import ParquetReader

                    self._reader = ParquetReader(self.table, self._columns)
                else:
                    from dask_ddp.data.table.fetch import DaskReader

                    self._reader = DaskReader(self.table, self._columns)
            return self._reader

    def _request(self, win: _Window) -> None:
        """Start the window's reads (the partitions not cached yet, with the cache)."""
        reader = self._get_reader()
        if self._cache is None:
            win.pending = reader.start([int(p) for p in win.partitions], win.rows)
            return
        todo = [i for i, p in enumerate(win.partitions) if int(p) not in self._cache]
        if todo:
            started = reader.start([int(win.partitions[i]) for i in todo],
                                   [win.rows[i] for i in todo])
            for pend in started:
                self._cache[pend.partition] = pend

    def _cached(self, win: _Window) -> list[np.ndarray]:
        """The window's whole partitions from the cache, read (or finished) when missing."""
        assert self._cache is not None
        reader = self._get_reader()
        data = []
        for part, rows in zip(win.partitions, win.rows, strict=True):
            p = int(part)
            entry = self._cache.get(p)
            if entry is None or not isinstance(entry, np.ndarray):
                try:
                    if entry is None:
                        entry = reader.start([p], [rows])[0]
                    entry = reader.finish(entry)
                except BaseException:
                    self._cache.pop(p, None)  # read again on the next request
                    raise
                self._cache[p] = entry
            data.append(entry)
        return data

    def _ready(self, win: _Window) -> list[np.ndarray]:
        if win.data is None and self._cache is not None:
            win.data = self._cached(win)
        if win.data is None:
            reader = self._get_reader()
            pending, win.pending = win.pending, []
            try:
                win.data = [reader.finish(p) for p in pending]
            finally:
                for p in pending:
                    reader.cancel(p)  # the ones not finished (an error)
        return win.data

    def _produce(self, out: queue.Queue[Any], stop: threading.Event, start: int) -> None:
        """The gather thread: batches from ``start`` on into ``out``, then None (or the
        exception that ended it)."""
        windows: dict[int, _Window] = {}
        try:
            self._gather_batches(out, stop, start, windows)
            if not stop.is_set():
                out.put(None)
        except BaseException as exc:  # handed to the consumer, which raises it
            with contextlib.suppress(Exception):
                out.put(exc, timeout=60)
        finally:
            for win in windows.values():
                for p in win.pending:
                    self._reader.cancel(p)

    def _gather_batches(self, out: queue.Queue[Any], stop: threading.Event, start: int,
                        windows: dict[int, _Window]) -> None:
        rows, wins = self._rank_rows()
        n = len(rows)
        nb = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        if self.rank == 0 and start == 0:
            parts = np.searchsorted(self._offsets, rows, side="right") - 1
            logger.info("table plan, epoch %d (shuffle=%r): %d rows per rank in %d batches, "
                        "%d windows; rank 0 reads %d partitions", self.epoch, self.shuffle, n,
                        nb, int(np.count_nonzero(np.diff(wins))) + 1 if n else 0,
                        int(np.count_nonzero(np.bincount(parts, minlength=1))))
        bounds = (np.flatnonzero(np.diff(wins)) + 1).tolist()
        starts: list[int] = [0, *bounds]
        ends: list[int] = [*bounds, n]

        def window(w: int) -> _Window:
            if w not in windows:
                windows[w] = _Window(rows[starts[w]:ends[w]], self._offsets,
                                     whole=self._cache is not None)
                self._request(windows[w])
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
                cached = (key, self._window_of(used))
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
            tensors = cached[1].gather(self._pool, seg, row)
            item = (b, self._assemble(tensors))
            while not stop.is_set():
                try:
                    out.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return

    def _window_of(self, used: list[_Window]) -> Any:
        """The engine's window over the segments of ``used`` (waiting for their rows)."""
        segs, names, nrows = [], [], []
        for win in used:
            for p, rows, seg in zip(win.partitions, win.rows, self._ready(win), strict=True):
                segs.append(seg)
                names.append(f"partition {int(p)}")
                nrows.append(len(rows))
        return self._window_obj(segs, names, nrows)

    def __iter__(self) -> Iterator[Any]:
        start, self._start = self._start, 0
        self._position = start
        out: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        self._stop = stop
        thread = threading.Thread(target=self._produce, args=(out, stop, start),
                                  name=f"dask-ddp-table-{self.rank}", daemon=True)
        t0 = time.monotonic()
        thread.start()
        first = True
        try:
            while True:
                try:
                    item = out.get(timeout=_POLL_S)
                except queue.Empty:
                    if not thread.is_alive() and out.empty():
                        raise RuntimeError("the table's gather thread ended without a batch "
                                           "or an error") from None
                    continue
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                b, batch = item
                if first:
                    first = False
                    logger.debug("rank %d: first batch of epoch %d after %.3f s", self.rank,
                                 self.epoch, time.monotonic() - t0)
                self._position = b + 1
                yield batch
        finally:
            stop.set()
            with contextlib.suppress(queue.Empty):
                while True:
                    out.get_nowait()
            thread.join(timeout=60)

    # -- resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position in the epoch: resuming from it on the same world size yields the
        remaining batches exactly; on another, every row not yet read that epoch."""
        state: dict[str, Any] = {
            "epoch": self.epoch, "batch": self._position, "seed": self.seed,
            "shuffle": self.shuffle, "world_size": self.world_size,
            "batch_size": self.batch_size, "drop_last": self.drop_last,
            "window": self.window, "rows": len(self.table),
            "num_batches": len(self),
        }
        if self._resume is not None and self._resume["epoch"] == self.epoch:
            # A resumed epoch resumed again: positions count from the resumed start.
            state["resumed_from"] = dict(self._resume)
        if self._pieces is not None:
            state["pieces"] = [list(map(list, ps)) for ps in self._pieces]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position on the next iteration."""
        for key in ("seed", "shuffle", "batch_size", "drop_last", "window", "rows"):
            mine = self.state_dict()[key]
            if key in state and state[key] != mine:
                raise ValueError(f"state_dict was saved with {key}={state[key]!r} but this "
                                 f"loader has {mine!r}")
        if "resumed_from" in state:
            raise ValueError("a state saved in an epoch that was itself resumed on another "
                             "world size can be loaded only at the next epoch")
        self.epoch = int(state["epoch"])
        batch = int(state["batch"])
        if int(state["world_size"]) == self.world_size and (
                self._pieces is None or state.get("pieces") is None
                or [list(map(list, ps)) for ps in self._pieces] == state["pieces"]):
            self._resume = None
            if not 0 <= batch <= len(self):
                raise ValueError(f"state_dict batch {batch} is outside [0, {len(self)}]")
            self._start = batch
            self._position = batch
            return
        consumed = min(batch * self.batch_size, int(state.get("num_batches", batch))
                       * self.batch_size)
        self._resume = {"epoch": self.epoch, "world_size": int(state["world_size"]),
                        "consumed": consumed, "pieces": state.get("pieces")}
        self._start = 0
        self._position = 0
        logger.info("resuming epoch %d on %d ranks (saved on %d after %d batches): %d rows "
                    "for this rank", self.epoch, self.world_size, state["world_size"], batch,
                    self.num_samples)

    def close(self) -> None:
        """Stop the gather thread of an iteration in progress and drop the cached rows."""
        if self._stop is not None:
            self._stop.set()
        if self._cache:
            cache, self._cache = self._cache, {}
            for entry in cache.values():
                if not isinstance(entry, np.ndarray) and self._reader is not None:
                    self._reader.cancel(entry)

    def __repr__(self) -> str:
        return (f"Loader({self.table!r}, batch_size={self.batch_size}, shuffle={self.shuffle!r}, "
                f"rank={self.rank}/{self.world_size})")
