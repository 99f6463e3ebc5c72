"""What live recovery asks of a rank's Loader: the :class:`Redealable` contract.

With ``recovery="live"``, a rank's Loader is hooked into its group (``dask_ddp.attach(...,
loader=loader)``). When a member leaves mid-epoch, the survivors name what it had not read
(:meth:`~Redealable.lost_samples`) and deal it out (:meth:`~Redealable.deal_unread`); when
a member joins, every member stops reading its own share (:meth:`~Redealable.end_reads`) and
the epoch's unread samples are dealt again over the bigger group; from the next epoch on
each reads as its new rank (:meth:`~Redealable.reshard`). The group re-forms at the top of a
training step, which the Loader marks by calling :attr:`~Redealable.before_batch` before it
takes each batch.

Both Loaders (images and tar shards, and tables) implement it, by delegating to the
live-recovery state each owns (:class:`~dask_ddp.data.redealing.Redealing`); the launcher
types its calls with this Protocol and picks a Loader with :func:`redealable`, never by
probing attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dask_ddp.data.unread import Samples

__all__ = ["Redealable", "redealable"]


class Redealable(Protocol):
    """A Loader whose epoch live recovery can deal out again (see the module)."""

    #: Called before each batch is taken: the top of a training step. Set by the launcher.
    before_batch: Callable[[], None] | None
    epoch: int
    world_size: int

    def __len__(self) -> int:
        """Batches of the current epoch in this rank's own share."""
        ...

    @property
    def epoch_progress(self) -> int:
        """Batches of the current epoch yielded: the own share's, then the dealt ones'."""
        ...

    @property
    def layout_pending(self) -> bool:
        """Whether a :meth:`reshard` waits for the next epoch."""
        ...

    def lost_samples(self, epoch: int, batch: int, ranks: list[int],
                     uids: list[Any] | None = None) -> Samples:
        """The samples of ``epoch`` that ``ranks`` had not yielded after ``batch``
        batches each (with their shares of earlier deals, by member id ``uids``)."""
        ...

    def deal_unread(self, epoch: int, positions: Samples, rank: int, world_size: int,
                    members: list[Any] | None = None) -> None:
        """Read these samples of ``epoch`` after the own share, dealt as ``rank`` of
        ``world_size``."""
        ...

    def end_reads(self) -> None:
        """Read nothing more of what this rank had left of the current epoch."""
        ...

    def reshard(self, rank: int, world_size: int) -> None:
        """Read the epochs after the current one as ``rank`` of ``world_size``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position in the epoch."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        ...


def redealable(loader: object) -> Redealable | None:
    """``loader`` as live recovery's Loader when it is a dask-ddp Loader, else None (a
    torch DataLoader, say: its samples cannot be dealt out again)."""
    from dask_ddp.data.loader import Loader

    return loader if isinstance(loader, Loader) else None
