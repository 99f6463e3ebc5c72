"""A table's rows dealt to a :class:`~dask_ddp.data.TableLoader` (live recovery, internal).

The rows a lost rank left unread (global row ids) are dealt over the ranks that go on, as
an epoch's rows are: every ``world_size``-th row, padded as an epoch is, each with its
window id so the rank's feeding thread reads them window by window, as its own rows.
:class:`TableRows` deals them in a TableLoader's :class:`~dask_ddp.data.unread.UnreadDeals`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from dask_ddp.data.table import plan

if TYPE_CHECKING:
    from dask_ddp.data.unread import Samples

__all__ = ["Deal", "TableRows"]


@dataclasses.dataclass(frozen=True)
class Deal:
    """A rank's share of a lost rank's unread rows: the rows and their window ids."""

    rows: np.ndarray
    wins: np.ndarray

    def start_epoch(self, epoch: int, start: int, /) -> None:
        """Nothing to start (the share is fed as the epoch's own rows are)."""

    def close(self) -> None:
        """Nothing to close (the rows are the Loader's feeding thread's)."""

    def parts(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows and their window ids, as the feeding thread asks for them."""
        return self.rows, self.wins


@dataclasses.dataclass(frozen=True)
class TableRows:
    """The :class:`~dask_ddp.data.unread.Dealer` of a table's rows (see the module)."""

    per_window: int
    drop_last: bool

    def deal_reader(self, epoch: int, rows: Samples, rank: int, world_size: int) -> Deal:
        rows = np.asarray(rows, np.int64)
        wins = np.arange(len(rows), dtype=np.int64) // self.per_window
        mine, mine_wins = plan.pad_to(rows, wins, world_size, self.drop_last).for_rank(
            rank, world_size)
        return Deal(np.ascontiguousarray(mine), np.ascontiguousarray(mine_wins))

    def deal_share(self, epoch: int, rows: Samples, rank: int, world_size: int) -> Samples:
        return self.deal_reader(epoch, rows, rank, world_size).rows

