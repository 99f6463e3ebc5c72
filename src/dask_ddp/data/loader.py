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

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Subset

from dask_ddp._dashboard.counters import rank_counters
from dask_ddp._identity import process_group
from dask_ddp._pending import flush_pending
from dask_ddp.data import transforms as T
from dask_ddp.data.datasets import ImageList
from dask_ddp.data.device import default_threads, stage_for
from dask_ddp.data.loader_type import InitSignature, maker_of
from dask_ddp.data.shards import TarShards
from dask_ddp.data.sources import pipeline, source_for
from dask_ddp.data.unread import Samples, UnreadDeals

__all__ = ["Loader", "check_made_here", "rank_and_world"]

_ON_ERROR = ("raise", "skip")


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from the initialised ``torch.distributed``
    process group, else ``(0, 1)``; ``DistributedSampler``'s arguments.

    Raises
    ------
    ValueError
        When only one of them is given outside a process group, or the rank is out of range.
    """
    group = process_group()
    if rank is None or world_size is None:
        if group is not None:
            rank = group[0] if rank is None else rank
            world_size = group[1] if world_size is None else world_size
        elif rank is None and world_size is None:
            rank, world_size = 0, 1
        else:
            raise ValueError(
                "give both rank and world_size, or neither (then they come from the "
                f"torch.distributed process group); got rank={rank}, world_size={world_size}"
            )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    return int(rank), int(world_size)


def check_made_here(made_in: int, what: str = "this Loader") -> None:
    """Raise unless the calling process is ``made_in`` (the pid of ``what``'s maker).

    ``fork()`` copies a process's memory but only the thread that called it: in the child,
    a Loader made by the parent has no engine threads, and its locks and connections are
    the parent's. The engine frees nothing of such a Loader in the child (so a DataLoader
    worker whose garbage collector meets one does not crash); reading it there raises.

    Raises
    ------
    RuntimeError
        In another process (a ``fork()`` child), saying to build a new Loader there.
    """
    here = os.getpid()
    if here != made_in:
        raise RuntimeError(
            f"{what} was made in process {made_in} and is used in process {here}, a "
            "fork() of it (its engine threads, locks and connections stayed in the "
            "parent); build a new Loader in this process (e.g. in the DataLoader worker "
            "or Pool task that reads it)")


class _ByKind(type):
    """``Loader(dataset, ...)``: made by the maker of ``dataset``'s kind when it has
    options of its own (``data/loader_type.py``: a :class:`~dask_ddp.data.TableLoader`
    for a :class:`~dask_ddp.data.Table`), else by the Loader's ``__init__``."""

    def __call__(cls, dataset: Any = None, *args: Any, **kwargs: Any) -> Any:
        maker = maker_of(dataset)
        if maker is not None:
            return maker(dataset, *args, **kwargs)
        return super().__call__(dataset, *args, **kwargs)


class Loader(metaclass=_ByKind):
    """Iterate over an image dataset in batches, with the work done in C++ threads.

    ``Loader(table, ...)`` over a :class:`~dask_ddp.data.Table` is made by
    :class:`~dask_ddp.data.TableLoader`, with options and batches of its own (a Loader
    over the table's Source).

    Parameters
    ----------
    dataset
        A :class:`~dask_ddp.data.TarShards` (see its order, padding and resume rules), an
        :class:`~dask_ddp.data.ImageList` (e.g. from a manifest), an
        :class:`~dask_ddp.data.ImageFolder` or :class:`~dask_ddp.data.S3ImageFolder`, or
        a ``torch.utils.data.Subset`` of one (e.g. a train/eval split), read through its
        store; ``transform`` replaces its own (torchvision) transform. Or any
        :class:`~dask_ddp.data.Source` (a data kind of its own: no ``transform``).
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
        Decode threads. Default: this rank's share of the host's usable cores (see the
        user guide's "Launching a job"); outside a launched rank, every usable core.
    prefetch
        Batches decoded ahead of the consumer. With a CUDA ``device`` the engine also
        keeps the host batch whose copy may still run (one more buffer), so ``prefetch``
        are decoded ahead there too.
    on_error
        ``"raise"``: a bad image raises an exception naming its URL. ``"skip"``: leave it
        out of its batch and count it in :attr:`skipped` (see the user guide's "Datasets"
        for what is a bad image; other storage errors raise either way).
    pin_memory
        Copy host batches to pinned memory (default: when CUDA is available and
        ``device`` is None). With ``device`` set the Loader pins its own buffers.
    device
        Hand the loop batches on this device (``"cuda"``: the rank's own GPU; ``"cpu"``;
        a ``torch.device``), labels and tensor fields too; ``None`` keeps host tensors.
        See the user guide's "On the GPU: the device stage".
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

    __signature__ = InitSignature()
    #: Called before each batch is taken: a training step's top (live recovery's step
    #: boundary, ``_launch/rank/live/attach.py``).
    before_batch: Callable[[], None] | None = None

    def __init__(self, dataset: ImageList | TarShards | Subset[Any], batch_size: int, *,
                 transform: T.Transform | None = None, shuffle: bool = True, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False, num_threads: int | None = None, prefetch: int = 4,
                 on_error: str = "raise", pin_memory: bool | None = None,
                 scaled_decode: bool = True, region_decode: bool = True,
                 max_side: int = 1 << 14, device: str | torch.device | None = None,
                 channels_last: bool = False) -> None:
        chosen, ops = pipeline(dataset, transform)
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
        for name, value in (("batch_size", batch_size), ("prefetch", prefetch),
                            ("num_threads", 1 if num_threads is None else num_threads)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        rank, world_size = rank_and_world(rank, world_size)
        stage = self._stage = stage_for(device, channels_last, pin_memory, ops=ops,
                                        buffers=prefetch + 2)
        self.batch_size, self.seed, self.drop_last = int(batch_size), int(seed), bool(drop_last)
        self.shuffle: bool | str = bool(shuffle)  # a table's may be "local" (TableLoader)
        self.rank, self.world_size = int(rank), int(world_size)
        self.num_threads, self.prefetch = int(num_threads or default_threads(stage)), int(prefetch)
        self.epoch = 0
        self._position = 0  # batches handed out in the current epoch (of a deal: of it)
        self._start_batch = 0  # the batch the next iteration starts at
        self._made_in = os.getpid()  # a fork()ed child reads none of its parent's Loaders
        #: The (rank, world size) of a :meth:`reshard`, taken at the next epoch.
        self._next_layout: tuple[int, int] | None = None
        self.dataset, self.transform, self.on_error = dataset, chosen, on_error
        self.pin_memory = stage.device is None and (torch.cuda.is_available()
                                                    if pin_memory is None else bool(pin_memory))
        # What the dataset's kind decides: its readers (the own share's, the deals'), counts
        # and resume.
        self._source = source_for(dataset, self, stage, max_side=int(max_side),
                                  scaled_decode=scaled_decode, region_decode=region_decode)
        self._deals: UnreadDeals[Any] = self._source.deals
        self._epoch_set = False  # set_epoch called (the loop counts epochs)
        #: The engine loader already running an epoch from its first batch, and which
        #: (:meth:`_start_early`); anything else that starts its epochs clears it.
        self._early: tuple[Any, int] | None = None

    @classmethod
    def opened_later(cls, opens: Any, keep_alive: Any = None) -> Loader:
        """A Loader that ``opens.open(loader)`` makes on first use, in the process that
        uses it (a table's made on the client over a Dask collection: see
        ``data/table/pending.py``); it pickles as ``opens``. ``keep_alive``: what
        :func:`dask_ddp.submit` keeps alive while the job runs (the collection)."""
        loader = cls.__new__(cls)
        loader.__dict__.update(_opens=opens, _opening=threading.RLock(),
                               _dask_ddp_keep_alive=keep_alive)
        return loader

    if not TYPE_CHECKING:  # the Loader's attributes stay typed
        def __getattr__(self, name: str) -> Any:
            # Only for an attribute not set: a Loader opened later opens at the first, once
            # whichever threads read (the others wait; the opening thread's reads raise).
            if (opening := self.__dict__.get("_opening")) and not name.startswith("__"):
                with opening:
                    if "_source" not in self.__dict__ and (
                            opens := self.__dict__.pop("_opens", None)) is not None:
                        try:
                            opens.open(self)
                        finally:
                            self.__dict__["_opens"] = opens
            return object.__getattribute__(self, name)

    def __reduce_ex__(self, protocol: Any) -> Any:
        opens = self.__dict__.get("_opens")
        if opens is None:
            return super().__reduce_ex__(protocol)
        return (type(self).opened_later, (opens,))

    def __len__(self) -> int:
        """Batches per epoch for this rank (for tar shards: in the current epoch)."""
        return self._source.num_batches(self.epoch)

    @property
    def num_samples(self) -> int:
        """Samples per epoch for this rank (padding included)."""
        return self._source.num_samples(self.epoch)

    @property
    def skipped(self) -> int:
        """Samples left out so far because they failed (``on_error="skip"``)."""
        return int(self._source.core.skipped)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's shuffle and augmentation (as ``DistributedSampler.set_epoch``).

        After :meth:`load_state_dict`, setting the restored epoch keeps the restored
        position (so a training loop calling ``set_epoch`` every epoch resumes mid-epoch).
        """
        check_made_here(self._made_in)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._epoch_set = True
        if int(epoch) != self.epoch:
            self._start_batch = 0
            self._source.new_epoch()
            if (layout := self._pop_layout()) is not None:
                self.rank, self.world_size = layout
                self._source.relayout(*layout)
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """Batches of ``(images, labels)``; for a :class:`TarShards` with ``fields``, a
        tuple in the order of its fields; for a table, as
        :class:`~dask_ddp.data.TableLoader` says."""
        check_made_here(self._made_in)
        start, self._start_batch = self._start_batch, 0
        core, (early, self._early) = self._source.core, (self._early, None)
        if early is None or early[0] is not core or early[1] != self.epoch or start != 0:
            core.start_epoch(self.epoch, start)
        self._position = start
        try:
            with self._stage.over(self._host_batches(), self._source.image_at) as batches:
                yield from batches  # the epoch's host buffers go back to the engine at the end
        except GeneratorExit:  # left early: a break, a raise in the loop, the iterator dropped
            self._stop_reads()
            raise
        self._start_early()
        flush_pending()  # the epoch's metrics reported as CUDA values

    def _stop_reads(self) -> None:
        """End the reads of an iteration left early: the own reader drops what it read ahead
        (an engine's batches; a table's pass: its feeding thread ends, its buffers go) and
        reads nothing until the next iteration starts it; a deal being read is closed."""
        with contextlib.suppress(ValueError):  # closed meanwhile (close() from any thread)
            self._source.core.start_epoch(self.epoch, len(self))
        self._deals.stop_current()

    def _cancel_early(self) -> None:
        """Stop the early start of :meth:`_start_early`, dropping what it decoded (a
        benchmark that times one epoch's own work at a time)."""
        if self._early is not None:
            core, epoch = self._early
            self._early = None
            core.start_epoch(epoch, self._source.num_batches(epoch))

    def _start_early(self) -> None:
        """At an epoch's end, start decoding the epoch the loop most likely reads next,
        while it evaluates, saves or reports: the next one where the loop calls
        :meth:`set_epoch`, else the same one again. The engine decodes at most
        ``prefetch`` batches of it ahead; a wrong guess costs only those (the next
        ``start_epoch`` cancels them). Not where a reshard waits for the next epoch (its
        engine loader is replaced)."""
        if self._next_layout is not None:
            return
        guess = self.epoch + 1 if self._epoch_set else self.epoch
        core = self._source.core
        core.start_epoch(guess, 0)
        self._early = (core, guess)

    def _host_batches(self) -> Iterator[tuple[Any, ...]]:
        """The epoch's host batches: the own share's, then each deal's (live recovery)."""
        core: Any = self._source.core  # an engine loader, a table's, or an IdReader
        # The job page's step rate and data wait (a no-op outside a launched rank).
        counters, clock = rank_counters(), time.perf_counter_ns
        while True:
            if self.before_batch is not None:
                self.before_batch()
            t0 = clock()
            item: Any = core.next()  # releases the GIL while it waits
            if item is None:
                core = self._deals.next_core(self.epoch)
                if core is None:
                    return
                self._position = 0  # of this deal (epoch_progress counts the ones before)
                continue
            if counters is not None:
                counters.add_batch(clock() - t0)
            self._position = int(item[2]) + 1
            yield self._source.batch(item)
            # Hold no engine buffer while the engine is asked for the next batch: a buffer
            # still referenced counts against prefetch (on a GPU the loop holds device
            # tensors, and this would be the only reference left).
            item = None

    def state_dict(self) -> dict[str, Any]:
        """The position in the epoch: resuming from it yields the remaining batches,
        identical to those an uninterrupted run would have yielded. In an epoch that had
        samples dealt to this rank (live recovery), ``"unread"`` also lists the samples it
        had not yielded (see :meth:`resume_unread`)."""
        return {"epoch": self.epoch, "batch": self._position, "seed": self.seed,
                "shuffle": self.shuffle, "world_size": self.world_size,
                "num_batches": len(self), **self._source.state(), **self._unread_entry()}

    def _unread_entry(self) -> dict[str, Any]:
        """The state dict's ``"unread"`` entry (:meth:`unread_samples`) in an epoch that
        had samples dealt to this rank, else nothing."""
        if not self._deals.dealt_in(self.epoch):
            return {}
        return {"unread": torch.as_tensor([int(i) for i in self.unread_samples()],
                                          dtype=torch.int64)}

    def unread_samples(self) -> Samples:
        """This rank's samples of the current epoch not yet yielded: the rest of its own
        shard, then of the samples dealt to it (live recovery), in reading order."""
        progress, own = self.epoch_progress, len(self)
        out = list(self.lost_samples(self.epoch, min(progress, own), [self.rank], uids=[]))
        return out + self._deals.own_unread(self.epoch, max(progress - own, 0))

    def resume_unread(self, epoch: int, samples: Samples, rank: int, world_size: int) -> None:
        """Continue ``epoch`` with ``samples`` dealt as rank ``rank`` of ``world_size``,
        reading none of this rank's own shard of it: a resume of a state saved after a
        membership change (every saved rank's ``"unread"``, from :meth:`state_dict`,
        together; :func:`~dask_ddp.restore_training_state` does it)."""
        state = {k: v for k, v in self.state_dict().items() if k != "unread"}
        self.load_state_dict({**state, "epoch": int(epoch), "batch": len(self)})
        ids = torch.as_tensor(samples, dtype=torch.int64).tolist()
        self.deal_unread(int(epoch), ids, rank, world_size)

    def _took_unread(self, state: dict[str, Any]) -> bool:
        """Load a state with ``"unread"`` (as rank 0 of 1); whether it had them."""
        if state.get("unread") is None:
            return False
        self.resume_unread(int(state["epoch"]), state["unread"], 0, 1)
        return True

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position on the next iteration.

        For tar shards, a state saved on another world size continues the epoch with the
        samples no rank had yielded (see :class:`~dask_ddp.data.TarShards`). A state with
        ``"unread"`` continues with those samples (:meth:`resume_unread`).
        """
        self._early = None  # a resume may set the epoch's sample runs before it starts
        if self._took_unread(state):
            return
        batch = self._source.resume(state)
        self.epoch, self._start_batch, self._position = int(state["epoch"]), batch, batch

    @property
    def reading_unread(self) -> bool:
        """Whether this epoch's own shard is done and dealt samples are being read."""
        return self._deals.reading == self.epoch

    @property
    def epoch_progress(self) -> int:
        """Batches of the current epoch yielded so far: its own shard's, then those of
        the samples dealt to it (live recovery), counted on."""
        if not self.reading_unread:
            return self._position
        return len(self) + self._deals.batches_before_current() + self._position

    def lost_samples(self, epoch: int, batch: int, ranks: list[int],
                     uids: list[Any] | None = None) -> Samples:
        """The samples of ``epoch`` that ``ranks`` (of this loader's world) had not yielded
        after ``batch`` batches each (:attr:`epoch_progress`'s count): positions in the
        sample list (image lists) or sample ids (tar shards), for :meth:`deal_unread`;
        with the shares of samples dealt earlier in the epoch to the members ``uids``
        (their ids in :meth:`deal_unread`'s ``members``; default ``ranks``)."""
        return self._source.lost(epoch, batch, ranks) + self._dealt_lost(
            epoch, batch, ranks if uids is None else uids)

    def _dealt_lost(self, epoch: int, batch: int, members: list[Any]) -> list[int]:
        """The dealt samples of ``epoch`` that ``members`` had not read after ``batch``
        batches of the epoch (the own share's first)."""
        return self._deals.lost_share(epoch, max(batch - len(self), 0), members)

    def deal_unread(self, epoch: int, positions: Samples, rank: int, world_size: int,
                    members: list[Any] | None = None) -> None:
        """Read these samples (from :meth:`lost_samples`) of ``epoch`` after this rank's
        own shard, dealt as rank ``rank`` of ``world_size``: a lost rank's unread samples
        (see ``dask_ddp.data.unread``, internal). ``members``: each member's id, in the
        deal's rank order (so a member lost later has its share dealt again)."""
        self._deals.add(epoch, positions, rank, world_size, members)

    def reshard(self, rank: int, world_size: int) -> None:
        """Read the epochs after the current one as rank ``rank`` of ``world_size``, from
        the next :meth:`set_epoch` to another epoch on (live recovery: the group's
        members changed).

        Raises
        ------
        ValueError
            ``rank`` is not in ``[0, world_size)``.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self._next_layout = (int(rank), int(world_size))

    @property
    def layout_pending(self) -> bool:
        """Whether a :meth:`reshard` waits for the next epoch to take effect."""
        return self._next_layout is not None

    def _pop_layout(self) -> tuple[int, int] | None:
        """The layout of a :meth:`reshard` (``None``: none), now taken."""
        layout, self._next_layout = self._next_layout, None
        return layout

    def end_reads(self) -> None:
        """Read nothing more of what this rank had left of the current epoch (its own
        shard and the samples dealt to it so far), also while a loop iterates it: the loop
        goes on with the samples :meth:`deal_unread` deals after this call (live
        recovery: a rank that joins mid-epoch has the epoch's unread samples, named by
        :meth:`lost_samples`, dealt again over the bigger group)."""
        self._stage.drop()
        self._early = None
        if not self._deals.cut(self.epoch, self._position):  # else: the deal read stops
            self._source.core.start_epoch(self.epoch, len(self))
            self._position = len(self)

    def close(self) -> None:
        """Stop the engine's threads (batches already handed out stay valid) and free the
        buffers lent to them (with a device: their share of the pinned-memory budget).
        Safe from any thread, also while another waits for a batch (that iteration then
        raises ``ValueError``: the loader is closed), and twice."""
        if "_source" not in self.__dict__:  # opened later, never opened
            return
        self._early = None  # a table's reader reads again from its next start_epoch
        self._source.close()
        self._stage.close()

    @property
    def device(self) -> torch.device | None:
        """The device batches are handed over on (``None``: host tensors)."""
        return self._stage.device

    @property
    def channels_last(self) -> bool:
        """Whether image batches come in ``torch.channels_last`` memory format."""
        return self._stage.channels_last

    def __repr__(self) -> str:
        if "_source" not in self.__dict__:  # opened later, not yet
            return f"Loader({self.__dict__['_opens']!r}) (opened on first use)"
        return (f"Loader({self.dataset!r}, batch_size={self.batch_size}, rank={self.rank}/"
                f"{self.world_size}, num_threads={self.num_threads}, prefetch={self.prefetch})")
