"""The rank's step counters, shared with its supervisor through a small mapped file.

The :class:`~dask_ddp.data.Loader` adds one to ``batches`` and the nanoseconds it waited
for the batch to ``wait_ns`` each time it hands out a batch; the supervisor in the worker
reads both every few seconds (:mod:`dask_ddp._dashboard.sampler`) for the job page's step
rate and data wait. Nothing is sent and nothing is locked: a batch costs two clock reads
and two stores into shared memory. Outside a launched rank (no ``DASK_DDP_STATS`` file)
the counters are a no-op.

Layout of the file: :data:`FIELDS` unsigned 64-bit counters in native byte order.
"""

from __future__ import annotations

import mmap
import os

#: Environment variable naming the counters file (set by the supervisor).
ENV_STATS = "DASK_DDP_STATS"
#: The counters, in file order.
FIELDS = ("batches", "wait_ns")
SIZE = 8 * len(FIELDS)
_BATCHES, _WAIT = 0, 1


class Counters:
    """The counters of one rank, mapped from ``path`` (created and sized by the reader)."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._cells = memoryview(self._map).cast("Q")

    def add_batch(self, wait_ns: int) -> None:
        """One batch handed out after waiting ``wait_ns`` nanoseconds for it."""
        cells = self._cells
        cells[_WAIT] += wait_ns
        cells[_BATCHES] += 1

    def read(self) -> dict[str, int]:
        """The counters now (a reader's view; each value is one aligned 8-byte load)."""
        return {name: int(self._cells[i]) for i, name in enumerate(FIELDS)}


def create(path: str) -> Counters:
    """Make a zeroed counters file at ``path`` and map it (the supervisor's side)."""
    with open(path, "wb") as f:
        f.write(b"\0" * SIZE)
    return Counters(path)


_mine: Counters | None = None
_pid = -1


def rank_counters() -> Counters | None:
    """This rank's counters, or ``None`` outside a launched rank (resolved once per process;
    a forked child, e.g. a DataLoader worker, resolves its own)."""
    global _mine, _pid
    if _pid != os.getpid():
        _pid = os.getpid()
        path = os.environ.get(ENV_STATS)
        try:
            _mine = Counters(path) if path else None
        except (OSError, ValueError):
            _mine = None
    return _mine
