"""What live recovery asks of a rank's Loader (internal).

With ``recovery="live"``, a rank's Loader is hooked into its group (``dask_ddp.attach(...,
loader=loader)``). When a member leaves mid-epoch, the survivors name what it had not read
(:meth:`~dask_ddp.data.Loader.lost_samples`) and deal it out
(:meth:`~dask_ddp.data.Loader.deal_unread`); when a member joins, every member stops reading
its own share (:meth:`~dask_ddp.data.Loader.end_reads`) and the epoch's unread samples are
dealt again over the bigger group; from the next epoch on each reads as its new rank
(:meth:`~dask_ddp.data.Loader.reshard`). The group re-forms at the top of a training step,
which the Loader marks by calling ``before_batch`` before it takes each batch.

Every dask-ddp Loader (images, tar shards, tables) is a :class:`~dask_ddp.data.Loader` and
answers these calls itself; the launcher types them with that class (``Redealable``) and
picks a Loader with :func:`redealable`, never by probing attributes.
"""

from __future__ import annotations

from dask_ddp.data.loader import Loader

__all__ = ["Redealable", "redealable"]

#: The Loader live recovery calls: the one class every dask-ddp Loader is.
Redealable = Loader


def redealable(loader: object) -> Loader | None:
    """``loader`` as live recovery's Loader when it is a dask-ddp Loader, else None (a
    torch DataLoader, say: its samples cannot be dealt out again)."""
    return loader if isinstance(loader, Loader) else None
