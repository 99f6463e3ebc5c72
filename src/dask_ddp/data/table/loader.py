"""The Loader over a :class:`~dask_ddp.data.Table`: :class:`TableLoader`, what
``dask_ddp.data.Loader(table, ...)`` returns.

Per epoch, the rank's rows come from the epoch plan (:mod:`~dask_ddp.data.table.epoch`
over :mod:`~dask_ddp.data.table.plan`); they are read window by window, one piece per
partition (:mod:`~dask_ddp.data.table.reads`: :mod:`~dask_ddp.data.table.fetch` for Dask
tables, :mod:`~dask_ddp.data.table.parquet` for Parquet), the next window requested while
the current one is gathered; with the cache, the partitions are held once per host
(:mod:`~dask_ddp.data.table.host_cache`). The next epoch's plan and first window are made
while the current epoch is gathered. A background thread hands each window's batches to the
engine (:mod:`~dask_ddp.data.table.batches`), whose own thread gathers them (GIL released)
into tensors that own their buffers; the training loop takes each with one call.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dask_ddp import _core
from dask_ddp._pending import flush_pending
from dask_ddp.data.device import stage_for
from dask_ddp.data.loader import Loader, check_made_here
from dask_ddp.data.sources import check_batch, check_saved
from dask_ddp.data.table.batches import EpochBatches
from dask_ddp.data.table.deals import TableRows
from dask_ddp.data.table.epoch import EpochRows
from dask_ddp.data.table.feed import Feed
from dask_ddp.data.table.layout import BatchLayout
from dask_ddp.data.table.reads import WindowReads, cache_wanted
from dask_ddp.data.unread import UnreadDeals

if TYPE_CHECKING:
    from dask_ddp.data.table.table import Table

__all__ = ["TableLoader"]

logger = logging.getLogger(__name__)

_SHUFFLES = (True, False, "local")
#: The version of a shuffled epoch's order (the plan's window permutations): a state saved
#: under another one cannot name the rows its epoch has left, so that epoch starts over.
ORDER_VERSION = 2


class TableLoader(Loader):
    """Batches of a :class:`~dask_ddp.data.Table` in a rank: the :class:`Loader` of a table.

    ``Loader(table, ...)`` returns one, as ``TableLoader(table, ...)`` does: a table's rows
    are not images, so it takes other options and yields other batches, but it is a
    :class:`~dask_ddp.data.Loader` (``isinstance`` holds) with the same protocol. See the
    user guide's "Datasets: tables".

    Parameters
    ----------
    table
        The table (a Dask DataFrame or Array passed to ``submit`` arrives as one).
    batch_size
        Rows per batch.
    shuffle, seed
        ``False``: ``DistributedSampler``'s order. ``True``: each epoch a permutation of
        the partitions, cut into windows of ``window`` partitions whose rows are
        permuted. ``"local"``: each rank keeps one set of rows for the whole run, the
        partitions its own worker holds first, in a new order each epoch. The order is a
        function of (seed, epoch).
    features, label
        Batches as ``x`` (the ``features`` columns, stacked; default: every column but
        ``label``) or ``(x, y)``; without either, a dict of every column's tensor.
    drop_last
        Drop the uneven tail across ranks (else pad by repeating rows) and the last
        incomplete batch.
    rank, world_size
        This process's share, ``DistributedSampler``-style. Default: from the
        initialised ``torch.distributed`` process group, else 0 and 1.
    num_threads
        The C++ gather threads. Default: this rank's share of the host's cores.
    prefetch
        Batches gathered ahead of the consumer, on the engine's own thread. With one
        gather thread and no GPU (a CPU rank with one core), each batch is gathered in
        the training loop's thread when it asks for it instead: a second thread would
        only take turns with the loop on that core, at the price of a hand-over per
        batch. The windows' reads run ahead either way.
    window
        Partitions per window (``shuffle=True``): the rows a rank holds at a time.
    cache
        Keep the partitions read in this process across epochs. Default: when the rows
        fit ``dask-ddp.data.table-cache``.
    device
        Hand the loop batches on this device (``"cuda"``: the rank's own GPU; ``"cpu"``;
        a ``torch.device``); ``None`` keeps host tensors. The copy runs on a stream of its
        own and the loop's stream waits on an event. See the user guide's "The device
        stage".
    channels_last
        4-D columns (images) in ``torch.channels_last`` memory format (with ``device``).

    Raises
    ------
    ValueError
        For inconsistent arguments, or ``features`` empty.
    KeyError
        ``features`` or ``label`` names no column of the table.
    """

    def __init__(self, table: Table, batch_size: int, *, shuffle: bool | str = True,
                 seed: int = 0, features: Sequence[str] | None = None,
                 label: str | None = None, drop_last: bool = False, rank: int | None = None,
                 world_size: int | None = None, num_threads: int | None = None,
                 prefetch: int = 4, window: int = 4, cache: bool | None = None,
                 device: str | torch.device | None = None,
                 channels_last: bool = False) -> None:
        # The options every Loader has; Loader.__init__'s own (images, tar shards) do not
        # apply to a table.
        if shuffle not in _SHUFFLES or isinstance(shuffle, int) and not isinstance(shuffle, bool):
            raise ValueError(f"shuffle must be True, False or 'local', got {shuffle!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._init_reading(batch_size, shuffle=shuffle, seed=seed, rank=rank,
                           world_size=world_size, drop_last=drop_last,
                           num_threads=num_threads, prefetch=prefetch,
                           stage=stage_for(device, channels_last, False))
        self.table = table
        self.window = int(window)
        self._resume: dict[str, Any] | None = None  # a state saved on another world size
        layout = BatchLayout(table, features, label)
        offsets = np.concatenate([[0], np.cumsum(np.asarray(table.partition_rows, np.int64))])
        self._plan = EpochRows(table, rank=self.rank, world_size=self.world_size,
                               shuffle=shuffle, seed=self.seed, window=self.window,
                               drop_last=self.drop_last)
        pool = _core.GatherPool(self.num_threads)
        cached = cache_wanted(cache, table, layout.columns, self.rank)
        self._reads = WindowReads(table, layout.columns, cache=cached)
        #: Passes over the table left before the hint to persist it (a Dask table neither
        #: persisted nor cached is computed again from its source at every pass).
        self._passes_to_hint = 1 if table.source == "dask" and not table.persisted \
            and not cached else -1
        self._batches = EpochBatches(layout, self._reads, pool, offsets,
                                     batch_size=self.batch_size, drop_last=self.drop_last,
                                     rank=self.rank, shuffle=shuffle,
                                     gather_ahead=self.num_threads > 1 or torch.cuda.is_available())
        self._feeding: Feed | None = None  # the feeding thread of the current iteration
        # Rows a lost rank left unread, read after this rank's own (live recovery).
        per_window = max(self.batch_size, self.window * -(-len(table) // max(table.npartitions, 1)))
        self._deals = UnreadDeals(TableRows(per_window, self.drop_last), self.batch_size,
                                  self.drop_last)
        self._own_end = False  # end_reads(): the own rows of this epoch are done
        self._cuts = 0  # end_reads() calls: the rows being fed stop at the next batch

    def _rank_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows of the current epoch and their window ids."""
        return self._plan.rows(self.epoch, self._resume)

    @property
    def num_samples(self) -> int:
        """Rows this rank reads in the current epoch (padding included)."""
        return len(self._rank_rows()[0])

    @property
    def skipped(self) -> int:
        """Always 0: a table's rows are not left out one by one (a column that cannot
        become a tensor fails when the Table is made or the partition read)."""
        return 0

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        n = self.num_samples
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order (as ``DistributedSampler.set_epoch``); after
        :meth:`load_state_dict`, setting the restored epoch keeps the restored position."""
        check_made_here(self._made_in)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if int(epoch) != self.epoch:
            self._start_batch = 0
            self._resume = None
            self._own_end = False
            if (layout := self._pop_layout()) is not None:
                self._take_layout(*layout)
        self.epoch = int(epoch)

    def _take_layout(self, rank: int, world_size: int) -> None:
        """Read from now on as rank ``rank`` of ``world_size`` (see :meth:`reshard`)."""
        self.rank, self.world_size = rank, world_size
        # No collective here (a re-formed group's members reach it at their own pace):
        # shuffle="local" then places rows without regard to the workers holding them.
        self._plan = EpochRows(self.table, rank=rank, world_size=world_size,
                               shuffle=self.shuffle, seed=self.seed, window=self.window,
                               drop_last=self.drop_last, gather=False)
        self._batches = dataclasses.replace(self._batches, rank=rank, ahead={})

    def _hint_persist(self) -> None:
        """Warn once, at the second pass, that a table neither persisted nor cached is
        computed again from its source at every pass."""
        if self._passes_to_hint < 0:
            return
        if self._passes_to_hint == 0 and self.rank == 0:
            logger.warning(
                "the table (%d rows, %d partitions) is read again but is not persisted: "
                "every epoch computes its partitions again from their source (several "
                "times slower); call .persist() on the Dask collection before submit()",
                len(self.table), self.table.npartitions)
        self._passes_to_hint -= 1

    def __iter__(self) -> Iterator[Any]:
        """Batches: a dict of column tensors, or ``x`` or ``(x, y)`` with ``features``
        and ``label``."""
        check_made_here(self._made_in)
        start, self._start_batch = self._start_batch, 0
        self._position = start
        self._hint_persist()
        with self._stage.over(self._host_rows(start), image_at=-1) as batches:
            yield from batches
        flush_pending()  # the epoch's metrics reported as CUDA values

    def _host_rows(self, start: int) -> Iterator[Any]:
        """The epoch's host batches from batch ``start`` on: the own rows', then each
        deal's (live recovery)."""
        epoch = self.epoch
        if not self._own_end:
            # The next epoch's plan and first window are made while this one is gathered
            # (not for an epoch resumed on another world size: the next one is ordinary).
            nxt = epoch + 1
            ahead = (lambda: self._plan.rows(nxt, None)) if self._resume is None else None
            yield from self._feed(self._rank_rows, start, ahead)
        while (deal := self._deals.next_core(epoch)) is not None:
            self._position = 0
            yield from self._feed(deal.parts, 0, None)

    def _feed(self, rank_rows: Callable[[], tuple[np.ndarray, np.ndarray]], start: int,
              ahead: Callable[[], tuple[np.ndarray, np.ndarray]] | None) -> Iterator[Any]:
        """The batches of ``rank_rows`` from batch ``start`` on, fed by a thread; they
        stop early at :meth:`end_reads`."""
        t0, first, cuts, batch_of = time.monotonic(), True, self._cuts, self._batches.layout.batch
        feed = self._feeding = Feed(self._batches, self.prefetch, start, self.epoch, rank_rows,
                                    ahead, name=f"dask-ddp-table-{self.rank}")
        try:
            while True:
                if self.before_batch is not None:
                    self.before_batch()
                if self._cuts != cuts or (item := feed.next()) is None:
                    return
                if first:
                    first = False
                    logger.debug("rank %d: first batch of epoch %d after %.3f s", self.rank,
                                 self.epoch, time.monotonic() - t0)
                self._position += 1
                yield batch_of(item)
        finally:
            feed.close(self.rank)

    # -- live recovery ------------------------------------------------------------------
    def lost_samples(self, epoch: int, batch: int, ranks: list[int],
                     uids: list[Any] | None = None) -> np.ndarray:
        """The rows of ``epoch`` that ``ranks`` (of this loader's world) had not yielded
        after ``batch`` batches each (:attr:`epoch_progress`'s count), global row ids, for
        :meth:`deal_unread`; with the shares of rows dealt earlier in the epoch to the
        members ``uids`` (default ``ranks``)."""
        bs = self.batch_size
        parts = [self._plan.rows_of(epoch, self._resume, r)[0][batch * bs:]
                 for r in sorted(ranks)]
        parts.append(np.asarray(self._dealt_lost(epoch, batch, ranks if uids is None else uids),
                                np.int64))
        return np.concatenate(parts).astype(np.int64, copy=False)

    def _stop_reads(self, own: bool) -> None:
        self._cuts += 1  # the rows being fed stop at the next batch
        self._own_end = self._own_end or own

    # -- resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position in the epoch: resuming from it on the same world size yields the
        remaining batches exactly; on another, every row not yet read that epoch."""
        state: dict[str, Any] = {
            "epoch": self.epoch, "batch": self._position, "seed": self.seed,
            "shuffle": self.shuffle, "world_size": self.world_size,
            "batch_size": self.batch_size, "drop_last": self.drop_last,
            "window": self.window, "rows": len(self.table),
            "num_batches": len(self), "order": ORDER_VERSION,
        }
        if self._resume is not None and self._resume["epoch"] == self.epoch:
            # A resumed epoch resumed again: positions count from the resumed start.
            state["resumed_from"] = dict(self._resume)
        if self._plan.pieces is not None:
            state["pieces"] = [list(map(list, ps)) for ps in self._plan.pieces]
        return {**state, **self._unread_entry()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position on the next iteration (a state
        with ``"unread"``: with those rows, :meth:`resume_unread`)."""
        if self._took_unread(state):
            return
        own = self.state_dict()
        check_saved(state, {k: own[k] for k in ("seed", "shuffle", "batch_size", "drop_last",
                                                "window", "rows")})
        if "resumed_from" in state:
            raise ValueError("a state saved in an epoch that was itself resumed on another "
                             "world size can be loaded only at the next epoch")
        self.epoch = int(state["epoch"])
        batch = int(state["batch"])
        order = state.get("order", 1)  # a state without it predates the marker
        if state.get("shuffle", self.shuffle) and batch > 0 and order != ORDER_VERSION:
            logger.warning(
                "this table loader's state was saved by a dask-ddp whose shuffled order "
                "differs (order %r, this one %d): epoch %d starts again from its first "
                "batch (the rows read before the save are read again, none is skipped)",
                order, ORDER_VERSION, self.epoch)
            state, batch = {**state, "batch": 0}, 0
        pieces = self._plan.pieces
        if int(state["world_size"]) == self.world_size and (
                pieces is None or state.get("pieces") is None
                or [list(map(list, ps)) for ps in pieces] == state["pieces"]):
            self._resume = None
            self._start_batch = self._position = check_batch(batch, len(self))
            return
        consumed = min(batch * self.batch_size, int(state.get("num_batches", batch))
                       * self.batch_size)
        self._resume = {"epoch": self.epoch, "world_size": int(state["world_size"]),
                        "consumed": consumed, "pieces": state.get("pieces")}
        self._start_batch = self._position = 0
        logger.info("resuming epoch %d on %d ranks (saved on %d after %d batches): %d rows "
                    "for this rank", self.epoch, self.world_size, state["world_size"], batch,
                    self.num_samples)

    def close(self) -> None:
        """Stop the gather thread of an iteration in progress and drop the cached rows."""
        if self._feeding is not None:
            self._feeding.cancel()
        self._reads.close()
        self._stage.drop()

    def __repr__(self) -> str:
        return (f"Loader({self.table!r}, batch_size={self.batch_size}, shuffle={self.shuffle!r}, "
                f"rank={self.rank}/{self.world_size})")
