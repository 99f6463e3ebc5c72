"""A lost rank's unread samples, dealt to the ranks that go on (live recovery).

When a rank leaves a job mid-epoch (``recovery="live"``), the samples of its shard it
had not trained on are read by the survivors after their own shard of the epoch, so that
every sample of the epoch is trained on exactly once (plus at most ``world_size - 1``
padding repeats per deal, as ``DistributedSampler`` pads). :func:`rank_indices` asks the
engine's sampler (``cpp/src/pipeline/sampler.cc``) for a rank's order: it names the lost
rank's samples without reading them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, Union

if TYPE_CHECKING:
    import numpy as np

#: Samples named for a deal: positions in an image list, sample ids of tar shards (lists),
#: or a table's global row ids (an int64 array).
Samples = Union[Sequence[int], "np.ndarray"]


class DealReader(Protocol):
    """What reads one deal: a Source's reader (an engine loader, an ``IdReader``, a
    table's ``TableReader``)."""

    def start_epoch(self, epoch: int, start: int, /) -> None: ...

    def close(self) -> None: ...


R = TypeVar("R", bound=DealReader)
R_co = TypeVar("R_co", bound=DealReader, covariant=True)


class Dealer(Protocol[R_co]):
    """What deals samples of an epoch (positions in an image list, sample ids of tar
    shards, a table's rows) as rank ``rank`` of ``world_size``: the reader of a deal, and
    the samples it reads in its order (a Loader's Source)."""

    def deal_reader(self, epoch: int, samples: Samples, rank: int, world: int, /) -> R_co: ...

    def deal_share(self, epoch: int, samples: Samples, rank: int, world: int, /) -> Samples: ...


def rank_indices(n: int, epoch: int, rank: int, world_size: int, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> list[int]:
    """The dataset indices rank ``rank`` of ``world_size`` reads in ``epoch``, in order:
    the engine's ``DistributedSampler`` itself (``_core.sampler_indices``), the order the
    Loader reads."""
    from dask_ddp import _core

    return [int(i) for i in _core.sampler_indices(n, epoch, rank, world_size,
                                                  shuffle=shuffle, seed=seed,
                                                  drop_last=drop_last)]


class UnreadDeals(Generic[R]):
    """The extra sample lists of a Loader's current epoch, read after its own shard;
    ``dealer`` makes each deal's reader and says which samples it reads."""

    def __init__(self, dealer: Dealer[R], batch_size: int = 1, drop_last: bool = False
                 ) -> None:
        self.dealer = dealer
        self.batch_size, self.drop_last = batch_size, drop_last
        self.epoch: int | None = None
        self.pending: list[R] = []
        #: This epoch's deals, in reading order: (samples, the members' ids in the deal's
        #: rank order or None, world size, batches of each member's share, this loader's
        #: rank in the deal).
        self.deals: list[tuple[Samples, list[Any] | None, int, int, int]] = []
        #: The epoch whose dealt samples are being read (its own shard is done).
        self.reading: int | None = None
        #: The reader of the deal being read.
        self.current: R | None = None

    def add(self, epoch: int, positions: Samples, rank: int, world_size: int,
            members: Sequence[Any] | None = None) -> None:
        """Deal ``positions`` of ``epoch`` (an empty list: nothing); ``members``, each
        member's id in the deal's rank order, lets :meth:`lost_share` name what a member
        lost later had not read of it."""
        if len(positions) == 0:
            return
        if self.epoch != epoch:
            self.epoch, self.pending, self.deals = epoch, [], []
        self.pending.append(self.dealer.deal_reader(epoch, positions, rank, world_size))
        n = len(positions)
        share = (n // world_size) if self.drop_last else -(-n // world_size)
        batches = share // self.batch_size if self.drop_last else -(-share // self.batch_size)
        self.deals.append((positions, None if members is None else list(members),
                           world_size, batches, rank))

    def next_core(self, epoch: int) -> R | None:
        """The next engine loader of ``epoch``'s extra samples, started; ``None`` when
        there is none left."""
        pending = self.pending  # close() from another thread may replace it meanwhile
        if self.epoch != epoch or not pending:
            return None
        core = pending.pop(0)
        core.start_epoch(epoch, 0)
        self.reading, self.current = epoch, core
        return core

    def cut(self, epoch: int, consumed: int) -> bool:
        """End what was dealt of ``epoch`` so far (live recovery: a rank joins and every
        unread sample is dealt again over the bigger group): the deals not started are
        dropped, and the one being read, if any, stops after the ``consumed`` batches read
        of it; :meth:`lost_share` counts them so from now on. Whether one was being read
        (else the caller ends its own share)."""
        if self.epoch != epoch:
            return self.reading == epoch
        started = len(self.deals) - len(self.pending)
        self.pending = []
        del self.deals[started:]
        if self.reading == epoch and started > 0 and self.current is not None:
            positions, members, world, batches, rank = self.deals[-1]
            self.deals[-1] = (positions, members, world, min(int(consumed), batches), rank)
            self.current.start_epoch(epoch, batches)
        return self.reading == epoch

    def stop_current(self) -> None:
        """Close the reader of the deal being read (a loop left it early)."""
        current, self.current = self.current, None
        if current is not None:
            current.close()

    def close(self) -> None:
        """Close the engine loaders of the deals (those not started and the one being read)
        and forget the deals: the Loader moved to another epoch or closes, and their
        buffers go back now rather than when they are next replaced."""
        cores = [*self.pending, self.current]
        self.epoch, self.pending, self.deals = None, [], []
        self.reading, self.current = None, None
        for core in cores:
            if core is not None:
                core.close()

    def batches_before_current(self) -> int:
        """The batches of the deals read to their end before the one being read."""
        current = len(self.deals) - len(self.pending) - 1
        return sum(d[3] for d in self.deals[:max(current, 0)])

    def _unread_deals(self, epoch: int, consumed: int
                      ) -> Iterator[tuple[Samples, list[Any] | None, int, int, int]]:
        """The deals of ``epoch`` not read to their end after ``consumed`` batches of them
        (every member reads its shares in the same order, one batch a step): (samples,
        members, world size, this loader's rank in it, the first unread sample of a
        share)."""
        if self.epoch != epoch:
            return
        for positions, members, world, batches, rank in self.deals:
            if consumed >= batches:
                consumed -= batches
                continue
            yield positions, members, world, rank, consumed * self.batch_size
            consumed = 0

    def lost_share(self, epoch: int, consumed: int, lost: Sequence[Any]) -> list[int]:
        """The dealt samples of ``epoch`` that the ``lost`` members had not read after
        ``consumed`` batches of the deals, in deal and member order."""
        out: list[int] = []
        for positions, members, world, _, start in self._unread_deals(epoch, consumed):
            for m in lost:
                if members is not None and m in members:
                    share = self.dealer.deal_share(epoch, positions, members.index(m), world)
                    out += [int(i) for i in share[start:]]
        return out

    def dealt_in(self, epoch: int) -> bool:
        """Whether samples were dealt to this loader in ``epoch``."""
        return self.epoch == epoch and bool(self.deals)

    def own_unread(self, epoch: int, consumed: int) -> list[int]:
        """This loader's own unread shares of ``epoch``'s deals after ``consumed`` batches
        of them, in reading order."""
        return [int(i) for positions, _, world, rank, start in
                self._unread_deals(epoch, consumed)
                for i in self.dealer.deal_share(epoch, positions, rank, world)[start:]]
