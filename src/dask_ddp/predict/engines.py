"""One engine image loader per worker thread, kept from one partition's task to the next.

Building an engine loader starts its decode and fetch threads, allocates its batch buffers
(pinned ones lent by the device stage on a GPU, with the stage's CUDA stream) and takes
the store, before the first image is read. A thread that runs many partitions of image
lists builds one and hands it each partition's keys (``ImageLoader.restart``), as long as
the partitions' engines would be alike: the same store, transform ops, batch size, decode
threads, prefetch, error handling and device (:class:`EngineKey`). A task whose engine
differs closes the cached one and builds its own, which stays cached in its place.

The cache holds at most one engine per thread, idle between tasks: a task takes it out
while it reads and puts it back only when its partition was read to the end, so a task
that fails (its model raised, a bad image, a cancellation) closes its engine rather than
keep one whose traceback Dask may hold. The engine is closed when its thread ends (the
thread's locals go) or at interpreter exit. An idle engine keeps what a reading one holds:
its threads (asleep), ``prefetch`` batch buffers (pinned ones in the host's pinned budget)
and its decode buffers.

Tar shards keep an engine per partition: a partition is one shard, and a shard engine's
samples are its source's (``restart`` is for key lists).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from dask_ddp.data.device import DeviceStage
from dask_ddp.data.engine import ImageSource

__all__ = ["CachedEngine", "EngineKey", "close_engine", "engine_for", "engine_info"]


@dataclasses.dataclass(frozen=True)
class EngineKey:
    """What makes two partitions' engine loaders alike (one can read the other's keys)."""

    store: tuple[str, bool, str]  # root, anon, storage options
    ops: tuple[Any, ...]
    batch_size: int
    threads: int
    prefetch: int
    skip_errors: bool
    skip_missing: bool
    max_side: int
    device: str
    channels_last: bool


class CachedEngine:
    """A device stage and the engine loader made with it, kept by one thread.

    The engine is closed by :meth:`close`, or when this object is freed (its thread ended)
    or the interpreter exits, whichever comes first.
    """

    def __init__(self, key: EngineKey, stage: DeviceStage, engine: Any) -> None:
        self.key, self.stage, self.engine = key, stage, engine
        self._close = weakref.finalize(self, engine.close)
        _made.add(self)

    @property
    def closed(self) -> bool:
        """Whether the engine was closed."""
        return not self._close.alive

    def close(self) -> None:
        """Stop the engine's threads and free its buffers (once; later calls do nothing)."""
        self._close()


_local = threading.local()
_counts_lock = threading.Lock()
_counts = {"built": 0, "reused": 0}
_made: weakref.WeakSet[CachedEngine] = weakref.WeakSet()  # freed with their threads' locals


def engine_info() -> dict[str, int]:
    """This process's image engines for ``predict``: how many were built, how many
    partitions reused a thread's cached one, and how many are open now (cached or
    reading)."""
    with _counts_lock:
        info = dict(_counts)
    info["open"] = sum(not cached.closed for cached in list(_made))
    return info


def close_engine() -> None:
    """Close this thread's cached engine, if it has one."""
    cached, _local.engine = getattr(_local, "engine", None), None
    if cached is not None:
        cached.close()


def _count(what: str) -> None:
    with _counts_lock:
        _counts[what] += 1


@contextlib.contextmanager
def engine_for(key: EngineKey, source: ImageSource,
               make: Callable[[], tuple[DeviceStage, Any]]) -> Iterator[CachedEngine]:
    """This thread's engine for ``key``, reading ``source``'s keys; ``make()`` builds a
    stage and an engine over ``source`` where the thread has none alike.

    Back in the thread's cache when the block ends normally; closed when it raises (also
    ``GeneratorExit``: a reader closed before its end).
    """
    cached: CachedEngine | None = getattr(_local, "engine", None)
    _local.engine = None  # out of the cache while a task reads with it
    if cached is not None and cached.key != key:
        cached.close()
        cached = None
    if cached is None:
        stage, engine = make()
        cached = CachedEngine(key, stage, engine)
        _count("built")
    else:
        try:
            source.restart(cached.engine)
        except BaseException:
            cached.close()
            raise
        _count("reused")
    try:
        yield cached
    except BaseException:
        cached.close()
        raise
    previous, _local.engine = getattr(_local, "engine", None), cached
    if previous is not None:  # a nested read of the same thread put one back meanwhile
        previous.close()
