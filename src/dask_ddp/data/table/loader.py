"""Tables as a data kind: :class:`TableSource`, the :class:`~dask_ddp.data.Source` of a
:class:`~dask_ddp.data.Table`, and :class:`TableLoader`, the
:class:`~dask_ddp.data.Loader` over one (what ``Loader(table, ...)`` returns).

Per epoch, the rank's rows come from the epoch plan (:mod:`~dask_ddp.data.table.epoch`
over :mod:`~dask_ddp.data.table.plan`); they are read window by window, one piece per
partition (:mod:`~dask_ddp.data.table.reads`: :mod:`~dask_ddp.data.table.fetch` for Dask
tables, :mod:`~dask_ddp.data.table.parquet` for Parquet), the next window requested while
the current one is gathered; with the cache, the partitions are held once per host
(:mod:`~dask_ddp.data.table.host_cache`). The next epoch's plan and first window are made
while the current epoch is gathered. A background thread (the :class:`TableReader`'s)
hands each window's batches to the engine (:mod:`~dask_ddp.data.table.batches`), whose own
thread gathers them (GIL released) into buffers the device stage lends (else its own); the
training loop takes each with one call.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dask_ddp import _core
from dask_ddp.data.loader import Loader
from dask_ddp.data.sources import Source, check_batch, check_saved
from dask_ddp.data.table import plan
from dask_ddp.data.table.batches import POLL_S, EpochBatches
from dask_ddp.data.table.epoch import EpochRows
from dask_ddp.data.table.layout import BatchLayout
from dask_ddp.data.table.reads import WindowReads, cache_wanted

if TYPE_CHECKING:
    from dask_ddp.data.device import DeviceStage
    from dask_ddp.data.sources import Loader as Options
    from dask_ddp.data.table.table import Table
    from dask_ddp.data.unread import Samples

__all__ = ["TableLoader", "TableSource"]

logger = logging.getLogger(__name__)

_SHUFFLES = (True, False, "local")
#: The version of a shuffled epoch's order (the plan's window permutations): a state saved
#: under another one cannot name the rows its epoch has left, so that epoch starts over.
ORDER_VERSION = 2
#: Rows and their window ids, as the plan gives them.
Rows = tuple[np.ndarray, np.ndarray]
#: Seconds a reader waits for its feeding thread to stop.
JOIN_S = 60


class TableReader:
    """A :class:`~dask_ddp.data.sources.Reader` of a table's rows (``rows(epoch)``: the
    rows and their window ids): at the first :meth:`next` of an epoch a thread of its own
    feeds their batches (:meth:`EpochBatches.produce`) into an engine stream of
    ``prefetch`` batches, which :meth:`next` takes; ``own``: the rank's own share (its
    next epoch's plan made ahead, and a pass counted for the persist hint)."""

    skipped = 0

    def __init__(self, source: TableSource, rows: Callable[[int], Rows], *, own: bool) -> None:
        self.source, self.rows, self.own = source, rows, own
        self._epoch, self._at, self._done = 0, 0, False
        self._stream: Any = None  # the current pass's, with its thread, stop and errors
        self._thread: threading.Thread | None = None
        self._stop, self._errors = threading.Event(), list[BaseException]()

    def start_epoch(self, epoch: int, start: int, /) -> None:
        """Read ``epoch`` from its batch ``start`` on (the pass before ends: :meth:`close`)."""
        self.close()
        self._epoch, self._at, self._done = int(epoch), int(start), False

    def next(self) -> tuple[Any, ...] | None:
        """The next batch's engine item (its position at 2), the GIL released while it
        waits; None at the end or once closed. An exception that ended the feeding thread
        is raised after the batches before it."""
        if self._done:
            return None
        stream = self._stream if self._stream is not None else self._start()
        t0 = time.monotonic()
        while True:
            try:
                item = stream.next(POLL_S)
                break
            except TimeoutError:
                continue  # the reads wait at most FETCH_TIMEOUT_S, then raise
        if item is None:
            self._done = True
            if self._errors:
                raise self._errors[0]
            return None
        at, self._at = self._at, self._at + 1
        if at == 0:
            logger.debug("rank %d: first batch of epoch %d after %.3f s",
                         self.source.loader.rank, self._epoch, time.monotonic() - t0)
        return item, None, at

    def _start(self) -> Any:
        """Start the pass's feeding thread, once the one of the pass before ended (a
        warning past ``JOIN_S``); the pass's stream."""
        if (thread := self._thread) is not None:
            thread.join(timeout=JOIN_S)
            if thread.is_alive():
                logger.warning("rank %d: the table's feeding thread did not stop within "
                               "%d s (a read of the table is still waiting)",
                               self.source.loader.rank, JOIN_S)
        src, epoch = self.source, self._epoch
        ahead = None
        if self.own:
            src.hint_persist()
            # The next epoch's plan and first window are made while this one is gathered
            # (not for an epoch resumed on another world size: the next one is ordinary).
            if src.resumed is None:
                ahead = lambda: src.plan.rows(epoch + 1, None)  # noqa: E731
        # Gathered into the stage's lent buffers (page-locked on a GPU).
        self._stream, self._stop, self._errors = (
            src.stage.lend(src.batches.stream(src.loader.prefetch)), threading.Event(), [])
        self._thread = threading.Thread(
            target=src.batches.produce, name=f"dask-ddp-table-{src.loader.rank}", daemon=True,
            args=(self._stream, self._stop, self._at, epoch, lambda: self.rows(epoch),
                  self._errors, ahead))
        self._thread.start()
        return self._stream

    def close(self) -> None:
        """End the pass, from any thread (a :meth:`next` waiting returns None), without
        waiting: the feeding thread stops at once, or after the read it waits for, and its
        stream's buffers go when it ends. A later :meth:`start_epoch` reads again."""
        self._done = True
        self._stop.set()
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


class TableSource(Source):
    """The :class:`~dask_ddp.data.Source` of a :class:`~dask_ddp.data.Table`: its ids are
    global row ids, ordered by the table's plan (windows of partitions, ``shuffle`` True,
    False or ``"local"``), read by a feeding thread; a state saved on another world size
    resumes with every row no rank had read (``TableLoader``'s options: see it).

    Attributes
    ----------
    resumed
        The record of a state saved on another world size (``epoch``, ``world_size``,
        ``consumed`` rows per rank, ``pieces``) while its epoch is read, else None.
    """

    image_at = -1  # every 4-D column is images
    #: The plan, the reads and the feeding work of the Loader it was opened for.
    plan: EpochRows
    reads: WindowReads
    batches: EpochBatches
    #: Passes over the table left before the hint to persist it (a Dask table neither
    #: persisted nor cached is computed again from its source at every pass).
    passes_to_hint: int

    def __init__(self, table: Table, *, shuffle: bool | str = True,
                 features: Sequence[str] | None = None, label: str | None = None,
                 window: int = 4, cache: bool | None = None) -> None:
        if shuffle not in _SHUFFLES or isinstance(shuffle, int) and not isinstance(shuffle, bool):
            raise ValueError(f"shuffle must be True, False or 'local', got {shuffle!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.table, self.shuffle, self.window, self.cache = table, shuffle, int(window), cache
        self.layout = BatchLayout(table, features, label)
        self.resumed: dict[str, Any] | None = None

    def opened(self, loader: Options, stage: DeviceStage) -> Source:
        own = copy.copy(self)
        own.loader, table = loader, self.table
        own.plan = EpochRows(table, rank=loader.rank, world_size=loader.world_size,
                             shuffle=self.shuffle, seed=loader.seed, window=self.window,
                             drop_last=loader.drop_last)
        cached = cache_wanted(self.cache, table, self.layout.columns, loader.rank)
        own.reads = WindowReads(table, self.layout.columns, cache=cached)
        own.passes_to_hint = 1 if table.source == "dask" and not table.persisted \
            and not cached else -1
        offsets = np.concatenate([[0], np.cumsum(np.asarray(table.partition_rows, np.int64))])
        own.batches = EpochBatches(
            self.layout, own.reads, _core.GatherPool(loader.num_threads), offsets,
            batch_size=loader.batch_size, drop_last=loader.drop_last, rank=loader.rank,
            shuffle=self.shuffle,
            gather_ahead=loader.num_threads > 1 or torch.cuda.is_available())
        return super(TableSource, own).opened(loader, stage)

    def __repr__(self) -> str:
        return f"TableSource({self.table!r}, shuffle={self.shuffle!r}, window={self.window})"

    def hint_persist(self) -> None:
        """Warn once, at the second pass, that a table neither persisted nor cached is
        computed again from its source at every pass."""
        if self.passes_to_hint < 0:
            return
        if self.passes_to_hint == 0 and self.loader.rank == 0:
            logger.warning(
                "the table (%d rows, %d partitions) is read again but is not persisted: "
                "every epoch computes its partitions again from their source (several "
                "times slower); call .persist() on the Dask collection before submit()",
                len(self.table), self.table.npartitions)
        self.passes_to_hint -= 1

    def reader(self, rank: int, world_size: int) -> TableReader:
        return TableReader(self, lambda epoch: self.plan.rows(epoch, self.resumed), own=True)

    def relayout(self, rank: int, world_size: int) -> None:
        # No collective here (a re-formed group's members reach it at their own pace):
        # shuffle="local" then places rows without regard to the workers holding them.
        self.plan = EpochRows(self.table, rank=rank, world_size=world_size,
                              shuffle=self.shuffle, seed=self.loader.seed,
                              window=self.window, drop_last=self.loader.drop_last,
                              gather=False)
        self.batches = dataclasses.replace(self.batches, rank=rank, ahead={})
        super().relayout(rank, world_size)

    def _dealt(self, samples: Samples, rank: int, world_size: int) -> Rows:
        """Rank ``rank`` of ``world_size``'s share of dealt rows and their window ids:
        every ``world_size``-th row, padded as an epoch is, in windows as its own rows."""
        per_window = max(self.loader.batch_size, self.window * -(
            -len(self.table) // max(self.table.npartitions, 1)))
        rows = np.asarray(samples, np.int64)
        wins = np.arange(len(rows), dtype=np.int64) // per_window
        mine, mine_wins = plan.pad_to(rows, wins, world_size, self.loader.drop_last
                                      ).for_rank(rank, world_size)
        return np.ascontiguousarray(mine), np.ascontiguousarray(mine_wins)

    def deal_reader(self, epoch: int, samples: Samples, rank: int, world_size: int
                    ) -> TableReader:
        share = self._dealt(samples, rank, world_size)
        return TableReader(self, lambda _: share, own=False)

    def deal_share(self, epoch: int, samples: Samples, rank: int, world_size: int
                   ) -> Samples:
        return self._dealt(samples, rank, world_size)[0]

    def order(self, epoch: int, rank: int, world_size: int) -> Samples:
        """The plan's rows of rank ``rank`` (of the plan's world size)."""
        return self.plan.rows_of(epoch, self.resumed, rank)[0]

    def lost(self, epoch: int, batch: int, ranks: list[int]) -> list[int]:
        bs = self.loader.batch_size
        return np.concatenate([np.zeros(0, np.int64)] + [
            self.order(epoch, r, self.loader.world_size)[batch * bs:]
            for r in sorted(ranks)]).tolist()

    def new_epoch(self) -> None:
        """Also end a resume on another world size (it applies to its own epoch only)."""
        super().new_epoch()
        self.resumed = None

    def close(self) -> None:
        """Also drop the cached rows."""
        super().close()
        self.reads.close()

    def batch(self, item: tuple[Any, ...]) -> Any:
        """A dict of column tensors, or ``x`` or ``(x, y)`` with ``features`` and
        ``label``."""
        return self.layout.batch(item[0])

    def state(self) -> dict[str, Any]:
        loader = self.loader
        state: dict[str, Any] = {
            "batch_size": loader.batch_size, "drop_last": loader.drop_last,
            "window": self.window, "rows": len(self.table), "order": ORDER_VERSION}
        if self.resumed is not None and self.resumed["epoch"] == loader.epoch:
            # A resumed epoch resumed again: positions count from the resumed start.
            state["resumed_from"] = dict(self.resumed)
        if self.plan.pieces is not None:
            state["pieces"] = [list(map(list, ps)) for ps in self.plan.pieces]
        return state

    def resume(self, state: Mapping[str, Any]) -> int:
        """On the saved world size (and pieces), the saved position; on another, batch 0
        of every row no rank had read, dealt over this world size."""
        loader, epoch = self.loader, int(state["epoch"])
        check_saved(state, {"seed": loader.seed, "shuffle": loader.shuffle,
                            "batch_size": loader.batch_size, "drop_last": loader.drop_last,
                            "window": self.window, "rows": len(self.table)})
        if "resumed_from" in state:
            raise ValueError("a state saved in an epoch that was itself resumed on another "
                             "world size can be loaded only at the next epoch")
        batch = int(state["batch"])
        order = state.get("order", 1)  # a state without it predates the marker
        if state.get("shuffle", loader.shuffle) and batch > 0 and order != ORDER_VERSION:
            logger.warning(
                "this table loader's state was saved by a dask-ddp whose shuffled order "
                "differs (order %r, this one %d): epoch %d starts again from its first "
                "batch (the rows read before the save are read again, none is skipped)",
                order, ORDER_VERSION, epoch)
            batch = 0
        pieces = self.plan.pieces
        if int(state["world_size"]) == loader.world_size and (
                pieces is None or state.get("pieces") is None
                or [list(map(list, ps)) for ps in pieces] == state["pieces"]):
            self.resumed = None
            return check_batch(batch, self.num_batches(epoch))
        consumed = min(batch * loader.batch_size, int(state.get("num_batches", batch))
                       * loader.batch_size)
        self.resumed = {"epoch": epoch, "world_size": int(state["world_size"]),
                        "consumed": consumed, "pieces": state.get("pieces")}
        logger.info("resuming epoch %d on %d ranks (saved on %d after %d batches): %d rows "
                    "for this rank", epoch, loader.world_size, state["world_size"], batch,
                    self.num_samples(epoch))
        return 0


class _ReadsATable(type):
    """``isinstance(x, TableLoader)``: ``x`` is a Loader over a table (made by
    ``TableLoader``, ``Loader(table)`` or ``Loader(<Dask collection>)``)."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, Loader) and isinstance(
            obj.__dict__.get("_source", obj.__dict__.get("_opens")), (TableSource, Opens))

    def __getattr__(cls, name: str) -> Any:
        """``TableLoader.set_epoch`` and the like: the Loader's own members."""
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(Loader, name)


class TableLoader(metaclass=_ReadsATable):
    """Batches of a :class:`~dask_ddp.data.Table` in a rank: a :class:`Loader` over its
    :class:`TableSource`.

    ``Loader(table, ...)`` returns one, as ``TableLoader(table, ...)`` does: a table's rows
    are not images, so it takes other options and yields other batches, but it is a
    :class:`~dask_ddp.data.Loader` (``isinstance`` holds) with the same protocol, and
    ``isinstance(loader, TableLoader)`` tells one over a table. See the user guide's
    "Datasets: tables".

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

    def __new__(cls, table: Table, batch_size: int, *, shuffle: bool | str = True,  # type: ignore[misc]
                seed: int = 0, features: Sequence[str] | None = None,
                label: str | None = None, drop_last: bool = False, rank: int | None = None,
                world_size: int | None = None, num_threads: int | None = None,
                prefetch: int = 4, window: int = 4, cache: bool | None = None,
                device: str | torch.device | None = None,
                channels_last: bool = False) -> Loader:
        return _made(Loader.__new__(Loader), table, batch_size, shuffle=shuffle, seed=seed,
                     features=features, label=label, drop_last=drop_last, rank=rank,
                     world_size=world_size, num_threads=num_threads, prefetch=prefetch,
                     window=window, cache=cache, device=device, channels_last=channels_last)


# Its signature as a class's (its __init__'s): the table, then the options.
TableLoader.__signature__ = inspect.signature(TableLoader.__new__).replace(  # type: ignore[attr-defined]
    parameters=list(inspect.signature(TableLoader.__new__).parameters.values())[1:],
    return_annotation="None")


def _made(loader: Loader, table: Table, batch_size: int, *, shuffle: bool | str = True,
          features: Sequence[str] | None = None, label: str | None = None, window: int = 4,
          cache: bool | None = None, **options: Any) -> Loader:
    """``loader`` (not initialised yet) made the Loader over ``table``'s
    :class:`TableSource` (the arguments: :class:`TableLoader`'s)."""
    source = TableSource(table, shuffle=shuffle, features=features, label=label,
                         window=window, cache=cache)
    Loader.__init__(loader, source, batch_size,  # type: ignore[arg-type]
                    shuffle=bool(shuffle), pin_memory=False, **options)
    loader.shuffle = shuffle  # "local" as given: the state dict's, checked at a resume
    return loader


@dataclasses.dataclass(frozen=True)
class Opens:
    """A table's Loader's arguments, opened in the process that reads it (see
    ``data/table/pending.py``): ``open(loader)`` makes ``loader`` that Loader."""

    table: Table
    options: dict[str, Any]

    def open(self, loader: Loader) -> None:
        _made(loader, self.table, **self.options)
