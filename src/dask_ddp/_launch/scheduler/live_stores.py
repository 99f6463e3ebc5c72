"""The store of a live job, hosted by the scheduler: no rank is special (internal).

A job with ``recovery="live"`` keeps its process group's store (the rendezvous of every
generation, the survivors' reports, the agreed members, the generation records) on the
Dask scheduler, which outlives any worker: losing the worker of rank 0 is survivable like
losing any other. :class:`LiveStores` is a scheduler plugin: the job's launch asks it for
a ``TCPStore`` (:data:`OPEN_HANDLER`), its end closes it (:data:`CLOSE_HANDLER`), and a
worker that leaves the cluster has its ranks recorded as lost on the stores of the live
jobs it served (a killed worker's supervisor cannot say so itself).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from distributed.diagnostics.plugin import SchedulerPlugin

from dask_ddp._launch.wire.entry_points import LIVE_STORES
from dask_ddp._launch.wire.live_store import (
    CLOSE_HANDLER,
    GENERATIONS_HANDLER,
    LEFT_HANDLER,
    MAX_GENERATIONS,
    OPEN_HANDLER,
    generation_texts,
    mark_dead,
)

logger = logging.getLogger(__name__)


class LiveStores(SchedulerPlugin):
    """One ``TCPStore`` server per running live job, on the scheduler (see the module)."""

    name = LIVE_STORES.name
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None
        #: job id -> (the store, the job's workers by rank)
        self._stores: dict[str, tuple[Any, list[str]]] = {}
        #: job id -> address -> times a worker there left while the job used the address
        #: (a worker restarted at its address, a fixed port, is a new worker)
        self._left: dict[str, dict[str, int]] = {}
        self._torch: asyncio.Future[Any] | None = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        # torch's first import takes seconds (tens on a loaded host): in a thread, begun
        # now, never on the scheduler's event loop.
        self._torch = asyncio.get_running_loop().run_in_executor(
            None, importlib.import_module, "torch.distributed")
        scheduler.handlers[OPEN_HANDLER] = self.open
        scheduler.handlers[CLOSE_HANDLER] = self.close_job
        scheduler.handlers[GENERATIONS_HANDLER] = self.generations
        scheduler.handlers[LEFT_HANDLER] = self.left

    async def open(self, job_id: str, workers: list[str]) -> str:
        """Start job ``job_id``'s store; its ``host:port`` as the workers reach it."""
        assert self._torch is not None  # start() ran
        TCPStore = (await self._torch).TCPStore  # noqa: N806 - torch's class

        if job_id in self._stores:  # again: a rank joined, on ``workers[-1]``
            store = self._stores[job_id][0]
            self._stores[job_id] = (store, [str(w) for w in workers])
        else:
            host = urlparse(self.scheduler.address).hostname or "127.0.0.1"
            store = TCPStore(host, 0, None, True, timedelta(seconds=60),
                             wait_for_workers=False)
            self._stores[job_id] = (store, [str(w) for w in workers])
        host = urlparse(self.scheduler.address).hostname or "127.0.0.1"
        return f"{host}:{int(store.port)}"

    def close_job(self, job_id: str) -> None:
        """Stop job ``job_id``'s store (its generations were read before)."""
        self._stores.pop(job_id, None)
        self._left.pop(job_id, None)

    def left(self, job_id: str) -> dict[str, int]:
        """How many times a worker left at each address of job ``job_id``'s ranks."""
        return dict(self._left.get(job_id, {}))

    def generations(self, job_id: str) -> list[str]:
        """Job ``job_id``'s generation records (JSON texts), oldest first."""
        entry = self._stores.get(job_id)
        if entry is None:
            return []
        return generation_texts(entry[0], MAX_GENERATIONS)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        for job_id, (store, workers) in self._stores.items():
            if worker in workers:
                left = self._left.setdefault(job_id, {})
                left[worker] = left.get(worker, 0) + 1
            for uid, w in enumerate(workers):
                if w == worker:
                    mark_dead(store, uid)
                    logger.warning("live job: rank %d's worker %s left at %.3f", uid, worker,
                                   time.time())
