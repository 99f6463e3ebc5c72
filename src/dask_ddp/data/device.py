"""The device stage: a Loader's batches moved to the training device, ready for the step.

``Loader(..., device="cuda")`` hands the training loop batches already in the rank's GPU
memory. The stage sits between the engine and the loop and owns everything of the copy:

- **Pinned buffers, written by the engine.** The engine's batch buffers are page-locked
  host memory allocated here once (torch's caching host allocator) and handed to the
  engine's buffer pool, which decodes each batch straight into one: no copy into pinned
  memory in the training thread (``pin_memory()`` on a 38.5 MB batch held the code before
  this stage, a loader-bound ResNet-18 on an H100, to 0.75 of its GPU rate; this stage's
  figure is unmeasured until ``make gpu-check`` runs on a GPU). At most ``prefetch + 2`` buffers per
  engine loader; each holds its share of the host's budget (``dask-ddp.data.pinned-memory``,
  shared by the ranks on the host; at torch's block size, a power of two) until the engine
  frees it (closed, or replaced at a reshard or a new epoch). Past the budget the Loader
  falls back to pageable buffers with one warning. Image batches and their labels are
  decoded into them (the labels after the images, in the same buffer), a table's columns
  gathered into them (:meth:`DeviceStage.lend`, one loan for every kind); tar shards'
  other fields, stacked by the engine once decoded, are copied into lent buffers of their
  size (:meth:`DeviceStage.staged`). A copy from pageable memory would wait for the host.
- **A copy stream of its own.** Each batch crosses the bus on the stage's CUDA stream,
  ``non_blocking``; the step's stream waits on an event, not the host. The copy of the next
  batch is issued when the loop asks for it, while the GPU still runs the step before (the
  loop runs ahead of the GPU as long as nothing syncs it: see ``report()``), so copy and
  compute overlap without the stage taking batches from the engine ahead of the loop. That
  keeps a Loader's accounting simple: a batch is either in the engine or yielded, and
  positions, ``state_dict`` and live recovery count yields.
- **Buffers recycled by events.** A host batch (its engine buffer) is released only after
  its copy's event completed, so the engine never overwrites memory a copy still reads,
  however slow the consumer; the tensors the step gets are fresh blocks of torch's
  allocator marked (``record_stream``) for the stream current in the thread that takes the
  batch, which also waits on the copy's event.
- **uint8 on the bus, the float tail on the device.** A pipeline that ends in ``ToTensor``
  (and ``Normalize``) runs in the engine up to ``PILToTensor`` (uint8, a quarter of the
  bytes); the scaling and normalisation run on the GPU, in ``channels_last`` if asked.

With ``device="cpu"`` the stage runs the same code path without a stream (batches are host
tensors already; ``channels_last`` applies), so the CPU test suite exercises the Loaders'
stage plumbing; without a device it hands host batches on (pinned if ``pin_memory``). Every
reader (Loaders, ``predict``) makes its engine loaders with :meth:`DeviceStage.reader` and
reads with ``with stage.over(host_batches) as batches:``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from dask_ddp import _config, _core
from dask_ddp._identity import cores_per_rank, own_cuda_index

__all__ = [
    "DeviceStage", "DeviceTail", "HeldBatches", "PinnedBudget", "check_device_name",
    "default_threads", "pinned_block_bytes", "resolve_device", "split_tail", "stage_for",
]

logger = logging.getLogger(__name__)

#: What the stage lends buffers to: an engine image loader or a table's batch stream.
R = TypeVar("R", bound="_core.ImageLoader | _core.TableBatches")

def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """The torch device a Loader's ``device=`` names (``None``: host tensors, as before).

    ``"cuda"`` (no index) is the rank's own GPU, the one ``rank_info().device`` names
    (:func:`dask_ddp._identity.own_cuda_index`: the GPU dask-ddp's launcher placed the rank
    on, ``cuda:<LOCAL_RANK>`` under torchrun or Lightning); outside a rank, the current
    CUDA device. ``"cpu"`` runs the stage on the host.

    Raises
    ------
    ValueError
        A CUDA device where CUDA is not available (naming the device), an index past the
        visible GPUs, or a device type the stage does not support.
    TypeError
        ``device`` is neither a string nor a ``torch.device``.
    """
    dev = check_device_name(device)
    if dev is None or dev.type == "cpu":
        return dev
    if not torch.cuda.is_available():
        raise ValueError(f"Loader device {device!r}: CUDA is not available in this process "
                         "(no GPU visible, or torch was built without CUDA); use device=None "
                         "or 'cpu'")
    index = dev.index
    if index is None:  # the rank's own GPU, as rank_info().device names it
        index = own_cuda_index(os.environ, torch.cuda.device_count())
    if index is None:
        index = torch.cuda.current_device()
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"Loader device {device!r}: this process sees "
                         f"{torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


def check_device_name(device: str | torch.device | None) -> torch.device | None:
    """``device`` parsed, without asking whether this process has it (a Loader of a Dask
    collection is made on the client, which may have no GPU; its ranks check again).

    Raises
    ------
    ValueError, TypeError
        As :func:`resolve_device`, but for the device's availability.
    """
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"Loader device must be None, a string or a torch.device, got "
                        f"{type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"Loader device {device!r} is not a device torch knows: {e}") from e
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"Loader device {device!r}: the device stage supports 'cpu' and "
                         "'cuda' devices")
    return torch.device("cpu") if dev.type == "cpu" else dev


@dataclasses.dataclass(frozen=True)
class DeviceTail:
    """The float tail of an image pipeline, run on the device: ``x / 255``, then
    ``(x - mean) / std`` when ``mean`` is set (``ToTensor`` and ``Normalize``)."""

    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    #: The per-channel constants on each device the tail ran on.
    _on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False)

    def apply(self, images: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
        """``images`` (uint8, N x 3 x H x W) as float32 on their device, normalised, in
        ``memory_format``, by one op that reads uint8 and writes the float layout (float32:
        no public option asks for bf16; autocast casts at the model's first op)."""
        out = torch.empty(images.shape, dtype=torch.float32, device=images.device,
                          memory_format=memory_format)
        if self.mean is None or self.std is None:
            return torch.mul(images, 1.0 / 255.0, out=out)
        scale, neg_shift = self._constants(out.device)  # (x / 255 - mean) / std
        return torch.addcmul(neg_shift, images, scale, out=out)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-channel scale and negated shift on ``device``, made once per device (a
        small host-to-device copy per batch would wait for the host)."""
        cache = self._on_device
        if device not in cache:
            assert self.mean is not None and self.std is not None
            scale = torch.tensor([1.0 / (255.0 * s) for s in self.std]).view(1, 3, 1, 1)
            shift = torch.tensor([-m / s for m, s in zip(self.mean, self.std, strict=True)])
            cache[device] = (scale.to(device), shift.view(1, 3, 1, 1).to(device))
        return cache[device]


Op = tuple[str, list[float]]


def split_tail(ops: Sequence[Op]) -> tuple[list[Op], DeviceTail | None]:
    """Engine ops for a device stage and the tail that moves to the device.

    A pipeline whose last ops are ``to_tensor`` (and ``normalize``) runs in the engine up to
    ``pil_to_tensor`` (uint8 crosses the bus); anything else stays as it is (no tail).
    """
    ops = list(ops)
    mean = std = None
    if ops and ops[-1][0] == "normalize":
        params = [float(v) for v in ops[-1][1]]
        mean, std = (params[0], params[1], params[2]), (params[3], params[4], params[5])
        rest = ops[:-1]
    else:
        rest = ops
    if not rest or rest[-1][0] != "to_tensor":
        return ops, None
    return [*rest[:-1], ("pil_to_tensor", [])], DeviceTail(mean, std)


def pinned_block_bytes(nbytes: int, settings: str | None = None) -> int:
    """The bytes torch's caching host allocator takes for a page-locked request of
    ``nbytes``: what a pinned buffer costs the host.

    torch (``CachingHostAllocator``) rounds a request up to a power of two (a 38.5 MB batch
    buffer takes a 64 MiB block) unless it is above ``pinned_max_round_threshold_mb`` or
    ``pinned_max_cached_size_mb`` of its allocator settings (``PYTORCH_ALLOC_CONF``; unset
    by default), which it takes at its size. ``settings``: that string (default: torch's).

    >>> pinned_block_bytes(38_535_168) == 64 * 2**20
    True
    >>> pinned_block_bytes(2**20 + 1, "pinned_max_round_threshold_mb:1")
    1048577
    """
    if nbytes <= 0:
        return 0
    limit = _round_limit(_allocator_settings() if settings is None else settings)
    if limit is not None and nbytes > limit:
        return int(nbytes)
    return 1 << (int(nbytes) - 1).bit_length()


def _allocator_settings() -> str:
    """torch's allocator settings string (what ``PYTORCH_ALLOC_CONF`` or
    ``torch._C._accelerator_setAllocatorSettings`` set last)."""
    get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)  # noqa: SLF001 (torch's only reader of its parsed allocator settings)
    if get is not None:
        return str(get())
    return os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def _round_limit(settings: str) -> int | None:
    """The largest pinned request torch rounds up to a power of two (None: every one)."""
    limits = []
    for item in settings.split(","):
        key, _, value = item.partition(":")
        if key.strip() in ("pinned_max_round_threshold_mb", "pinned_max_cached_size_mb"):
            try:
                limits.append(int(value.strip()) * 2**20)
            except ValueError:
                continue  # torch refuses a malformed value itself
    return min(limits) if limits else None


class PinnedBudget:
    """The host's page-locked memory budget for Loader buffers, shared by its ranks.

    ``dask-ddp.data.pinned-memory``: ``"auto"`` is an eighth of the host's memory, or a
    size; divided by ``LOCAL_WORLD_SIZE`` (the ranks on the host), so the ranks of a host
    together stay within it. Page-locked memory cannot be swapped: too much of it starves
    the host's other processes (and the Dask worker) of memory. Each lent buffer holds its
    share (at torch's block size, :func:`pinned_block_bytes`) while it is alive.
    """

    # Reentrant: a buffer's finalizer gives its bytes back from whatever frees it, which
    # may be a garbage collection run inside take() on the same thread.
    _lock = threading.RLock()
    _used = 0  # bytes of this process's Loaders' pinned buffers alive
    _warned = False

    @classmethod
    def rank_bytes(cls) -> int:
        """This rank's share of the host's budget."""
        value = _config.get("dask-ddp.data.pinned-memory")
        if value == "auto" or value is None:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8
        else:
            total = _config.positive_bytes("dask-ddp.data.pinned-memory", allow_zero=True)
        try:
            local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            local = 1
        return int(total) // local

    @classmethod
    def used(cls) -> int:
        """Bytes of this process's lent buffers alive."""
        with cls._lock:
            return cls._used

    @classmethod
    def take(cls, nbytes: int) -> bool:
        """Reserve ``nbytes`` of the budget; False (and one warning per process) past it."""
        with cls._lock:
            limit = cls.rank_bytes()
            if cls._used + nbytes <= limit:
                cls._used += nbytes
                return True
            if not cls._warned:
                cls._warned = True
                logger.warning(
                    "Loader: %.1f MiB of pinned batch buffers would pass this rank's share "
                    "of the host's pinned-memory budget (%.1f MiB, dask-ddp.data.pinned-memory "
                    "over LOCAL_WORLD_SIZE ranks): this Loader uses pageable buffers (its "
                    "copies to the GPU then wait for the host)",
                    (cls._used + nbytes) / 2**20, limit / 2**20)
            return False

    @classmethod
    def give(cls, nbytes: int) -> None:
        """Return ``nbytes`` to the budget (a lent buffer was freed)."""
        with cls._lock:
            cls._used = max(0, cls._used - nbytes)


class _Event(Protocol):
    """What the stage needs of a copy's event (``torch.cuda.Event``)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class HeldBatches:
    """The host batches a device stage holds until their copies completed.

    Each entry is a copy's event and its host batch: the batch (its engine buffer) is
    released only after the event completed, so the engine never decodes over memory a copy
    still reads. The loop's thread adds and recycles; :meth:`close` may come from any thread
    (a Loader's ``close()``). Events are queried and waited on outside the lock, so a slow
    copy holds up neither thread's bookkeeping.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: collections.deque[tuple[_Event, tuple[Any, ...]]] = collections.deque()
        self._closed = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def add(self, event: _Event, batch: tuple[Any, ...]) -> None:
        """Hold ``batch`` until ``event`` completed.

        Raises
        ------
        ValueError
            The stage was closed (meanwhile): the batch is released once its copy is done.
        """
        with self._lock:
            if not self._closed:
                self._held.append((event, batch))
                return
        event.synchronize()
        raise ValueError("the loader is closed")

    def recycle(self) -> None:
        """Release the batches, oldest first, whose copies completed.

        Raises
        ------
        ValueError
            The stage was closed.
        """
        while True:
            with self._lock:
                if self._closed:
                    raise ValueError("the loader is closed")
                if not self._held:
                    return
                head = self._held[0]
            if not head[0].query():
                return
            with self._lock:
                # A drop() from another thread may have taken it meanwhile.
                if self._held and self._held[0] is head:
                    self._held.popleft()

    def drop(self) -> None:
        """Release every held batch, each after its copy completed."""
        with self._lock:
            held, self._held = self._held, collections.deque()
        for event, _ in held:
            event.synchronize()

    def close(self) -> None:
        """:meth:`drop`, and refuse batches from now on (:meth:`add` and :meth:`recycle`
        raise ``ValueError``)."""
        with self._lock:
            self._closed = True
        self.drop()


def _pinned(nbytes: int) -> torch.Tensor:
    """A page-locked uint8 buffer from torch's caching host allocator."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class DeviceStage:
    """Moves a reader's host batches to ``device`` (see the module).

    Parameters
    ----------
    device
        The resolved device (:func:`resolve_device`); None: host batches handed on as
        they are (pinned with a copy when ``pin_memory``).
    channels_last
        Image batches (4-D) in ``torch.channels_last`` memory format.
    ops
        The image pipeline of the engine loaders this stage reads (none for tables): on
        a GPU its float tail runs on the device (:func:`split_tail`).
    buffers
        Page-locked buffers lent to each engine loader or table pass (:meth:`lend`, on
        a GPU; ``prefetch + 2`` for a Loader).
    pin_memory
        Without a device: copy each host batch's tensors to pinned memory.
    host_buffer
        ``host_buffer(nbytes)``: a 1-D uint8 tensor to lend an engine. Default: on a GPU,
        page-locked memory from torch's caching host allocator; elsewhere none is lent
        (engines keep their own buffers). Lent buffers count against the host's
        :class:`PinnedBudget` while they are alive, whatever allocates them.
    """

    def __init__(self, device: torch.device | None, *, channels_last: bool = False,
                 ops: Sequence[Op] = (), buffers: int = 0, pin_memory: bool = False,
                 host_buffer: Callable[[int], torch.Tensor] | None = None) -> None:
        self.device, self.channels_last = device, bool(channels_last)
        self._cuda = device is not None and device.type == "cuda"
        #: The engine's ops and the tail run here (on a GPU: uint8 crosses the bus).
        self.engine_ops, self.tail = split_tail(ops) if self._cuda else (list(ops), None)
        self._buffers, self._pin = int(buffers), bool(pin_memory) and device is None
        #: The stage's CUDA stream (None elsewhere).
        self.stream: Any = torch.cuda.Stream(device) if self._cuda else None
        self._held = HeldBatches()
        self._host_buffer = host_buffer or (_pinned if self._cuda else None)
        #: Host batches the stage may hold when the reader is asked for the next one: the
        #: last one moved, while its copy still runs (on a GPU). A reader's ``prefetch``
        #: is this many more, so its own ``prefetch`` batches are decoded ahead.
        self.holds = 1 if self._cuda else 0

    def reader(self, make: Callable[[list[Op]], R]) -> R:
        """``make(engine_ops)``, an engine image loader, :meth:`lend`-ed buffers."""
        return self.lend(make(list(self.engine_ops)))

    def lend(self, core: R) -> R:
        """``core`` (an engine image loader or a table's batch stream) lent ``buffers``
        page-locked buffers on a GPU within the host's budget (else it keeps its own) to
        write batches into: each goes back to it when its batch is freed (held here until
        its copy completed), and to the budget once ``core`` is closed."""
        buffers = self.pinned_buffers(self._buffers, int(core.batch_buffer_bytes))
        if buffers is not None:
            core.adopt_buffers(buffers)
        return core

    def staged(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (a field the engine stacked apart) in a lent buffer of its size (page-locked
        on a GPU), or ``x`` itself without a lender or past the budget."""
        lent = self.pinned_buffers(1, x.nbytes)
        if lent is None:
            return x
        return torch.from_numpy(lent[0]).view(x.dtype).view(x.shape).copy_(x)

    def pinned_buffers(self, count: int, nbytes: int) -> list[np.ndarray] | None:
        """``count`` page-locked uint8 buffers of ``nbytes`` for the engine's pool, as
        numpy arrays (what the engine takes), or None (not CUDA, or past the host's budget:
        the engine allocates pageable ones). Each array owns its buffer and holds its
        block's bytes of the budget until it is freed."""
        if self._host_buffer is None or count < 1 or nbytes < 1:
            return None
        block = pinned_block_bytes(nbytes)
        if not PinnedBudget.take(count * block):
            return None
        buffers: list[np.ndarray] = []
        try:
            for _ in range(count):
                # The array is the buffer's only owner (the tensor made for it goes now):
                # its finalizer runs when the memory is freed.
                array = self._host_buffer(nbytes).numpy()
                weakref.finalize(array, PinnedBudget.give, block).atexit = False
                buffers.append(array)
        except RuntimeError as e:  # the host refused page-locked memory
            PinnedBudget.give((count - len(buffers)) * block)
            logger.warning("Loader: %d pinned batch buffers of %d bytes could not be "
                           "allocated (%s): this Loader uses pageable buffers", count,
                           nbytes, e)
            return None
        return buffers

    @contextlib.contextmanager
    def over(self, batches: Iterable[Any], image_at: int | None = 0) -> Iterator[Iterator[Any]]:
        """``batches`` (host batches: tuples, dicts of tensors or tensors) moved by
        :meth:`move` as they are taken; when the block ends (the reader's end, a
        ``break``, a raise) every host batch still held is released after its copy.

        >>> stage = DeviceStage(torch.device("cpu"))
        >>> with stage.over([(torch.zeros(2, 3, 4, 4), torch.arange(2))]) as moved:
        ...     [tuple(x.shape) for x in next(moved)]
        [(2, 3, 4, 4), (2,)]
        """
        try:
            yield self._moved(iter(batches), image_at)
        finally:
            self.drop()

    def _moved(self, batches: Iterator[Any], image_at: int | None) -> Iterator[Any]:
        """:meth:`move` over ``batches``. Before the reader is asked for the next host
        batch, the batches whose copies completed go back to the engine and this generator
        drops its own reference: the engine counts the buffers still taken against
        ``prefetch``, so each one held here would be one batch less decoded ahead."""
        while True:
            if self._cuda:
                self._held.recycle()
            host = next(batches, None)
            if host is None:
                return
            moved = self.move(host, image_at)
            host = None
            yield moved
            moved = None

    def _images(self, x: torch.Tensor) -> torch.Tensor:
        """An image batch's device form: the tail, or the memory format alone."""
        if self.tail is not None and x.dtype == torch.uint8:
            return self.tail.apply(x, torch.channels_last if self.channels_last
                                   else torch.contiguous_format)
        if self.channels_last:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def _shaped(self, batch: Sequence[Any], image_at: int | None) -> tuple[Any, ...]:
        """``batch`` with the image tensors at ``image_at`` in their device form."""
        return tuple(self._images(x) if image_at in (i, -1) and _is_images(x) else x
                     for i, x in enumerate(batch))

    def move(self, batch: Any, image_at: int | None = 0) -> Any:
        """``batch``'s tensors on the device, for the stream current in the calling thread:
        a tuple's items (the 4-D one at ``image_at``, every one at -1, gets the tail and
        memory format), a dict's values (a table's columns) or one tensor.

        Raises
        ------
        ValueError
            The stage was closed (:meth:`close`, also from another thread meanwhile).
        """
        if self.device is None and not self._pin:
            return batch  # host tensors, as they are
        if isinstance(batch, dict):
            keys = list(batch)
            return dict(zip(keys, self._move([batch[k] for k in keys], -1), strict=True))
        if isinstance(batch, torch.Tensor):
            return self._move([batch], -1)[0]
        return self._move(batch, image_at)

    def _move(self, batch: Sequence[Any], image_at: int | None) -> tuple[Any, ...]:
        if self.device is None:
            return tuple(x.pin_memory() if isinstance(x, torch.Tensor) else x for x in batch)
        if not self._cuda or all(x.device == self.device for x in _tensors(batch)):
            return self._shaped(batch, image_at)  # nothing crosses the bus
        self._held.recycle()
        consumer = torch.cuda.current_stream(self.device)
        # No wait on the consumer's stream: the copy of this batch runs while the GPU still
        # runs the step before. The blocks it fills come from the stage's stream's pool;
        # the allocator hands out a block the consumer used only after the consumer's work
        # on it (record_stream below, on every tensor yielded).
        with torch.cuda.stream(self.stream):
            # The image batch last: a copy from pageable memory (past the budget, a table's
            # features of several dtypes) first waits for the stream's work (CUDA's rule
            # for pageable sources), which must not be this batch's image copy.
            order = sorted(range(len(batch)), key=lambda i: i == image_at)
            moved = {i: _to_device(batch[i], self.device) for i in order}
            out = self._shaped([moved[i] for i in range(len(batch))], image_at)
            # A blocking event: a wait for it (drop, close) sleeps rather than spins on a
            # core the decode threads need.
            event = torch.cuda.Event(blocking=True)
            event.record(self.stream)
        consumer.wait_event(event)
        for x in _tensors(out):
            x.record_stream(consumer)
        self._held.add(event, tuple(batch))
        return out

    def drop(self) -> None:
        """Release every held host batch after its copy completed (the reads were cut
        or the Loader closes; :meth:`over` does it when its block ends)."""
        self._held.drop()

    def close(self) -> None:
        """:meth:`drop`, and refuse batches from now on (:meth:`move` raises
        ``ValueError``); safe from any thread, also while another moves a batch."""
        self._held.close()

    def __repr__(self) -> str:
        return f"DeviceStage({self.device}, channels_last={self.channels_last})"


def _is_images(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() == 4


def _to_device(x: Any, device: torch.device) -> Any:
    return x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    return [x for x in values if isinstance(x, torch.Tensor)]


def stage_for(device: str | torch.device | None, channels_last: bool,
              pin_memory: bool | None, *, ops: Sequence[Op] = (),
              buffers: int = 0) -> DeviceStage:
    """The stage of a Loader's ``device=``, ``channels_last=`` and ``pin_memory=``
    (default: when CUDA is available and ``device`` is None); ``ops`` and ``buffers`` as
    :class:`DeviceStage`'s. ``ValueError`` for ``channels_last`` without a device or
    ``pin_memory`` with one."""
    resolved = resolve_device(device)
    if resolved is None:
        if channels_last:
            raise ValueError("channels_last=True needs a device (e.g. device='cuda'): "
                             "host batches keep the engine's layout")
        pin = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        return DeviceStage(None, ops=ops, pin_memory=pin)
    if pin_memory:
        raise ValueError(f"pin_memory=True with device={device!r}: the device stage pins "
                         "its own buffers; leave pin_memory unset")
    return DeviceStage(resolved, channels_last=channels_last, ops=ops, buffers=buffers)


def default_threads(stage: DeviceStage | None) -> int:
    """A Loader's default engine threads: this rank's share of the host's cores, less one
    for the training loop when batches go to a GPU (its thread launches the step's kernels
    and the copies, and a decode thread on its core delays every launch)."""
    return decode_share(cores_per_rank(), stage is not None and stage.stream is not None)


def decode_share(cores: int, gpu: bool) -> int:
    """Decode threads for ``cores``: one fewer on a GPU, where the thread that launches
    every kernel and copy needs a core of its own (a Loader's default, predict's tasks)."""
    return max(1, cores - 1) if gpu else cores
