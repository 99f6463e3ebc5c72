"""A rank's rows of each epoch (internal), from the plan (:mod:`dask_ddp.data.table.plan`):
the rows in the order the rank reads them and their window ids, also for an epoch resumed
on another world size."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dask_ddp.data.table import plan

if TYPE_CHECKING:
    from dask_ddp.data.table.table import Table

__all__ = ["EpochRows"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class EpochRows:
    """This rank's rows of each epoch, for one loader's options.

    With ``shuffle="local"``, the ranks' sets of rows (:attr:`pieces`) are chosen once,
    when this is made, from the workers the ranks run on (gathered over the process
    group).
    """

    table: Table
    rank: int
    world_size: int
    shuffle: bool | str
    seed: int
    window: int
    drop_last: bool
    #: shuffle="local": gather the ranks' workers over the process group to place each
    #: rank's rows on its own worker; False: no collective, and no locality (every rank
    #: computes the same assignment alone: a group re-formed by live recovery).
    gather: bool = True
    #: Each rank's (partition, begin, end) pieces for shuffle="local", else None.
    pieces: list[list[tuple[int, int, int]]] | None = dataclasses.field(init=False,
                                                                        default=None)
    #: The epochs last computed (the current one and the next, made ahead), by key.
    _done: dict[Any, tuple[np.ndarray, np.ndarray]] = dataclasses.field(
        init=False, default_factory=dict, repr=False)
    _lock: threading.Lock = dataclasses.field(init=False, default_factory=threading.Lock,
                                              repr=False)

    def __post_init__(self) -> None:
        if self.shuffle == "local":
            self.pieces = self._local_pieces()

    def _local_pieces(self) -> list[list[tuple[int, int, int]]]:
        """Each rank's rows for shuffle="local", from the ranks' workers (gathered once)."""
        me = os.environ.get("DASK_DDP_WORKER", "") if self.gather else ""
        workers = [me] * self.world_size
        if self.gather and self.world_size > 1 and torch.distributed.is_available() \
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

    def rows(self, epoch: int, resume: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows of ``epoch`` and their window ids (the last two computed are
        kept: ``len(loader)`` and the iteration share them, and the next epoch's, made
        ahead while the current one runs, is ready when it starts).

        ``resume`` is the loader's record of a state saved on another world size
        (``epoch``, ``world_size``, ``consumed`` rows per rank, ``pieces``); it applies
        only to its own epoch.
        """
        if resume is not None and resume["epoch"] != epoch:
            resume = None
        key = (epoch, repr(resume))
        with self._lock:  # the loader's thread and the feeding thread (ahead) both ask
            got = self._done.get(key)
        if got is None:
            got = self._compute(epoch, resume)
            with self._lock:
                self._done[key] = got
                while len(self._done) > 2:
                    del self._done[next(iter(self._done))]
        return got

    def rows_of(self, epoch: int, resume: dict[str, Any] | None, rank: int
                ) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s rows of ``epoch`` and their window ids (not kept)."""
        if rank == self.rank:
            return self.rows(epoch, resume)
        if resume is not None and resume["epoch"] != epoch:
            resume = None
        return self._compute(epoch, resume, rank)

    def _compute(self, epoch: int, resume: dict[str, Any] | None, rank: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        if resume is not None:
            r = resume
            pieces = r.get("pieces")
            old = self._sequence(epoch, r["world_size"], None if pieces is None else
                                 [[tuple(p) for p in ps] for ps in pieces])
            seq = plan.resumed_sequence(old, consumed_per_rank=r["consumed"],
                                        old_world=r["world_size"], new_world=self.world_size,
                                        drop_last=self.drop_last)
        elif self.pieces is None:  # the common case: the rank's share alone, by the engine
            return plan.rank_sequence(
                self.table.partition_rows, world=self.world_size,
                rank=self.rank if rank is None else rank, shuffle=bool(self.shuffle),
                seed=self.seed, epoch=epoch, drop_last=self.drop_last, window=self.window)
        else:
            seq = self._sequence(epoch, self.world_size, self.pieces)
        rows, wins = seq.for_rank(self.rank if rank is None else rank, self.world_size)
        return np.ascontiguousarray(rows), np.ascontiguousarray(wins)

    def _sequence(self, epoch: int, world: int, pieces: Any) -> plan.EpochSequence:
        """The epoch over ``world`` ranks: over each rank's ``pieces`` when given
        (shuffle="local"), else over the whole table."""
        if pieces is not None:
            return plan.local_sequence(self.table.partition_rows, pieces, seed=self.seed,
                                       epoch=epoch, window=self.window)
        return plan.epoch_sequence(self.table.partition_rows, world=world,
                                   shuffle=bool(self.shuffle), seed=self.seed, epoch=epoch,
                                   drop_last=self.drop_last, window=self.window)
