"""One pass of a :class:`~dask_ddp.data.TableLoader` over some rows: a thread of its own
feeds their batches to the engine's stream, the training loop takes them (internal).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dask_ddp.data.table.batches import POLL_S

if TYPE_CHECKING:
    import numpy as np

    from dask_ddp.data.table.batches import EpochBatches

__all__ = ["Feed"]

logger = logging.getLogger(__name__)

#: Seconds :meth:`Feed.close` waits for the feeding thread.
JOIN_S = 60


class Feed:
    """The batches of ``rank_rows()`` (the rows and their window ids) from batch ``start``
    of ``epoch`` on, fed by a thread (:meth:`EpochBatches.produce`) into an engine stream
    of ``prefetch`` batches; ``ahead()``, the next epoch's rows, made while these are
    gathered. The thread starts here, named ``name``."""

    def __init__(self, batches: EpochBatches, prefetch: int, start: int, epoch: int,
                 rank_rows: Callable[[], tuple[np.ndarray, np.ndarray]],
                 ahead: Callable[[], tuple[np.ndarray, np.ndarray]] | None, *,
                 name: str) -> None:
        self.stream = batches.stream(prefetch)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=batches.produce,
                                       args=(self.stream, self.stop, start, epoch, rank_rows,
                                             self.errors, ahead),
                                       name=name, daemon=True)
        self.thread.start()

    def next(self) -> Any:
        """The engine's next batch (``None``: the end), the GIL released while it waits;
        an exception that ended the thread is raised after the batches before it."""
        while True:
            try:
                item = self.stream.next(POLL_S)
                break
            except TimeoutError:
                continue  # the reads wait at most FETCH_TIMEOUT_S, then raise
        if item is None and self.errors:
            raise self.errors[0]
        return item

    def cancel(self) -> None:
        """Stop the thread and close the stream (from any thread: a :meth:`next` waiting
        ends)."""
        self.stop.set()
        self.stream.close()

    def close(self, rank: int) -> None:
        """:meth:`cancel`, then wait for the thread (a warning naming ``rank`` past
        ``JOIN_S``)."""
        self.cancel()
        self.thread.join(timeout=JOIN_S)
        if self.thread.is_alive():
            logger.warning("rank %d: the table's feeding thread did not stop within "
                           "%d s (a read of the table is still waiting)", rank, JOIN_S)
