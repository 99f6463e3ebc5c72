"""The Sources of the engine's data kinds (internal): what a Loader reads, and everything
its kind of dataset decides.

A :class:`~dask_ddp.data.Loader` keeps its options, its position and the device stage;
its :class:`Source` (:class:`ImageListSource` for an image list or a ``Subset`` of one,
:class:`ShardSource` for tar shards; :func:`source_for` makes the one of a dataset) owns
the reader of the Loader's rank layout (an engine loader, made again at a ``reshard``),
the readers of live recovery's deals, and what differs between kinds: the epoch's sample
and batch counts, a batch's tuple, the samples a rank had not read and a deal's share of
them, the state dict's own entries and where a saved state resumes. This mirrors the
engine's ``pipeline::SampleSource`` (one source per kind under one loader).
"""

from __future__ import annotations

import abc
import bisect
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from torch.utils.data import Subset

from dask_ddp import _core
from dask_ddp.data import transforms as T
from dask_ddp.data.datasets import ImageList
from dask_ddp.data.engine import ImageSource, Op, resolve_dataset
from dask_ddp.data.resume import Segments, check_batch, check_saved
from dask_ddp.data.shards import TarShards
from dask_ddp.data.unread import UnreadDeals, rank_indices

if TYPE_CHECKING:
    from dask_ddp.data.device import DeviceStage
    from dask_ddp.data.unread import Samples

__all__ = ["ImageListSource", "ShardSource", "Source", "pipeline", "source_for"]

logger = logging.getLogger(__name__)


class Loader(Protocol):
    """What a Source reads of its :class:`~dask_ddp.data.Loader`: the options it was made
    with and its rank layout (a Protocol, so this module needs nothing of the Loader's)."""

    dataset: Any
    batch_size: int
    drop_last: bool
    shuffle: Any  # a bool for images
    seed: int
    on_error: Any
    num_threads: int
    prefetch: int
    rank: int
    world_size: int


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


def source_for(dataset: ImageList | TarShards | Subset[Any], loader: Loader,
                stage: DeviceStage, *, max_side: int, scaled_decode: bool,
                region_decode: bool) -> Source:
    """The Source of ``loader``, a Loader over ``dataset``, with the decode options.
    Every engine loader is made by the device ``stage`` (:meth:`DeviceStage.reader`: the
    pipeline's engine ops, and on a GPU its page-locked buffers lent)."""
    options: dict[str, Any] = {
        "batch_size": loader.batch_size, "shuffle": loader.shuffle, "seed": loader.seed,
        "rank": loader.rank, "world_size": loader.world_size, "drop_last": loader.drop_last,
        "num_threads": loader.num_threads, "prefetch": loader.prefetch + stage.holds,
        "skip_errors": loader.on_error == "skip", "max_side": int(max_side),
        "scaled_decode": bool(scaled_decode), "region_decode": bool(region_decode),
    }
    if isinstance(dataset, TarShards):
        return ShardSource(dataset, stage, options)
    return ImageListSource(dataset, stage, options)


class Source(abc.ABC):
    """A Loader's Source (see the module): its readers, and the questions each kind of
    dataset answers; the :class:`~dask_ddp.data.unread.Dealer` of its deals. ``options``:
    the engine loaders' (the Loader's ``rank``, ``world_size``, ``batch_size``, ...).

    Attributes
    ----------
    core
        The engine loader of the Loader's own share (of its rank layout).
    deals
        The samples dealt to the Loader after its own share (live recovery).
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.batch_size, self.drop_last = options["batch_size"], options["drop_last"]
        self.deals: UnreadDeals[Any] = UnreadDeals(self, self.batch_size, self.drop_last)
        self.core = self.reader(options["rank"], options["world_size"])

    @abc.abstractmethod
    def reader(self, rank: int, world_size: int) -> Any:
        """The engine loader of rank ``rank`` of ``world_size``'s own share."""

    @abc.abstractmethod
    def deal_reader(self, epoch: int, samples: Samples, rank: int, world_size: int) -> Any:
        """The engine loader of a deal of ``samples`` of ``epoch`` (live recovery)."""

    def deal_share(self, epoch: int, samples: Samples, rank: int, world_size: int
                   ) -> Samples:
        """Every ``world_size``-th sample from ``rank``, unshuffled (an image list's)."""
        return [samples[i] for i in rank_indices(len(samples), epoch, rank, world_size,
                                                 shuffle=False, drop_last=self.drop_last)]

    def relayout(self, rank: int, world_size: int) -> None:
        """Read from now on as rank ``rank`` of ``world_size`` (a new engine loader; the
        old one is closed, its lent buffers freed)."""
        self.core.close()
        self.core = self.reader(rank, world_size)

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


class ImageListSource(Source):
    """The Source of an image list or a ``Subset`` of one: the deals
    are positions in the list, read unshuffled."""

    def __init__(self, dataset: ImageList | Subset[Any], stage: DeviceStage,
                 options: dict[str, Any]) -> None:
        # The dataset's own store (its URL, credentials and options: endpoint, region, CA
        # bundle, retries), opened in this process.
        self.images, self.stage, self.options = ImageSource.of(dataset), stage, options
        super().__init__(options)

    def reader(self, rank: int, world_size: int) -> Any:
        return self.stage.reader(lambda ops: self.images.loader(
            ops, **{**self.options, "rank": rank, "world_size": world_size}))

    def deal_reader(self, epoch: int, samples: Samples, rank: int, world_size: int) -> Any:
        return self.stage.reader(lambda ops: self.images.subset(samples).loader(
            ops, **{**self.options, "shuffle": False, "rank": rank, "world_size": world_size}))

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
        """Positions in the list, each rank's in its reading order (the engine's)."""
        return [i for r in sorted(ranks) for i in rank_indices(
            len(loader.dataset), epoch, r, loader.world_size, shuffle=bool(loader.shuffle),
            seed=loader.seed, drop_last=loader.drop_last)[batch * loader.batch_size:]]


class ShardSource(Source):
    """The Source of tar shards: the deals are sample ids, read in the shards' order; a
    state saved on another world size resumes with the samples no rank had yielded.

    Attributes
    ----------
    segments
        The restored epoch's (shard, begin, end) sample runs (None: every shard whole).
    """

    def __init__(self, shards: TarShards, stage: DeviceStage,
                 options: dict[str, Any]) -> None:
        self.shards, self.stage, self.options = shards, stage, options
        self.skip_errors = bool(options["skip_errors"])
        self.shuffle, self.seed = bool(options["shuffle"]), int(options["seed"])
        self.segments: Segments | None = None
        super().__init__(options)

    def reader(self, rank: int, world_size: int) -> Any:
        return self.stage.reader(lambda ops: self.shards.engine_loader(
            ops, **{**self.options, "rank": rank, "world_size": world_size}))

    def deal_reader(self, epoch: int, samples: Samples, rank: int, world_size: int) -> Any:
        (core := self.reader(rank, world_size)).set_epoch_segments(epoch, self._runs(samples))
        return core

    def deal_share(self, epoch: int, samples: Samples, rank: int, world_size: int
                   ) -> Samples:
        return self._order(self._runs(samples), epoch, rank, world_size)

    def _order(self, segments: Segments | None, epoch: int, rank: int, world_size: int
               ) -> list[int]:
        """The sample ids rank ``rank`` of ``world_size`` reads of ``epoch``'s runs
        ``segments`` (None: every shard whole), in its reading order (the engine's)."""
        return [int(i) for i in _core.shard_rank_order(
            self.shards.shard_counts(self.skip_errors), segments, epoch, rank, world_size,
            shuffle=self.shuffle, seed=self.seed, drop_last=self.drop_last,
            shuffle_buffer=self.shards.shuffle_buffer)[0]]

    def _runs(self, ids: Samples) -> Segments:
        """Sample ids as (shard, begin, end) runs, in their order."""
        starts = [0]
        for c in self.shards.shard_counts(self.skip_errors):
            starts.append(starts[-1] + int(c))
        out: Segments = []
        for i in ids:
            shard = bisect.bisect_right(starts, i) - 1
            off = int(i) - starts[shard]
            if out and out[-1][0] == shard and out[-1][2] == off:
                out[-1] = (shard, out[-1][1], off + 1)
            else:
                out.append((shard, off, off + 1))
        return out

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
        """On the saved world size, the saved position; on another, batch 0 of the
        samples no rank had yielded, dealt over the Loader's world size."""
        check_saved(state, {"seed": loader.seed, "shuffle": loader.shuffle,
                            "drop_last": loader.drop_last, "batch_size": loader.batch_size})
        epoch, batch, saved_on = int(state["epoch"]), int(state["batch"]), int(
            state["world_size"])
        segments = self._saved_runs(state)
        if saved_on != loader.world_size:
            segments = self.shards.unread_segments(
                epoch, min(batch * self.batch_size, 1 << 62), world_size=saved_on,
                shuffle=self.shuffle, seed=self.seed, drop_last=self.drop_last,
                epoch_segments=segments, skip_errors=self.skip_errors)
            logger.info("resuming epoch %d on %d ranks (saved on %d): %d samples left to "
                        "read", epoch, loader.world_size, saved_on,
                        sum(e - b for _, b, e in segments))
            batch = 0
        if segments is not None:
            self.core.set_epoch_segments(epoch, segments)
        self.segments = segments
        return check_batch(batch, self.num_batches(epoch))

    def _saved_runs(self, state: Mapping[str, Any]) -> Segments | None:
        """The epoch's runs saved in a state dict (None: every shard whole); a state saved
        with a list of whole shards (``epoch_shards``) reads as runs."""
        if state.get("epoch_segments") is not None:
            return [(int(s), int(b), int(e)) for s, b, e in state["epoch_segments"]]
        if state.get("epoch_shards") is not None:
            counts = self.shards.shard_counts(self.skip_errors)
            return [(int(s), 0, counts[int(s)]) for s in state["epoch_shards"]]
        return None

    def lost(self, loader: Loader, epoch: int, batch: int, ranks: list[int]
             ) -> list[int]:
        """Sample ids, each rank's in its reading order."""
        return [i for r in sorted(ranks) for i in self._order(
            self.segments, epoch, r, loader.world_size)[batch * self.batch_size:]]
