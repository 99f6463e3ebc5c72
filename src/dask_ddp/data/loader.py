"""The fast path: batches decoded and transformed by C++ threads, handed over as tensors.

::

    from dask_ddp.data import ImageFolder, Loader, transforms as T

    ds = ImageFolder("s3://bucket/train")
    loader = Loader(ds, batch_size=64, transform=T.Compose([
        T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:   # [B, 3, 224, 224] float32, [B] int64
            ...

Sampling has ``torch.utils.data.DistributedSampler`` semantics (rank and world size from
the process group when not given). Batches arrive in order; a batch tensor is a view of an
engine buffer that is reused only after torch frees the tensor, so keeping one is safe.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Subset

from dask_ddp._dashboard.counters import rank_counters
from dask_ddp._pending import flush_pending
from dask_ddp.data import transforms as T
from dask_ddp.data.datasets import ImageList
from dask_ddp.data.device import DeviceStage, default_threads, stage_for
from dask_ddp.data.engine import ImageSource, resolve_dataset
from dask_ddp.data.process import check_made_here
from dask_ddp.data.shards import TarShards
from dask_ddp.data.unread import (
    Samples,
    UnreadDeals,
    lost_positions,
    shard_deal,
    shard_lost,
    shard_share,
)
from dask_ddp.data.world import rank_and_world

__all__ = ["Loader"]

logger = logging.getLogger(__name__)

_ON_ERROR = ("raise", "skip")


def _not_a_dataset(dataset: object) -> str | None:
    """Why ``dataset`` cannot be read by any Loader, with the fix (``None``: it may be).

    In-memory data (a pandas or numpy object, a list) would otherwise fail later with a
    message about the Loader's own arguments (``features``) instead of naming the data.
    """
    kind = type(dataset)
    module = (kind.__module__ or "").split(".")[0]
    if module == "pandas":
        return (f"Loader got a pandas {kind.__name__}, which it does not read: pass a Dask "
                "DataFrame to submit() instead (dask.dataframe.from_pandas(df, "
                "npartitions=...).persist()); the rank receives it as a "
                "dask_ddp.data.Table, which Loader(table, batch_size, features=..., "
                "label=...) reads")
    if module == "numpy" or isinstance(dataset, (list, tuple, dict)):
        return (f"Loader got a {kind.__module__}.{kind.__name__}" if module == "numpy"
                else f"Loader got a {kind.__name__}") + (
            ", which it does not read: for in-memory data use a torch DataLoader, or pass "
            "a Dask Array or DataFrame to submit() (it arrives as a dask_ddp.data.Table); "
            "for images, an ImageList (ImageList.from_csv, or keys and labels), an "
            "ImageFolder or TarShards")
    return None


class _InitSignature:
    """``inspect.signature(cls)`` reads ``cls.__init__``'s parameters: the generic
    ``__new__`` (which picks the subclass) would otherwise hide them."""

    def __get__(self, obj: object, owner: type) -> inspect.Signature:
        sig = inspect.signature(owner.__init__)  # type: ignore[misc]
        return sig.replace(parameters=list(sig.parameters.values())[1:])


def _is_dask_collection(dataset: object) -> bool:
    """A Dask collection, told by its module (nothing imported)."""
    module = type(dataset).__module__ or ""
    return module.startswith(("dask.", "dask_expr"))


#: The Loader of a Dask collection given to ``Loader`` (its module imports this one).
_COLLECTION_LOADER = "dask_ddp.data.table.pending:PendingTableLoader"


def _class_at(where: str) -> type[Loader]:
    """The Loader subclass at ``"module:Class"``, imported on first use."""
    module, _, name = where.partition(":")
    found: type[Loader] = getattr(importlib.import_module(module), name)
    return found


def _own_loader(dataset: object) -> type[Loader] | None:
    """The Loader subclass ``dataset``'s type names (``_dask_ddp_loader``), if any."""
    where = getattr(type(dataset), "_dask_ddp_loader", None)
    return _class_at(where) if isinstance(where, str) else None


def _state_segments(
    state: dict[str, Any], shards: TarShards, *, skip_errors: bool
) -> list[tuple[int, int, int]] | None:
    """The epoch's (shard, begin, end) runs saved in a state dict (None: every shard
    whole); a state saved with a list of whole shards (``epoch_shards``) reads as runs."""
    if state.get("epoch_segments") is not None:
        return [(int(s), int(b), int(e)) for s, b, e in state["epoch_segments"]]
    if state.get("epoch_shards") is not None:
        counts = shards.shard_counts(skip_errors)
        return [(int(s), 0, counts[int(s)]) for s in state["epoch_shards"]]
    return None



def _sample_list(samples: Any) -> list[int]:
    """Saved sample ids (a tensor, an array or a list) as a list of ints."""
    return [int(i) for i in (samples.tolist() if hasattr(samples, "tolist") else samples)]


class Loader:
    """Iterate over an image dataset in batches, with the work done in C++ threads.

    Given a :class:`~dask_ddp.data.Table` (a Dask DataFrame or Array, or Parquet),
    ``Loader(table, batch_size, *, shuffle=True | False | "local", seed=0, features=None,
    label=None, drop_last=False, rank=None, world_size=None, num_threads=None, prefetch=4,
    window=4, cache=None)`` returns a :class:`~dask_ddp.data.TableLoader`, the subclass
    of Loader for tables (see ``__new__``): batches as a dict of column tensors, or
    ``(x, y)`` with ``features``/``label``; the same ``len``, ``set_epoch``,
    ``state_dict`` and ``load_state_dict``; ``cache`` keeps the partitions read in the
    rank across epochs (default: when they fit ``dask-ddp.data.table-cache``); see the user
    guide's "Datasets: tables".

    Parameters
    ----------
    dataset
        A :class:`~dask_ddp.data.TarShards` (tar shards: see its order, padding and
        resume rules), an :class:`~dask_ddp.data.ImageList` (e.g. from a manifest),
        :class:`~dask_ddp.data.ImageFolder` or :class:`~dask_ddp.data.S3ImageFolder`, or
        a ``torch.utils.data.Subset`` of one (e.g. a train/eval split); its ``samples``
        are read through its store. Its own (torchvision) transform is not
        used: ``transform`` replaces it.
    batch_size
        Samples per batch.
    transform
        Built from :mod:`dask_ddp.data.transforms`; must end with a fixed size and contain
        ``ToTensor`` (float32) or ``PILToTensor`` (uint8). Default: the dataset's transform
        if it is one of these. A torchvision transform raises ``TypeError``.
    shuffle, seed
        Shuffle each epoch by (seed, epoch); each sample's random crop and flip depend
        only on (seed, epoch, index).
    rank, world_size
        This process's shard, ``DistributedSampler``-style. Default: from the initialised
        ``torch.distributed`` process group, else 0 and 1.
    drop_last
        Drop the uneven tail across ranks (else pad by repeating, as torch does) and the
        last incomplete batch.
    num_threads
        Decode threads. Default: this rank's share of the host, the usable cores
        (``os.sched_getaffinity``) divided by ``LOCAL_WORLD_SIZE`` (the ranks on this
        host), at least 1; outside a launched rank, every usable core.
    prefetch
        Batches in flight ahead of the consumer.
    on_error
        ``"raise"``: a bad image (corrupt, truncated, empty, not JPEG/PNG, over
        ``max_side``) raises an exception naming its URL. ``"skip"``: leave it out of its
        batch (which is then smaller) and count it in :attr:`skipped`; for an
        ``ImageList`` that is not an ``ImageFolder``, a key naming no object too (a
        stale manifest). Other storage errors (access denied, an unreachable server,
        and for an ``ImageFolder`` an object deleted after listing) raise either way.
    pin_memory
        Copy host batches to pinned memory (default: when CUDA is available and
        ``device`` is None). With ``device`` set the Loader pins its own buffers.
    device
        Hand the loop batches on this device (``"cuda"``: the rank's own GPU; ``"cpu"``;
        a ``torch.device``); ``None`` keeps host tensors. On a GPU the engine decodes into
        pinned buffers, the copy runs on a stream of its own and the loop's stream waits
        on an event, not the host; a pipeline ending in ``ToTensor`` (and ``Normalize``)
        sends uint8 over the bus and scales and normalises on the GPU. Labels and tensor
        fields move too. The default ``num_threads`` then leaves the training loop a core.
        See the user guide's "The device stage".
    channels_last
        Image batches in ``torch.channels_last`` memory format (with ``device``).
    scaled_decode
        Let libjpeg-turbo decode large JPEGs at 1/2, 1/4 or 1/8 scale when a crop is
        downscaled at least that much anyway.
    region_decode
        For crop-first pipelines (``RandomResizedCrop``, ``CenterCrop``), decode only the
        JPEG rows and columns the crop reads (pixels identical to a full decode).
    max_side
        Images with a longer side are bad input (guards memory).

    Raises
    ------
    TypeError
        For a torchvision (or other non-engine) transform, or an unsupported dataset.
    ValueError
        For inconsistent arguments.
    """

    __signature__ = _InitSignature()
    #: Called before each batch is taken: the top of a training step (live recovery
    #: re-forms a group there, after what the loop did since the optimizer's step; see
    #: ``dask_ddp.data.redeal``).
    before_batch: Callable[[], None] | None = None
    #: An engine loader of this dataset read as rank ``r`` of ``w`` (see :meth:`reshard`).
    _make_core: Callable[[int, int], Any] | None = None
    #: The (rank, world size) of a :meth:`reshard`, taken at the next epoch.
    _next_layout: tuple[int, int] | None = None
    #: The samples dealt to this rank after its own share (live recovery).
    _unread: UnreadDeals | None = None
    _stage: DeviceStage | None = None

    def __new__(cls, dataset: Any = None, *args: Any, **kwargs: Any) -> Loader:
        """A Loader of the subclass that reads ``dataset``, as ``pathlib.Path(...)``
        makes a ``PosixPath``: a :class:`~dask_ddp.data.TableLoader` for a
        :class:`~dask_ddp.data.Table`, else a Loader.

        One name to call for every dataset, one type to check (``isinstance(loader,
        Loader)``) and one protocol (``len``, ``set_epoch``, iteration, ``state_dict``,
        ``load_state_dict``, ``close``); the subclass takes the options and yields the
        batches of its kind of data. A dataset type names the subclass that reads it in
        its ``_dask_ddp_loader`` attribute (``"module:Class"``), imported here on first
        use: the subclass's module imports this one, never the reverse.
        """
        wrong = _not_a_dataset(dataset)
        if wrong is not None:
            raise TypeError(wrong)
        if _is_dask_collection(dataset):
            # A Dask collection: checked against its table here, built where it is used.
            pending = _class_at(_COLLECTION_LOADER)
            if issubclass(pending, cls):
                return super().__new__(pending)
        own = _own_loader(dataset)
        if own is None or issubclass(cls, own):
            return super().__new__(cls)
        if issubclass(own, cls):
            # An instance of cls: Python then runs own.__init__ with these arguments.
            return super().__new__(own)
        # A subclass of Loader of a user's given a table: the table's loader, made here
        # (Python runs no __init__ on an object that is not an instance of cls).
        return own(dataset, *args, **kwargs)

    def __init__(
        self,
        dataset: ImageList | TarShards | Subset[Any],
        batch_size: int,
        *,
        transform: T.Transform | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        num_threads: int | None = None,
        prefetch: int = 4,
        on_error: str = "raise",
        pin_memory: bool | None = None,
        scaled_decode: bool = True,
        region_decode: bool = True,
        max_side: int = 1 << 14,
        device: str | torch.device | None = None,
        channels_last: bool = False,
    ) -> None:
        shards = dataset if isinstance(dataset, TarShards) else None
        if shards is None:
            folder, _ = resolve_dataset(dataset)
        own = shards.transform if shards is not None else folder.transform
        chosen: object = own if transform is None else transform
        imageless = shards is not None and shards.image_field is None
        if chosen is None and not imageless:
            raise ValueError(
                "Loader needs a transform with a fixed output size, e.g. "
                "transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])"
            )
        ops = [] if chosen is None else T.to_ops(chosen)
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
        self._init_reading(batch_size, shuffle=bool(shuffle), seed=seed, rank=rank,
                           world_size=world_size, drop_last=drop_last,
                           num_threads=num_threads, prefetch=prefetch,
                           stage=stage_for(device, channels_last, pin_memory))
        if self._stage is not None:
            ops = self._stage.engine_ops(ops)  # on a GPU: uint8 over the bus, floats there
        self.dataset = dataset
        self.transform = chosen
        self.on_error = on_error
        self.pin_memory = (torch.cuda.is_available() and self._stage is None
                           if pin_memory is None else bool(pin_memory))
        self._start_batch = 0
        self._shards = shards
        # The restored epoch's (shard, begin, end) sample runs, when not every shard whole.
        self._epoch_segments: list[tuple[int, int, int]] | None = None
        # Samples a lost rank left unread, read after this rank's own (live recovery).
        self._unread: UnreadDeals | None = None
        engine_options: dict[str, Any] = {
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            "num_threads": self.num_threads,
            "prefetch": self.prefetch,
            "skip_errors": on_error == "skip",
            "max_side": int(max_side),
            "scaled_decode": bool(scaled_decode),
            "region_decode": bool(region_decode),
        }
        if shards is not None:
            def shard_engine(r: int, w: int) -> Any:
                return self._lend(shards.engine_loader(
                    ops, **{**engine_options, "rank": r, "world_size": w}))

            self._core = shard_engine(self.rank, self.world_size)
            self._make_core = shard_engine
            self._unread = UnreadDeals(lambda epoch, ids, r, w: shard_deal(
                shards, epoch, ids, shard_engine(r, w), engine_options["skip_errors"]),
                self.batch_size, self.drop_last,
                share_order=lambda epoch, ids, r, w: shard_share(
                    shards, epoch, ids, r, w, shuffle=bool(self.shuffle), seed=self.seed,
                    drop_last=self.drop_last, skip_errors=engine_options["skip_errors"]))
            return
        # The dataset's own store (its URL, credentials and options: endpoint, region,
        # CA bundle, retries), opened in this process.
        source = ImageSource.of(dataset)

        def image_engine(r: int, w: int) -> Any:
            return self._lend(source.loader(
                ops, **{**engine_options, "rank": r, "world_size": w}))

        self._core = image_engine(self.rank, self.world_size)
        self._make_core = image_engine
        self._unread = UnreadDeals(lambda _, pos, r, w: self._lend(source.subset(pos).loader(
            ops, **{**engine_options, "shuffle": False, "rank": r, "world_size": w})),
            self.batch_size, self.drop_last)

    def _lend(self, core: Any) -> Any:
        """``core`` with page-locked buffers lent to it when batches go to a GPU (at most
        ``prefetch + 2``, within the host's budget): the engine decodes into them and the
        copy to the GPU needs no staging."""
        return core if self._stage is None else self._stage.lend(core, self.prefetch + 2)

    def _init_reading(self, batch_size: int, *, shuffle: bool | str, seed: int,
                      rank: int | None, world_size: int | None, drop_last: bool,
                      num_threads: int | None, prefetch: int,
                      stage: DeviceStage | None) -> None:
        """The options and position every Loader has (images, tar shards, tables)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        rank, world_size = rank_and_world(rank, world_size)
        self._stage = stage
        self.batch_size = int(batch_size)
        self.shuffle = shuffle  # bool for images; a TableLoader's may also be "local"
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self.num_threads = int(num_threads or default_threads(stage))
        self.prefetch = int(prefetch)
        self.epoch = 0
        self._position = 0  # batches handed out in the current epoch (of a deal: of it)
        self._made_in = os.getpid()  # a fork()ed child reads none of its parent's Loaders

    def __len__(self) -> int:
        """Batches per epoch for this rank (for tar shards: in the current epoch)."""
        if self._shards is not None:
            n = int(self._core.epoch_samples(self.epoch))
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return int(self._core.num_batches)

    @property
    def num_samples(self) -> int:
        """Samples per epoch for this rank (padding included)."""
        if self._shards is not None:
            return int(self._core.epoch_samples(self.epoch))
        return int(self._core.num_samples)

    @property
    def skipped(self) -> int:
        """Samples left out so far because they failed (``on_error="skip"``)."""
        return int(self._core.skipped)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's shuffle and augmentation (as ``DistributedSampler.set_epoch``).

        After :meth:`load_state_dict`, setting the restored epoch keeps the restored
        position (so a training loop calling ``set_epoch`` every epoch resumes mid-epoch).
        """
        check_made_here(self._made_in)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if int(epoch) != self.epoch:
            self._start_batch = 0
            self._epoch_segments = None
            if self._next_layout is not None and self._make_core is not None:
                self.rank, self.world_size = self._next_layout
                self._next_layout = None
                self._core.close()
                self._core = self._make_core(self.rank, self.world_size)
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """Batches of ``(images, labels)``; for a :class:`TarShards` with ``fields``, a
        tuple in the order of its fields."""
        check_made_here(self._made_in)
        start, self._start_batch = self._start_batch, 0
        core = self._core
        core.start_epoch(self.epoch, start)
        self._position = start
        # The job page's step rate and data wait (a no-op outside a launched rank).
        counters, clock = rank_counters(), time.perf_counter_ns
        while True:
            if self.before_batch is not None:
                self.before_batch()
            t0 = clock()
            item: Any = core.next()  # releases the GIL while it waits
            if item is None:
                core = self._unread.next_core(self.epoch) if self._unread is not None else None
                if core is None:
                    if self._stage is not None:
                        self._stage.drop()  # the epoch's host buffers back to the engine
                    flush_pending()  # the epoch's metrics reported as CUDA values
                    return
                self._position = 0  # of this deal (epoch_progress counts the ones before)
                continue
            if counters is not None:
                counters.add_batch(clock() - t0)
            self._position = int(item[2]) + 1
            batch = item[:2] if self._shards is None else self._shards.batch_tuple(item)
            if self._stage is not None:
                batch = self._stage.move(batch, self._image_at)
            elif self.pin_memory:
                batch = tuple(x.pin_memory() if isinstance(x, torch.Tensor) else x for x in batch)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position in the epoch: resuming from it yields the remaining batches,
        identical to those an uninterrupted run would have yielded. In an epoch that had
        samples dealt to this rank (live recovery), ``"unread"`` also lists the samples it
        had not yielded (see :meth:`resume_unread`)."""
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "batch": self._position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
            "num_batches": len(self),
        }
        if self._shards is not None:
            state["drop_last"] = self.drop_last
            state["batch_size"] = self.batch_size
            state["epoch_segments"] = self._epoch_segments
        return self._with_unread(state)

    def _with_unread(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with ``"unread"`` in an epoch that had samples dealt to this rank."""
        if self._unread is not None and self._unread.dealt_in(self.epoch):
            state["unread"] = torch.as_tensor(
                [int(i) for i in self.unread_samples()], dtype=torch.int64)
        return state

    def _took_unread(self, state: dict[str, Any]) -> bool:
        """Load a state with ``"unread"`` (:meth:`resume_unread` as rank 0 of 1); whether
        it had them."""
        if state.get("unread") is None:
            return False
        self.resume_unread(int(state["epoch"]), state["unread"], 0, 1)
        return True

    def unread_samples(self) -> Samples:
        """This rank's samples of the current epoch not yet yielded: the rest of its own
        shard, then of the samples dealt to it (live recovery), in reading order."""
        progress = self.epoch_progress
        out = list(self.lost_samples(self.epoch, min(progress, len(self)), [self.rank],
                                     uids=[]))
        if self._unread is not None:
            out += self._unread.own_unread(self.epoch, max(progress - len(self), 0))
        return out

    def resume_unread(self, epoch: int, samples: Samples, rank: int, world_size: int) -> None:
        """Continue ``epoch`` with ``samples`` dealt as rank ``rank`` of ``world_size``,
        reading none of this rank's own shard of it: a resume of a state saved after a
        membership change (every saved rank's ``"unread"``, from :meth:`state_dict`,
        together; :func:`~dask_ddp.restore_training_state` does it)."""
        state = {k: v for k, v in self.state_dict().items() if k != "unread"}
        self.load_state_dict({**state, "epoch": int(epoch), "batch": len(self)})
        self.deal_unread(int(epoch), _sample_list(samples), rank, world_size)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position on the next iteration.

        For tar shards, a state saved on another world size continues the epoch with the
        samples no rank had yielded (see :class:`~dask_ddp.data.TarShards`). A state with
        ``"unread"`` continues with those samples (:meth:`resume_unread`).
        """
        if self._took_unread(state):
            return
        if self._shards is not None:
            self._load_shards_state(state)
            return
        own = self.state_dict()
        for key in ("seed", "shuffle", "world_size", "num_batches"):
            mine = own[key]
            if key in state and state[key] != mine:
                raise ValueError(
                    f"state_dict was saved with {key}={state[key]!r} but this loader has {mine!r}"
                )
        batch = int(state["batch"])
        if not 0 <= batch <= len(self):
            raise ValueError(f"state_dict batch {batch} is outside [0, {len(self)}]")
        self.epoch = int(state["epoch"])
        self._start_batch = batch
        self._position = batch

    def _load_shards_state(self, state: dict[str, Any]) -> None:
        assert self._shards is not None
        for key in ("seed", "shuffle", "drop_last", "batch_size"):
            mine = getattr(self, key)
            if key in state and state[key] != mine:
                raise ValueError(
                    f"state_dict was saved with {key}={state[key]!r} but this loader has {mine!r}"
                )
        epoch, batch = int(state["epoch"]), int(state["batch"])
        subset = _state_segments(state, self._shards, skip_errors=self.on_error == "skip")
        if int(state["world_size"]) != self.world_size:
            position = min(batch * self.batch_size, 1 << 62)
            subset = self._shards.unread_segments(
                epoch,
                position,
                world_size=int(state["world_size"]),
                shuffle=bool(self.shuffle),
                seed=self.seed,
                drop_last=self.drop_last,
                epoch_segments=subset,
                skip_errors=self.on_error == "skip",
            )
            logger.info(
                "resuming epoch %d on %d ranks (saved on %d): %d samples left to read",
                epoch,
                self.world_size,
                state["world_size"],
                sum(e - b for _, b, e in subset),
            )
            batch = 0
        if subset is not None:
            self._core.set_epoch_segments(epoch, subset)
        self.epoch = epoch
        self._epoch_segments = subset
        if not 0 <= batch <= len(self):
            raise ValueError(f"state_dict batch {batch} is outside [0, {len(self)}]")
        self._start_batch = batch
        self._position = batch

    @property
    def reading_unread(self) -> bool:
        """Whether this epoch's own shard is done and dealt samples are being read."""
        return self._unread is not None and self._unread.reading == self.epoch

    @property
    def epoch_progress(self) -> int:
        """Batches of the current epoch yielded so far: its own shard's, then those of
        the samples dealt to it (live recovery), counted on."""
        unread = self._unread
        if unread is None or unread.reading != self.epoch:
            return self._position
        return len(self) + unread.batches_before_current() + self._position

    def lost_samples(self, epoch: int, batch: int, ranks: list[int],
                     uids: list[Any] | None = None) -> Samples:
        """The samples of ``epoch`` that ``ranks`` (of this loader's world) had not yielded
        after ``batch`` batches each (:attr:`epoch_progress`'s count): positions in the
        sample list (image lists) or sample ids (tar shards), for :meth:`deal_unread`;
        with the shares of samples dealt earlier in the epoch to the members ``uids``
        (their ids in :meth:`deal_unread`'s ``members``; default ``ranks``)."""
        if self._shards is not None:
            out = shard_lost(self._shards, epoch, batch * self.batch_size, ranks,
                             self.world_size, shuffle=bool(self.shuffle), seed=self.seed,
                             drop_last=self.drop_last, segments=self._epoch_segments,
                             skip_errors=self.on_error == "skip")
        else:
            out = lost_positions(self, epoch, batch, ranks)
        if self._unread is not None:
            out += self._unread.lost_share(epoch, max(batch - len(self), 0),
                                           ranks if uids is None else uids)
        return out

    def deal_unread(self, epoch: int, positions: Samples, rank: int, world_size: int,
                    members: list[Any] | None = None) -> None:
        """Read these samples (from :meth:`lost_samples`) of ``epoch`` after this rank's
        own shard, dealt as rank ``rank`` of ``world_size``: a lost rank's unread samples
        (see ``dask_ddp.data.unread``, internal). ``members``: each member's id, in the
        deal's rank order (so a member lost later has its share dealt again)."""
        if self._unread is None:
            raise NotImplementedError(f"{type(self).__name__} cannot deal a lost rank's "
                                      "samples")
        self._unread.add(epoch, positions, rank, world_size, members)

    def reshard(self, rank: int, world_size: int) -> None:
        """Read the epochs after the current one as rank ``rank`` of ``world_size``, from
        the next :meth:`set_epoch` to another epoch on (live recovery: the group's
        members changed)."""
        if not self._can_reshard():
            raise NotImplementedError(f"{type(self).__name__} cannot change its ranks")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self._next_layout = (int(rank), int(world_size))

    @property
    def layout_pending(self) -> bool:
        """Whether a :meth:`reshard` waits for the next epoch to take effect."""
        return self._next_layout is not None

    def _can_reshard(self) -> bool:
        return self._make_core is not None

    def end_reads(self) -> None:
        """Read nothing more of what this rank had left of the current epoch (its own
        shard and the samples dealt to it so far), also while a loop iterates it: the loop
        goes on with the samples :meth:`deal_unread` deals after this call (live
        recovery: a rank that joins mid-epoch has the epoch's unread samples, named by
        :meth:`lost_samples`, dealt again over the bigger group)."""
        self._stop_reads()
        if self._stage is not None:
            self._stage.drop()
        if self.reading_unread:
            assert self._unread is not None
            self._stop_deal(self._unread.cut(self.epoch, self._position))
            return
        self._end_own()
        self._position = len(self)
        if self._unread is not None:
            self._unread.cut(self.epoch, 0)

    def _stop_reads(self) -> None:
        """What :meth:`end_reads` does first (a TableLoader stops its feeding thread)."""

    def _stop_deal(self, cut: tuple[Any, int] | None) -> None:
        """Stop the deal being read after its batches read so far (from
        :meth:`UnreadDeals.cut`)."""
        if cut is not None:
            core, batches = cut
            core.start_epoch(self.epoch, batches)

    def _end_own(self) -> None:
        """Stop reading the own share of the current epoch."""
        self._core.start_epoch(self.epoch, len(self))

    def close(self) -> None:
        """Stop the engine's threads (batches already handed out stay valid).

        Safe from any thread, also while another thread waits for a batch (that
        iteration then raises ``ValueError``: the loader is closed); closing twice is
        harmless.
        """
        self._core.close()
        if self._stage is not None:
            self._stage.drop()

    @property
    def device(self) -> torch.device | None:
        """The device batches are handed over on (``None``: host tensors)."""
        return None if self._stage is None else self._stage.device

    @property
    def channels_last(self) -> bool:
        """Whether image batches come in ``torch.channels_last`` memory format."""
        return self._stage is not None and self._stage.channels_last

    @property
    def _image_at(self) -> int | None:
        """The position of the image batch in a yielded tuple (None: no images)."""
        return 0 if self._shards is None else self._shards.image_field

    def __repr__(self) -> str:
        return (
            f"Loader({self.dataset!r}, batch_size={self.batch_size}, rank={self.rank}/"
            f"{self.world_size}, num_threads={self.num_threads}, prefetch={self.prefetch})"
        )
