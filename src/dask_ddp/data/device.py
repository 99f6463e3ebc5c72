"""The device stage: a Loader's batches moved to the training device, ready for the step.

``Loader(..., device="cuda")`` hands the training loop batches already in the rank's GPU
memory. The stage sits between the engine and the loop and owns everything of the copy:

- **Pinned buffers, written by the engine.** The engine's batch buffers are page-locked
  host memory allocated here once (torch's caching host allocator) and handed to the
  engine's buffer pool, which decodes each batch straight into one: no copy into pinned
  memory in the training thread (``pin_memory()`` on a 38.5 MB batch is what held a
  loader-bound ResNet-18 to 0.75 of its GPU rate). At most ``prefetch + 2`` buffers per
  Loader; past the host's budget (``dask-ddp.data.pinned-memory``, shared by the ranks on
  the host) the Loader falls back to pageable buffers with one warning.
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
  allocator marked for the step's stream (``record_stream``).
- **uint8 on the bus, the float tail on the device.** A pipeline that ends in ``ToTensor``
  (and ``Normalize``) runs in the engine up to ``PILToTensor`` (uint8, a quarter of the
  bytes); the scaling and normalisation run on the GPU, in ``channels_last`` if asked.

With ``device="cpu"`` the stage runs the same code path without a stream (batches are host
tensors already; ``channels_last`` applies), so the CPU test suite exercises the Loaders'
stage plumbing.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch

from dask_ddp import _config
from dask_ddp._identity import cores_per_rank, own_cuda_index

__all__ = [
    "DeviceStage", "DeviceTail", "PinnedBudget", "check_device_name", "default_threads",
    "resolve_device", "split_tail", "stage_for",
]

logger = logging.getLogger(__name__)

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
        """``images`` (uint8, N x 3 x H x W) as float32 on their device, normalised."""
        x = images.to(dtype=torch.float32, memory_format=memory_format)
        if self.mean is None or self.std is None:
            return x.mul_(1.0 / 255.0)
        # (x / 255 - mean) / std in two in-place passes: x * (1 / (255 std)) - mean / std.
        scale, shift = self._constants(x.device)
        return x.mul_(scale).sub_(shift)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-channel scale and shift on ``device``, made once per device (a small
        host-to-device copy per batch would wait for the host)."""
        cache = self._on_device
        if device not in cache:
            assert self.mean is not None and self.std is not None
            scale = torch.tensor([1.0 / (255.0 * s) for s in self.std]).view(1, 3, 1, 1)
            shift = torch.tensor([m / s for m, s in zip(self.mean, self.std, strict=True)])
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


class PinnedBudget:
    """The host's page-locked memory budget for Loader buffers, shared by its ranks.

    ``dask-ddp.data.pinned-memory``: ``"auto"`` is an eighth of the host's memory, or a
    size; divided by ``LOCAL_WORLD_SIZE`` (the ranks on the host), so the ranks of a host
    together stay within it. Page-locked memory cannot be swapped: too much of it starves
    the host's other processes (and the Dask worker) of memory.
    """

    _lock = threading.Lock()
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
        """Return ``nbytes`` to the budget (a Loader's buffers were freed)."""
        with cls._lock:
            cls._used = max(0, cls._used - nbytes)


class _Reservation:
    """Pinned bytes reserved for a Loader's buffers, returned when the Loader is freed."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __del__(self) -> None:
        PinnedBudget.give(self.nbytes)


class DeviceStage:
    """Moves a Loader's host batches to ``device`` (see the module).

    Parameters
    ----------
    device
        The resolved device (:func:`resolve_device`).
    channels_last
        Image batches (4-D) in ``torch.channels_last`` memory format.
    tail
        The float tail run on the device (:func:`split_tail`), or None.
    """

    def __init__(self, device: torch.device, *, channels_last: bool = False,
                 tail: DeviceTail | None = None) -> None:
        self.device = device
        self.channels_last = bool(channels_last)
        self.tail = tail
        self._cuda = device.type == "cuda"
        self._stream: Any = torch.cuda.Stream(device) if self._cuda else None
        # (copy event, host tensors) of copies that may still read their host buffers.
        self._held: collections.deque[tuple[Any, tuple[Any, ...]]] = collections.deque()
        # The pinned bytes of the buffers lent to this stage's engines, given back to the
        # host's budget with the stage.
        self._reservations: list[_Reservation] = []

    @property
    def stream(self) -> Any:
        """The stage's CUDA stream (None on the CPU)."""
        return self._stream

    @property
    def pins(self) -> bool:
        """Whether the engine should write batches into pinned buffers (CUDA only)."""
        return self._cuda

    def engine_ops(self, ops: Sequence[Op]) -> list[Op]:
        """The engine's ops for a pipeline whose batches this stage moves: on a GPU, up to
        ``PILToTensor`` with the float tail kept here to run on the device
        (:func:`split_tail`); on the CPU, ``ops`` as they are."""
        if not self._cuda:
            return list(ops)
        engine, self.tail = split_tail(ops)
        return engine

    def lend(self, core: Any, count: int) -> Any:
        """``core`` (an engine image loader) with ``count`` page-locked buffers lent to it
        on a GPU, within the host's budget: the engine decodes into them and the copy to
        the GPU needs no staging. Past the budget (or on the CPU) ``core`` keeps its own."""
        buffers = self.pinned_buffers(count, int(core.batch_image_bytes))
        if buffers is not None:
            core.adopt_buffers([b.numpy() for b in buffers])
        return core

    def pinned_buffers(self, count: int, nbytes: int) -> list[torch.Tensor] | None:
        """``count`` page-locked uint8 buffers of ``nbytes`` for the engine's pool, or
        None (not CUDA, or past the host's budget: the engine allocates pageable ones)."""
        if not self._cuda or count < 1 or nbytes < 1:
            return None
        if not PinnedBudget.take(count * nbytes):
            return None
        self._reservations.append(_Reservation(count * nbytes))
        return [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(count)]

    @property
    def memory_format(self) -> torch.memory_format:
        """The memory format of image batches handed to the step."""
        return torch.channels_last if self.channels_last else torch.contiguous_format

    def _images(self, x: torch.Tensor) -> torch.Tensor:
        """An image batch's device form: the tail, or the memory format alone."""
        if self.tail is not None and x.dtype == torch.uint8:
            return self.tail.apply(x, self.memory_format)
        if self.channels_last:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def move(self, batch: Sequence[Any], image_at: int | None = 0) -> tuple[Any, ...]:
        """``batch``'s tensors on the device (others as they are); the tensor at
        ``image_at`` (an image batch, 4-D; -1: every 4-D tensor) gets the tail and memory
        format."""
        if not self._cuda:
            return tuple(self._images(x) if image_at in (i, -1) and _is_images(x) else x
                         for i, x in enumerate(batch))
        self._recycle()
        consumer = torch.cuda.current_stream(self.device)
        # No wait on the consumer's stream: the copy of this batch runs while the GPU still
        # runs the step before. The blocks it fills come from the stage's stream's pool;
        # the allocator hands out a block the consumer used only after the consumer's work
        # on it (record_stream below, on every tensor yielded).
        with torch.cuda.stream(self._stream):
            out = tuple(_to_device(x, self.device) for x in batch)
            out = tuple(self._images(x) if image_at in (i, -1) and _is_images(x) else x
                        for i, x in enumerate(out))
            event = torch.cuda.Event()
            event.record(self._stream)
        consumer.wait_event(event)
        for x in _tensors(out):
            x.record_stream(consumer)
        self._held.append((event, tuple(batch)))
        return out

    def move_value(self, value: Any) -> Any:
        """A table batch's tensors on the device (a dict's values, a tuple's items, a
        tensor); ``channels_last`` applies to its 4-D tensors (a column of images)."""
        if isinstance(value, dict):
            keys = list(value)
            moved = self.move([value[k] for k in keys], image_at=-1)
            return dict(zip(keys, moved, strict=True))
        if isinstance(value, tuple):
            return self.move(value, image_at=-1)
        return self.move([value], image_at=-1)[0]

    def _recycle(self) -> None:
        """Release the host batches whose copies completed (their engine buffers go back
        to the pool)."""
        while self._held and self._held[0][0].query():
            self._held.popleft()

    def drop(self) -> None:
        """Release every held host batch after its copy completed (the epoch ended, the
        reads were cut or the Loader closes)."""
        while self._held:
            event, _ = self._held.popleft()
            event.synchronize()

    def __repr__(self) -> str:
        return f"DeviceStage({self.device}, channels_last={self.channels_last})"


def _is_images(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() == 4


def _to_device(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    return x


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, dict):
            out += _tensors(list(v.values()))
    return out


def stage_for(device: str | torch.device | None, channels_last: bool,
               pin_memory: bool | None) -> DeviceStage | None:
    """The device stage of a Loader's ``device=`` and ``channels_last=`` (None: host
    tensors, as without them)."""
    resolved = resolve_device(device)
    if resolved is None:
        if channels_last:
            raise ValueError("channels_last=True needs a device (e.g. device='cuda'): "
                             "host batches keep the engine's layout")
        return None
    if pin_memory:
        raise ValueError(f"pin_memory=True with device={device!r}: the device stage pins "
                         "its own buffers; leave pin_memory unset")
    return DeviceStage(resolved, channels_last=channels_last)


def default_threads(stage: DeviceStage | None) -> int:
    """A Loader's default engine threads: this rank's share of the host's cores, less one
    for the training loop when batches go to a GPU (its thread launches the step's kernels
    and the copies, and a decode thread on its core delays every launch)."""
    cores = cores_per_rank()
    if stage is not None and stage.pins:
        return max(1, cores - 1)
    return cores
