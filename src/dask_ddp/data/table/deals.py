"""A table's rows dealt to a :class:`~dask_ddp.data.TableLoader` (live recovery, internal).

The rows a lost rank left unread (global row ids) are dealt over the ranks that go on, as
an epoch's rows are: every ``world_size``-th row, padded as an epoch is, each with its
window id so the rank's feeding thread reads them window by window, as its own rows.
:func:`table_deals` makes a TableLoader's :class:`~dask_ddp.data.unread.UnreadDeals`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from dask_ddp.data.table import plan
from dask_ddp.data.unread import UnreadDeals

if TYPE_CHECKING:
    from dask_ddp.data.table.table import Table
    from dask_ddp.data.unread import Samples

__all__ = ["Deal", "table_deals"]


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


def table_deals(table: Table, *, batch_size: int, window: int, drop_last: bool
                ) -> UnreadDeals[Deal]:
    """The deals of a TableLoader over ``table`` (its ``batch_size``, ``window`` and
    ``drop_last``): each rank's share a :class:`Deal`."""
    per_window = max(batch_size, window * -(-len(table) // max(table.npartitions, 1)))

    def share(_: int, rows: Samples, rank: int, world_size: int
              ) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s share of a deal of ``rows`` over ``world_size`` ranks, and its
        window ids: every ``world_size``-th row, padded as an epoch is."""
        rows = np.asarray(rows, np.int64)
        wins = np.arange(len(rows), dtype=np.int64) // per_window
        mine, mine_wins = plan.pad_to(rows, wins, world_size, drop_last).for_rank(
            rank, world_size)
        return np.ascontiguousarray(mine), np.ascontiguousarray(mine_wins)

    def share_order(epoch: int, rows: Samples, rank: int, world_size: int) -> Any:
        return share(epoch, rows, rank, world_size)[0]

    return UnreadDeals(lambda epoch, rows, r, w: Deal(*share(epoch, rows, r, w)),
                       batch_size, drop_last, share_order=share_order)
