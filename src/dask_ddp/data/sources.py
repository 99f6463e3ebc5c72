"""The data kinds' seam: a :class:`Source` per kind (``dask_ddp.data.Source``).

A :class:`~dask_ddp.data.Loader` keeps its options, its position and the device stage; its
Source owns everything its kind of data decides (see the class). An image list or a
``Subset`` of one is read by :class:`ImageListSource`, tar shards by :class:`ShardSource`
(:func:`source_for` makes the one of a dataset), both with the C++ engine, whose
``pipeline::SampleSource`` has the same shape: one source per kind under one loader.
"""

from __future__ import annotations

import bisect
import copy
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch.utils.data import Subset

from dask_ddp import _core
from dask_ddp.data import transforms as T
from dask_ddp.data.datasets import ImageList
from dask_ddp.data.engine import ImageSource, Op, resolve_dataset
from dask_ddp.data.shards import TarShards
from dask_ddp.data.unread import DealReader, UnreadDeals, rank_indices

if TYPE_CHECKING:
    from dask_ddp.data.device import DeviceStage
    from dask_ddp.data.unread import Samples

__all__ = ["IdReader", "ImageListSource", "Reader", "Segments", "ShardSource", "Source",
           "check_batch", "check_saved", "pipeline", "source_for"]

logger = logging.getLogger(__name__)

#: (shard, begin, end) runs of samples.
Segments = list[tuple[int, int, int]]


class Loader(Protocol):
    """What a Source reads of its :class:`~dask_ddp.data.Loader`: the options it was made
    with and its rank layout (a Protocol, so this module needs nothing of the Loader's)."""

    batch_size: int
    drop_last: bool
    shuffle: Any  # a bool for images
    seed: int
    on_error: Any
    num_threads: int
    prefetch: int
    rank: int
    world_size: int
    epoch: int


def pipeline(dataset: Source | ImageList | TarShards | Subset[Any],
             transform: T.Transform | None, *, who: str = "Loader"
             ) -> tuple[object, list[Op]]:
    """The transform a Loader (``who``: another reader) over ``dataset`` runs
    (``transform``, else the dataset's own) and its engine ops.

    Raises
    ------
    ValueError
        There is none, and the dataset has images (tar shards may have none), or one for
        a :class:`Source` (it reads its own arrays).
    TypeError
        It is not built from :mod:`dask_ddp.data.transforms` (a torchvision transform).
    """
    if isinstance(dataset, Source):
        if transform is not None:
            raise ValueError(f"{who} over a {type(dataset).__name__} (a Source) takes no "
                             "transform: its read() makes the batch's arrays")
        return None, []
    shards = dataset if isinstance(dataset, TarShards) else None
    own = shards.transform if shards is not None else resolve_dataset(dataset)[0].transform
    chosen: object = own if transform is None else transform
    if chosen is None and (shards is None or shards.image_field is not None):
        raise ValueError(
            f"{who} needs a transform with a fixed output size, e.g. "
            "transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])"
        )
    return chosen, [] if chosen is None else T.to_ops(chosen)


def source_for(dataset: Source | ImageList | TarShards | Subset[Any], loader: Loader,
               stage: DeviceStage, *, max_side: int, scaled_decode: bool,
               region_decode: bool) -> Source:
    """The Source of ``loader``, a Loader over ``dataset`` (a :class:`Source` itself, or an
    image list or tar shards, read with the decode options), opened for it."""
    if isinstance(dataset, Source):
        return dataset.opened(loader, stage)
    options: dict[str, Any] = {k: getattr(loader, k) for k in (
        "batch_size", "shuffle", "seed", "drop_last", "num_threads")}
    # The engine also keeps the host batch whose copy may still run (DeviceStage.holds).
    options["prefetch"] = loader.prefetch + stage.holds
    options.update(skip_errors=loader.on_error == "skip", max_side=int(max_side),
                   scaled_decode=bool(scaled_decode), region_decode=bool(region_decode))
    kind = ShardSource if isinstance(dataset, TarShards) else ImageListSource
    return kind(dataset, options).opened(loader, stage)  # type: ignore[arg-type]


class Reader(DealReader, Protocol):
    """What reads a Source's samples batch by batch (``start_epoch(epoch, start)``: read
    ``epoch`` from its batch ``start`` on; ``close``): an engine loader, an
    :class:`IdReader` over :meth:`Source.read`, or a table's feeding thread
    (``data/table/loader.py``'s ``TableReader``)."""

    skipped: int

    def next(self) -> tuple[Any, ...] | None:
        """The next batch's item (its position in the epoch at 2), or None at the end."""


class Source:
    """One kind of data a :class:`~dask_ddp.data.Loader` reads: ``Loader(source, ...)``
    takes any instance (see the user guide's "Adding a data kind").

    A Source names its samples by integer ids. Each epoch it answers which ids a rank reads
    and in what order (:meth:`order`) and reads a batch of ids into arrays (:meth:`read`);
    the Loader does the rest (batches, position, ``state_dict``, the device stage) and live
    recovery deals the ids a lost rank had not read to the others (:meth:`deal_share`).
    The least to write: ``__len__`` (ids ``0 .. len - 1``, ordered as
    ``DistributedSampler`` does) and :meth:`read`. A kind read by the C++ engine (image
    lists, tar shards) overrides :meth:`reader` and :meth:`deal_reader` instead of
    :meth:`read`.

    A Loader opens its own copy (:meth:`opened`), so one Source serves several Loaders.

    Attributes
    ----------
    image_at
        The position of the image batch in a batch's tuple (the device stage's
        ``channels_last`` and image tail), None for none.
    loader
        The Loader it was opened for (its options: ``batch_size``, ``shuffle``, ``seed``,
        ``drop_last``, ``rank``, ``world_size``, ...).
    stage
        The Loader's device stage (``stage.reader(make)`` makes an engine loader with
        its buffers).
    core
        The reader of the Loader's own share (of its rank layout).
    deals
        The samples dealt to the Loader after its own share (live recovery).
    """

    image_at: int | None = 0
    loader: Loader
    stage: DeviceStage
    core: Reader
    deals: UnreadDeals[Reader]

    def opened(self, loader: Loader, stage: DeviceStage) -> Source:
        """A copy of this Source read by ``loader`` through ``stage``, its reader made."""
        own = copy.copy(self)
        own.loader, own.stage = loader, stage
        own.deals = UnreadDeals(own, loader.batch_size, loader.drop_last)
        own.core = own.reader(loader.rank, loader.world_size)
        return own

    def order(self, epoch: int, rank: int, world_size: int) -> Samples:
        """The ids rank ``rank`` of ``world_size`` reads in ``epoch``, in order, as
        ``DistributedSampler`` deals ``len(self)`` ids (shuffled by the Loader's seed and
        ``epoch``, the tail padded or dropped by its ``drop_last``)."""
        return rank_indices(len(self), epoch, rank, world_size,  # type: ignore[arg-type]
                            shuffle=bool(self.loader.shuffle), seed=self.loader.seed,
                            drop_last=self.loader.drop_last)

    def read(self, ids: Samples) -> tuple[Any, ...]:
        """One batch: the samples ``ids`` as a tuple of arrays or tensors, ``len(ids)``
        rows each (numpy arrays become tensors)."""
        raise NotImplementedError(f"{type(self).__name__} must define read(ids) (or reader)")

    def reader(self, rank: int, world_size: int) -> Reader:
        """The reader of rank ``rank`` of ``world_size``'s own share: its :meth:`order`
        read in batches by :meth:`read`."""
        return IdReader(self, lambda epoch: self.order(epoch, rank, world_size))

    def deal_reader(self, epoch: int, samples: Samples, rank: int, world_size: int
                    ) -> Reader:
        """The reader of rank ``rank`` of ``world_size``'s share of a deal of ``samples``
        of ``epoch`` (live recovery)."""
        share = self.deal_share(epoch, samples, rank, world_size)
        return IdReader(self, lambda _: share)

    def deal_share(self, epoch: int, samples: Samples, rank: int, world_size: int
                   ) -> Samples:
        """Rank ``rank`` of ``world_size``'s share of a deal, in its reading order: every
        ``world_size``-th sample from ``rank``, unshuffled (padded unless ``drop_last``)."""
        return [samples[i] for i in rank_indices(len(samples), epoch, rank, world_size,
                                                 shuffle=False,
                                                 drop_last=self.loader.drop_last)]

    def relayout(self, rank: int, world_size: int) -> None:
        """Read from now on as rank ``rank`` of ``world_size`` (a new reader; the old one
        is closed, its lent buffers freed)."""
        self.core.close()
        self.core = self.reader(rank, world_size)

    def new_epoch(self) -> None:
        """Another epoch was set: the deals of the one before end (their readers closed)."""
        self.deals.close()

    def close(self) -> None:
        """Close every reader (the own share's and the deals')."""
        self.core.close()
        self.deals.close()

    def num_samples(self, epoch: int) -> int:
        """The own share's samples in ``epoch`` (padding included)."""
        return len(self.order(epoch, self.loader.rank, self.loader.world_size))

    def num_batches(self, epoch: int) -> int:
        """The own share's batches in ``epoch``."""
        n, size = self.num_samples(epoch), self.loader.batch_size
        return n // size if self.loader.drop_last else -(-n // size)

    def batch(self, item: tuple[Any, ...]) -> tuple[Any, ...]:
        """The Loader's tuple for a reader's item (an :class:`IdReader`'s: ``read``'s)."""
        return tuple(item[0])

    def state(self) -> dict[str, Any]:
        """The state dict's entries of this kind of data (none)."""
        return {}

    def resume(self, state: Mapping[str, Any]) -> int:
        """The batch of the saved epoch to resume at.

        Raises
        ------
        ValueError
            ``state`` was saved with other options or world size, or its batch is past
            the epoch's.
        """
        epoch, loader = int(state["epoch"]), self.loader
        check_saved(state, {"seed": loader.seed, "shuffle": loader.shuffle,
                            "world_size": loader.world_size,
                            "num_batches": self.num_batches(epoch)})
        return check_batch(int(state["batch"]), self.num_batches(epoch))

    def lost(self, epoch: int, batch: int, ranks: list[int]) -> list[int]:
        """The ids of ``epoch`` that ``ranks`` had not yielded after ``batch`` batches
        each, each rank's in its reading order, in rank order."""
        return [int(i) for r in sorted(ranks) for i in self.order(
            epoch, r, self.loader.world_size)[batch * self.loader.batch_size:]]


def check_saved(state: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """Check that ``state`` was saved with a Loader's options ``mine`` (a key the state
    lacks passes): ``ValueError`` naming both values of one that differs."""
    for key, value in mine.items():
        if key in state and state[key] != value:
            raise ValueError(
                f"state_dict was saved with {key}={state[key]!r} but this loader has {value!r}")


def check_batch(batch: int, batches: int) -> int:
    """``batch``, a saved position in an epoch of ``batches`` batches (``ValueError``
    outside ``[0, batches]``)."""
    if not 0 <= batch <= batches:
        raise ValueError(f"state_dict batch {batch} is outside [0, {batches}]")
    return batch


class IdReader:
    """A :class:`Reader` in Python: each epoch's ids (``ids(epoch)``) in the Loader's
    batches, each read by the Source's :meth:`~Source.read`. Its item: ``(the batch's
    tuple, None, its position)``, the engine's position slot."""

    skipped = 0

    def __init__(self, source: Source, ids: Callable[[int], Samples]) -> None:
        self.source, self.ids = source, ids
        self._epoch: Samples = []
        self._at, self._stop, self._closed = 0, 0, False

    def start_epoch(self, epoch: int, start: int, /) -> None:
        loader = self.source.loader
        self._epoch, size = self.ids(epoch), loader.batch_size
        n = len(self._epoch)
        self._stop = n // size if loader.drop_last else -(-n // size)
        self._at = min(int(start), self._stop)

    def next(self) -> tuple[Any, ...] | None:
        if self._closed:
            raise ValueError("the loader is closed")
        at = self._at
        if at >= self._stop:
            return None
        self._at, size = at + 1, self.source.loader.batch_size
        fields = self.source.read(self._epoch[at * size:(at + 1) * size])
        return tuple(torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                     for x in fields), None, at

    def close(self) -> None:
        self._closed = True


class ImageListSource(Source):
    """The Source of an image list or a ``Subset`` of one: ids are positions in the list;
    the engine reads them (the own share in the engine's order, a deal's unshuffled)."""

    def __init__(self, dataset: ImageList | Subset[Any], options: dict[str, Any]) -> None:
        # The dataset's own store (its URL, credentials and options: endpoint, region, CA
        # bundle, retries), opened in this process.
        self.images, self.size, self.options = ImageSource.of(dataset), len(dataset), options

    def reader(self, rank: int, world_size: int) -> Any:
        return self.stage.reader(lambda ops: self.images.loader(
            ops, **self.options, rank=rank, world_size=world_size))

    def deal_reader(self, epoch: int, samples: Samples, rank: int, world_size: int) -> Any:
        return self.stage.reader(lambda ops: self.images.subset(samples).loader(
            ops, **{**self.options, "shuffle": False}, rank=rank, world_size=world_size))

    def order(self, epoch: int, rank: int, world_size: int) -> Samples:
        """The engine's order (its ``DistributedSampler``)."""
        return rank_indices(self.size, epoch, rank, world_size, shuffle=bool(
            self.loader.shuffle), seed=self.loader.seed, drop_last=self.loader.drop_last)

    def num_samples(self, epoch: int) -> int:
        return int(self.core.num_samples)  # type: ignore[attr-defined]

    def batch(self, item: tuple[Any, ...]) -> tuple[Any, ...]:
        """``(images, labels)``."""
        return item[:2]


class ShardSource(Source):
    """The Source of tar shards: the deals are sample ids, read in the shards' order; a
    state saved on another world size resumes with the samples no rank had yielded.

    Attributes
    ----------
    segments
        The restored epoch's (shard, begin, end) sample runs (None: every shard whole).
    """

    def __init__(self, shards: TarShards, options: dict[str, Any]) -> None:
        self.shards, self.options, self.image_at = shards, options, shards.image_field
        self.skip_errors = bool(options["skip_errors"])
        self.shuffle, self.seed = bool(options["shuffle"]), int(options["seed"])
        self.segments: Segments | None = None

    def reader(self, rank: int, world_size: int) -> Any:
        return self.stage.reader(lambda ops: self.shards.engine_loader(
            ops, **self.options, rank=rank, world_size=world_size))

    def deal_reader(self, epoch: int, samples: Samples, rank: int, world_size: int) -> Any:
        (core := self.reader(rank, world_size)).set_epoch_segments(epoch, self._runs(samples))
        return core

    def deal_share(self, epoch: int, samples: Samples, rank: int, world_size: int
                   ) -> Samples:
        return self._order(self._runs(samples), epoch, rank, world_size)

    def order(self, epoch: int, rank: int, world_size: int) -> Samples:
        """The sample ids of the epoch's runs (the restored ones, else every shard)."""
        return self._order(self.segments, epoch, rank, world_size)

    def _order(self, segments: Segments | None, epoch: int, rank: int, world_size: int
               ) -> list[int]:
        """The sample ids rank ``rank`` of ``world_size`` reads of ``epoch``'s runs
        ``segments`` (None: every shard whole), in its reading order (the engine's)."""
        return [int(i) for i in _core.shard_rank_order(
            self.shards.shard_counts(self.skip_errors), segments, epoch, rank, world_size,
            shuffle=self.shuffle, seed=self.seed, drop_last=self.loader.drop_last,
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

    def new_epoch(self) -> None:
        """Also forget the restored epoch's sample runs."""
        super().new_epoch()
        self.segments = None

    def num_samples(self, epoch: int) -> int:
        return int(self.core.epoch_samples(epoch))  # type: ignore[attr-defined]

    def batch(self, item: tuple[Any, ...]) -> tuple[Any, ...]:
        """The Loader's tuple: ``(images, labels)``, or the shards' fields in order (their
        tensors but the images in lent buffers: :meth:`DeviceStage.staged`)."""
        out = self.shards.batch_tuple(item)
        return out if self.shards.fields is None else tuple(
            self.stage.staged(x) if i != self.image_at and isinstance(x, torch.Tensor) else x
            for i, x in enumerate(out))

    def state(self) -> dict[str, Any]:
        return {"drop_last": self.loader.drop_last, "batch_size": self.loader.batch_size,
                "epoch_segments": self.segments}

    def resume(self, state: Mapping[str, Any]) -> int:
        """On the saved world size, the saved position; on another, batch 0 of the
        samples no rank had yielded, dealt over the Loader's world size."""
        loader, size = self.loader, self.loader.batch_size
        check_saved(state, {"seed": loader.seed, "shuffle": loader.shuffle,
                            "drop_last": loader.drop_last, "batch_size": size})
        epoch, batch, saved_on = int(state["epoch"]), int(state["batch"]), int(
            state["world_size"])
        segments = self._saved_runs(state)
        if saved_on != loader.world_size:
            segments = self.shards.unread_segments(
                epoch, min(batch * size, 1 << 62), world_size=saved_on,
                shuffle=self.shuffle, seed=self.seed, drop_last=loader.drop_last,
                epoch_segments=segments, skip_errors=self.skip_errors)
            logger.info("resuming epoch %d on %d ranks (saved on %d): %d samples left to "
                        "read", epoch, loader.world_size, saved_on,
                        sum(e - b for _, b, e in segments))
            batch = 0
        if segments is not None:
            self.core.set_epoch_segments(epoch, segments)  # type: ignore[attr-defined]
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
