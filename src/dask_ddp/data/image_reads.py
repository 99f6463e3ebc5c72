"""An image Loader's engine half (internal): its engine loader, and what its kind of
dataset changes.

A :class:`~dask_ddp.data.Loader` over images keeps its options, its position and the
Loader protocol; its engine half (an :class:`EngineHalf`: :class:`ImageReads` for an image
list or a ``Subset`` of one, :class:`ShardReads` for tar shards; :func:`engine_half` makes
the one of a dataset) holds the engine
loader of the Loader's rank layout (made again at a ``reshard``) and the engine loaders of
live recovery's deals, and answers what differs between the two kinds of dataset: the
epoch's sample and batch counts, a batch's tuple, the samples a rank had not read, the
state dict's own entries and where a saved state resumes. Tar shards add the epoch's
sample runs: a state saved on another world size resumes with the samples no rank had
yielded (see :class:`~dask_ddp.data.TarShards`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.data import Subset

from dask_ddp.data import transforms as T
from dask_ddp.data.datasets import ImageList
from dask_ddp.data.engine import ImageSource, Op, resolve_dataset
from dask_ddp.data.resume import Segments, check_batch, check_saved, shard_resume
from dask_ddp.data.shards import TarShards
from dask_ddp.data.unread import UnreadDeals, lost_positions, shard_deal, shard_lost, shard_share

if TYPE_CHECKING:
    from dask_ddp.data.device import DeviceStage
    from dask_ddp.data.loader import Loader

__all__ = ["EngineHalf", "ImageReads", "ShardReads", "engine_half", "pipeline"]


def pipeline(dataset: ImageList | TarShards | Subset[Any], transform: T.Transform | None,
             *, who: str = "Loader") -> tuple[object, list[Op]]:
    """The transform a Loader (``who``: another reader) over ``dataset`` runs
    (``transform``, else the dataset's own) and its engine ops.

    Raises
    ------
    ValueError
        There is none, and the dataset has images (tar shards may have none).
    TypeError
        It is not built from :mod:`dask_ddp.data.transforms` (a torchvision transform).
    """
    shards = dataset if isinstance(dataset, TarShards) else None
    own = shards.transform if shards is not None else resolve_dataset(dataset)[0].transform
    chosen: object = own if transform is None else transform
    if chosen is None and (shards is None or shards.image_field is not None):
        raise ValueError(
            f"{who} needs a transform with a fixed output size, e.g. "
            "transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])"
        )
    return chosen, [] if chosen is None else T.to_ops(chosen)


def engine_half(dataset: ImageList | TarShards | Subset[Any], loader: Loader,
                stage: DeviceStage, *, max_side: int, scaled_decode: bool,
                region_decode: bool) -> EngineHalf:
    """The engine half of ``loader``, a Loader over ``dataset``, with the decode options.
    Every engine loader is made by the device ``stage`` (:meth:`DeviceStage.reader`: the
    pipeline's engine ops, and on a GPU its page-locked buffers lent)."""
    options: dict[str, Any] = {
        "batch_size": loader.batch_size, "shuffle": loader.shuffle, "seed": loader.seed,
        "rank": loader.rank, "world_size": loader.world_size, "drop_last": loader.drop_last,
        "num_threads": loader.num_threads, "prefetch": loader.prefetch,
        "skip_errors": loader.on_error == "skip", "max_side": int(max_side),
        "scaled_decode": bool(scaled_decode), "region_decode": bool(region_decode),
    }
    if isinstance(dataset, TarShards):
        return ShardReads(dataset, stage, options)
    return ImageReads(dataset, stage, options)


class EngineHalf(abc.ABC):
    """An image Loader's engine half (see the module): its engine loaders, and the
    questions each kind of dataset answers.

    Parameters
    ----------
    make
        ``make(rank, world_size)``: the engine loader of the own share of that rank.
    deals
        The samples dealt to the Loader after its own share (live recovery).
    rank, world_size
        The Loader's layout.

    Attributes
    ----------
    core
        The engine loader of the Loader's own share (of its rank layout).
    deals
        As given.
    """

    def __init__(self, make: Callable[[int, int], Any], deals: UnreadDeals[Any], rank: int,
                 world_size: int) -> None:
        self._make, self.deals = make, deals
        self.core = make(rank, world_size)

    def relayout(self, rank: int, world_size: int) -> None:
        """Read from now on as rank ``rank`` of ``world_size`` (a new engine loader; the
        old one is closed, its lent buffers freed)."""
        self.core.close()
        self.core = self._make(rank, world_size)

    def new_epoch(self) -> None:
        """Another epoch was set: the deals of the one before end (their engine loaders
        closed, their lent buffers freed)."""
        self.deals.close()

    def close(self) -> None:
        """Close every engine loader (the own share's and the deals')."""
        self.core.close()
        self.deals.close()

    @property
    @abc.abstractmethod
    def image_at(self) -> int | None:
        """The position of the image batch in a yielded tuple (None: no images)."""

    @abc.abstractmethod
    def num_samples(self, epoch: int) -> int:
        """The own share's samples in ``epoch`` (padding included)."""

    @abc.abstractmethod
    def num_batches(self, epoch: int) -> int:
        """The own share's batches in ``epoch``."""

    @abc.abstractmethod
    def batch(self, item: tuple[Any, ...]) -> tuple[Any, ...]:
        """The Loader's tuple for a batch from the engine (images, labels, index, ...)."""

    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """The state dict's entries of this kind of dataset."""

    @abc.abstractmethod
    def resume(self, state: Mapping[str, Any], loader: Loader) -> int:
        """The batch of the saved epoch to resume at (its sample runs set).

        Raises
        ------
        ValueError
            ``state`` was saved with other options (or, for an image list, world size), or
            its batch is past the epoch's.
        """

    @abc.abstractmethod
    def lost(self, loader: Loader, epoch: int, batch: int, ranks: list[int]
             ) -> list[int]:
        """The samples of ``epoch`` that ``ranks`` had not yielded after ``batch`` batches
        each, in rank order."""


class ImageReads(EngineHalf):
    """The engine half of a Loader over an image list or a ``Subset`` of one: the deals
    are positions in the list, read unshuffled."""

    def __init__(self, dataset: ImageList | Subset[Any], stage: DeviceStage,
                 options: dict[str, Any]) -> None:
        # The dataset's own store (its URL, credentials and options: endpoint, region, CA
        # bundle, retries), opened in this process.
        source = ImageSource.of(dataset)

        def make(r: int, w: int) -> Any:
            return stage.reader(lambda ops: source.loader(
                ops, **{**options, "rank": r, "world_size": w}))

        deals = UnreadDeals(lambda _, pos, r, w: stage.reader(lambda ops: source.subset(
            pos).loader(ops, **{**options, "shuffle": False, "rank": r, "world_size": w})),
            options["batch_size"], options["drop_last"])
        super().__init__(make, deals, options["rank"], options["world_size"])

    @property
    def image_at(self) -> int | None:
        return 0

    def num_samples(self, epoch: int) -> int:
        return int(self.core.num_samples)

    def num_batches(self, epoch: int) -> int:
        return int(self.core.num_batches)

    def batch(self, item: tuple[Any, ...]) -> tuple[Any, ...]:
        """``(images, labels)``."""
        return item[:2]

    def state(self) -> dict[str, Any]:
        return {}

    def resume(self, state: Mapping[str, Any], loader: Loader) -> int:
        epoch = int(state["epoch"])
        check_saved(state, {"seed": loader.seed, "shuffle": loader.shuffle,
                            "world_size": loader.world_size,
                            "num_batches": self.num_batches(epoch)})
        return check_batch(int(state["batch"]), self.num_batches(epoch))

    def lost(self, loader: Loader, epoch: int, batch: int, ranks: list[int]
             ) -> list[int]:
        """Positions in the list."""
        return lost_positions(loader, epoch, batch, ranks)


class ShardReads(EngineHalf):
    """The engine half of a Loader over tar shards: the deals are sample ids, read in the
    shards' order.

    Attributes
    ----------
    segments
        The restored epoch's (shard, begin, end) sample runs (None: every shard whole).
    """

    def __init__(self, shards: TarShards, stage: DeviceStage,
                 options: dict[str, Any]) -> None:
        skip = bool(options["skip_errors"])

        def make(r: int, w: int) -> Any:
            return stage.reader(lambda ops: shards.engine_loader(
                ops, **{**options, "rank": r, "world_size": w}))

        self.shards, self.skip_errors = shards, skip
        self.batch_size, self.drop_last = options["batch_size"], options["drop_last"]
        deals = UnreadDeals(
            lambda epoch, ids, r, w: shard_deal(shards, epoch, ids, make(r, w), skip),
            self.batch_size, self.drop_last,
            share_order=lambda epoch, ids, r, w: shard_share(
                shards, epoch, ids, r, w, shuffle=bool(options["shuffle"]),
                seed=options["seed"], drop_last=self.drop_last, skip_errors=skip))
        super().__init__(make, deals, options["rank"], options["world_size"])
        self.segments: Segments | None = None

    @property
    def image_at(self) -> int | None:
        return self.shards.image_field

    def new_epoch(self) -> None:
        """Also forget the restored epoch's sample runs."""
        super().new_epoch()
        self.segments = None

    def num_samples(self, epoch: int) -> int:
        return int(self.core.epoch_samples(epoch))

    def num_batches(self, epoch: int) -> int:
        n = self.num_samples(epoch)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def batch(self, item: tuple[Any, ...]) -> tuple[Any, ...]:
        """The Loader's tuple: ``(images, labels)``, or the shards' fields in order."""
        return self.shards.batch_tuple(item)

    def state(self) -> dict[str, Any]:
        return {"drop_last": self.drop_last, "batch_size": self.batch_size,
                "epoch_segments": self.segments}

    def resume(self, state: Mapping[str, Any], loader: Loader) -> int:
        check_saved(state, {"seed": loader.seed, "shuffle": loader.shuffle,
                            "drop_last": loader.drop_last, "batch_size": loader.batch_size})
        batch, segments = shard_resume(
            state, self.shards, world_size=loader.world_size, batch_size=self.batch_size,
            shuffle=bool(loader.shuffle), seed=loader.seed, drop_last=self.drop_last,
            skip_errors=self.skip_errors)
        if segments is not None:
            self.core.set_epoch_segments(int(state["epoch"]), segments)
        self.segments = segments
        return check_batch(batch, self.num_batches(int(state["epoch"])))

    def lost(self, loader: Loader, epoch: int, batch: int, ranks: list[int]
             ) -> list[int]:
        """Sample ids, each rank's in its reading order."""
        return shard_lost(self.shards, epoch, batch * self.batch_size, ranks,
                          loader.world_size, shuffle=bool(loader.shuffle), seed=loader.seed,
                          drop_last=self.drop_last, segments=self.segments,
                          skip_errors=self.skip_errors)
