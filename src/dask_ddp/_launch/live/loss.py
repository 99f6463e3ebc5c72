"""A live rank's loss, recorded by its supervisor the moment its process is gone (internal).

The survivors of a live job re-form once a lost member is recorded dead on the job's store
(:func:`~dask_ddp._launch.live.group.mark_dead`). A rank whose process died (it left no
report: it neither returned nor raised, :mod:`dask_ddp._launch.rank_report`) is recorded
by its supervisor at once: from a thread that waits for the process's exit
(:meth:`LossRecorder.watch`), and again as the supervisor winds the rank up, before its
output and records (the survivors wait for this record, not for them). A rank whose worker
dies with its supervisor is recorded by the scheduler (:mod:`.store`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from dask_ddp._launch.live import store as live_store
from dask_ddp._launch.live.group import mark_dead
from dask_ddp._launch.rank_report import has_report

logger = logging.getLogger(__name__)


class LossRecorder:
    """Records rank ``rank`` of a live job as lost on the job's store at ``address``.

    Connects to the store at once (before the rank starts; again when a loss is recorded,
    if that failed), within ``wait`` seconds.
    """

    def __init__(self, address: str, rank: int, job_name: str, wait: float) -> None:
        self.address = address
        self.rank = rank
        self.job_name = job_name
        self.wait = wait
        self._store: Any = None
        with contextlib.suppress(Exception):  # connected again when a loss is recorded
            self._store = live_store.connect(address, wait)

    def record(self, returncode: int, workdir: str) -> bool:
        """Record the rank as lost if its process (ended with ``returncode``, -1: being
        ended) died, not returned or raised; whether it did."""
        if returncode == 0 or has_report(workdir):
            return False
        try:
            if self._store is None:
                self._store = live_store.connect(self.address, self.wait)
            mark_dead(self._store, self.rank)
        except Exception as exc:  # the survivors wait for the scheduler's notice instead
            logger.warning("rank %d of job %r: recording its loss failed: %s",
                           self.rank, self.job_name, exc)
        return True

    def watch(self, exited: threading.Event, workdir: str) -> None:
        """Record the loss the moment ``exited`` is set (the rank's process is gone)."""
        threading.Thread(target=lambda: exited.wait() and self.record(-1, workdir),
                         name=f"dask-ddp-live-loss-{self.rank}", daemon=True).start()
