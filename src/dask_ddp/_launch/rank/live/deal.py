"""A live rank's Loader dealt again at a regroup, so every sample is read once (internal).

When members are lost mid-epoch, rank 0 names their unread samples of the epoch
(:meth:`LoaderDeal.lost_samples`) and every member reads its share of them after its own
(:meth:`LoaderDeal.deal_unread`); when ranks join, the members stop reading their own
shares and the epoch's unread samples are dealt again over the bigger group
(:meth:`LoaderDeal.after_join`); from the next epoch on each member reads as its new rank
(:meth:`LoaderDeal.relayout`). The Loader is reached through the
:class:`~dask_ddp.data.Loader` class's methods only (every dask-ddp Loader is one; its
Source answers for its kind of data).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dask_ddp.data.loader import Loader
    from dask_ddp.data.unread import Samples

logger = logging.getLogger(__name__)


class LoaderDeal:
    """The deals of one rank's Loader (see the module).

    Parameters
    ----------
    loader
        The rank's Loader as live recovery's (None: another kind of loader, or none,
        whose samples are not dealt again; every method is then a no-op).
    joining
        The rank started to join a running group: its own shard is no part of the
        current epoch's layout.
    """

    def __init__(self, loader: Loader | None, joining: bool) -> None:
        self.loader = loader
        #: Each member's rank in the layout the loader reads the current epoch with (a
        #: joining rank's own shard is no part of it), and the next epochs' layout once
        #: the group changed (see ``layout``).
        self._layout: dict[int, int] = {} if loader is None or joining else {
            u: u for u in range(int(loader.world_size))}
        self._next_layout: dict[int, int] | None = None
        #: The lost members' unread samples as rank 0 named them at the last regroup
        #: (epoch, samples), dealt once the regroup is done (see ``deal_unread``).
        self._lost_deal: tuple[int, Samples] | None = None

    def layout(self) -> dict[int, int]:
        """Each member's rank in the layout its loader reads the current epoch with."""
        if (self._next_layout is not None and self.loader is not None
                and not self.loader.layout_pending):
            self._layout, self._next_layout = self._next_layout, None  # the loader took it
        return self._layout

    def lost_samples(self, lost: list[int], position: tuple[int, int],
                     in_step: bool) -> tuple[int, Samples] | None:
        """Rank 0: the ``lost`` members' unread samples of the epoch, (epoch, samples).
        The group's state (``position``: epoch, batches) counts the batches rank 0 (the
        most advanced) had taken, less the one of a step being completed when it
        regroups from inside that step (``in_step``: a failed ``backward()``); at a step's
        top (an admission that lost a member who left at that boundary) or after its
        loop, it counts every one. Named by rank 0 alone and handed to every member: a
        member that joined this epoch counts its batches otherwise."""
        loader = self.loader
        if loader is None or not lost:
            return None
        epoch, taken = position
        batch = max(taken - 1, 0) if in_step else taken
        layout = self.layout()
        try:
            # Their own shards by their ranks in the epoch's layout, the samples dealt
            # to them this epoch by their ids.
            return epoch, loader.lost_samples(epoch, batch,
                                              [layout[u] for u in lost if u in layout],
                                              uids=lost)
        except NotImplementedError as exc:
            logger.warning("live recovery: the unread samples of lost ranks %s are not "
                           "read this epoch: %s", lost, exc)
            return None

    def unread(self, members: list[int], position: tuple[int, int]) -> tuple[int, Samples]:
        """Rank 0, as ranks join: the unread samples of the epoch of the ``members`` (the
        group before the join) at the group's ``position``, to deal over the new group."""
        assert self.loader is not None  # the caller checked (joins need a Loader)
        layout = self.layout()
        epoch, batch = position  # the batches read of the epoch
        return epoch, self.loader.lost_samples(
            epoch, batch, [layout[u] for u in members if u in layout], uids=members)

    def hold(self, lost_deal: tuple[int, Samples] | None) -> None:
        """The lost members' samples rank 0 named, dealt once the regroup is done."""
        self._lost_deal = lost_deal

    def deal_unread(self, rank: int, members: list[int], lost: list[int]) -> None:
        """The lost members' unread samples of the epoch go to the survivors, after their
        own, dealt over the group's ``members`` (by id, so that a member lost later has
        its share dealt again); this rank reads them as ``rank``."""
        deal, self._lost_deal = self._lost_deal, None
        if deal is None or self.loader is None:
            return
        epoch, samples = deal
        try:
            self.loader.deal_unread(epoch, samples, rank, len(members), members=list(members))
        except NotImplementedError as exc:
            logger.warning("live recovery: the unread samples of lost ranks %s are not "
                           "read this epoch: %s", lost, exc)

    def relayout(self, rank: int, world: int, members: list[int]) -> None:
        """After a regroup: the loader reads the next epochs as rank ``rank`` of the new
        group (each member's shard), not with the layout of the job's start."""
        loader = self.loader
        if loader is None:
            return
        self.layout()
        try:
            loader.reshard(rank, world)
        except NotImplementedError:
            return
        self._next_layout = {u: r for r, u in enumerate(members)}

    def after_join(self, deal: tuple[int, Samples] | None, rank: int, world: int,
                   joining: bool, members: list[int]) -> None:
        """Every member and the joiner (``joining``): the epoch's unread samples rank 0
        named (``deal``) are dealt again over the new group's ``members``."""
        loader = self.loader
        if deal is None or loader is None:
            return
        epoch, positions = deal
        if joining:  # its own shard (a group of one's: the whole epoch) is not read
            loader.load_state_dict({**loader.state_dict(), "epoch": epoch,
                                    "batch": len(loader)})
        else:
            loader.end_reads()
        loader.deal_unread(epoch, positions, rank, world, members=list(members))
