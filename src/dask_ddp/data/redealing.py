"""A Loader's live-recovery state: what its :class:`~dask_ddp.data.redeal.Redealable`
methods delegate to (internal).

Each Loader (images and tar shards, tables) owns one :class:`Redealing`: the samples dealt
to it after its own share of the epoch (:class:`~dask_ddp.data.unread.UnreadDeals`, made
with the Loader's own kind of engine loader or rows), the rank layout a ``reshard`` set
for the next epoch, and the state dict's ``"unread"`` entry (saved in an epoch that had
samples dealt, resumed by dealing every rank's entries again). The Loader keeps its
position and its own share; what ending its reads means for its kind (an engine loader
stopped, a feeding thread cut) stays with it. Where the machinery needs the Loader, it
asks through the Loader's public methods (:class:`Dealt`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from dask_ddp.data.unread import Samples, UnreadDeals

__all__ = ["Dealt", "Redealing"]


class Dealt(Protocol):
    """The Loader a :class:`Redealing` belongs to, as the machinery calls it (its public
    face: ``dask_ddp.data.redeal.Redealable``'s, and the rank and unread samples)."""

    epoch: int
    rank: int

    def __len__(self) -> int: ...

    @property
    def epoch_progress(self) -> int: ...

    def lost_samples(self, epoch: int, batch: int, ranks: list[int],
                     uids: list[Any] | None = None) -> Samples: ...

    def deal_unread(self, epoch: int, positions: Samples, rank: int, world_size: int,
                    members: list[Any] | None = None) -> None: ...

    def unread_samples(self) -> Samples: ...

    def resume_unread(self, epoch: int, samples: Samples, rank: int,
                      world_size: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Redealing:
    """The samples dealt to a Loader in an epoch, and the layout it reads as next.

    Parameters
    ----------
    deals
        The Loader's deals: an engine loader (or rows) per deal, read after its own share.
    """

    def __init__(self, deals: UnreadDeals) -> None:
        self.deals = deals
        #: The (rank, world size) of a :meth:`reshard`, taken at the next epoch.
        self.next_layout: tuple[int, int] | None = None

    # -- the layout of the next epoch --------------------------------------------------
    def reshard(self, rank: int, world_size: int) -> None:
        """Read as rank ``rank`` of ``world_size`` from the next epoch on.

        Raises
        ------
        ValueError
            ``rank`` is not in ``[0, world_size)``.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.next_layout = (int(rank), int(world_size))

    @property
    def layout_pending(self) -> bool:
        """Whether a :meth:`reshard` waits for the next epoch."""
        return self.next_layout is not None

    def take_layout(self) -> tuple[int, int] | None:
        """The layout of a :meth:`reshard` (``None``: none), now taken."""
        layout, self.next_layout = self.next_layout, None
        return layout

    # -- the samples dealt in an epoch -------------------------------------------------
    def reading(self, epoch: int) -> bool:
        """Whether ``epoch``'s own share is done and its dealt samples are being read."""
        return self.deals.reading == epoch

    def progress(self, epoch: int, position: int, own_batches: Callable[[], int]) -> int:
        """Batches of ``epoch`` yielded: ``position`` of the own share's, or, reading the
        deals, all the own share's (``own_batches()``) and the dealt batches read."""
        if not self.reading(epoch):
            return position
        return own_batches() + self.deals.batches_before_current() + position

    def deal(self, epoch: int, samples: Samples, rank: int, world_size: int,
             members: Sequence[Any] | None = None) -> None:
        """Read ``samples`` of ``epoch`` after the own share, dealt as rank ``rank`` of
        ``world_size`` (``members``: each member's id in the deal's rank order)."""
        self.deals.add(epoch, samples, rank, world_size, members)

    def next_core(self, epoch: int) -> Any:
        """The next deal of ``epoch`` to read, started (``None``: none left)."""
        return self.deals.next_core(epoch)

    def lost(self, epoch: int, batch: int, own_batches: int, members: Sequence[Any]
             ) -> list[int]:
        """The dealt samples of ``epoch`` that ``members`` had not read after ``batch``
        batches of the epoch, of which ``own_batches`` were their own share's."""
        return self.deals.lost_share(epoch, max(batch - own_batches, 0), members)

    def cut(self, epoch: int, position: int) -> bool:
        """End what was dealt of ``epoch`` so far: the deals not started are dropped, the
        one being read (if any) stops after its ``position`` batches read. Whether one was
        being read (else the caller ends the own share)."""
        cut = self.deals.cut(epoch, position)
        if cut is not None:
            core, batches = cut
            core.start_epoch(epoch, batches)
        return self.reading(epoch)

    # -- the state dict's "unread" entry -----------------------------------------------
    def unread_samples(self, loader: Dealt) -> Samples:
        """``loader``'s samples of the current epoch not yet yielded: the rest of its own
        share, then of the samples dealt to it, in reading order."""
        progress, own = loader.epoch_progress, len(loader)
        out = list(loader.lost_samples(loader.epoch, min(progress, own), [loader.rank],
                                       uids=[]))
        return out + self.deals.own_unread(loader.epoch, max(progress - own, 0))

    def saved(self, loader: Dealt) -> dict[str, Any]:
        """The state dict's ``"unread"`` entry (``loader``'s unread samples) in an epoch
        that had samples dealt to it, else nothing."""
        if not self.deals.dealt_in(loader.epoch):
            return {}
        return {"unread": torch.as_tensor([int(i) for i in loader.unread_samples()],
                                          dtype=torch.int64)}

    def took_unread(self, loader: Dealt, state: dict[str, Any]) -> bool:
        """Load a state with ``"unread"`` into ``loader`` (its ``resume_unread`` as rank 0
        of 1); whether it had them."""
        if state.get("unread") is None:
            return False
        loader.resume_unread(int(state["epoch"]), state["unread"], 0, 1)
        return True

    def resume_unread(self, loader: Dealt, epoch: int, samples: Samples, rank: int,
                      world_size: int) -> None:
        """Continue ``epoch`` in ``loader`` with ``samples`` dealt as rank ``rank`` of
        ``world_size``, its own share of it read."""
        state = {k: v for k, v in loader.state_dict().items() if k != "unread"}
        loader.load_state_dict({**state, "epoch": int(epoch), "batch": len(loader)})
        ids = torch.as_tensor(samples, dtype=torch.int64).tolist()
        loader.deal_unread(int(epoch), ids, rank, world_size)
