"""One line per rank failure: the worker's "Compute Failed" log of a rank task dropped
(internal).

A failed rank reaches the client as one error naming the rank, its worker and its
traceback; Dask's worker also logs every failed task as a "Compute Failed" block with an
escaped repr of the same error, one per rank. :class:`QuietRankFailures`, a worker plugin
the launcher registers, filters those blocks for dask-ddp's rank tasks only (their keys
match :data:`~dask_ddp._launch.wire.names.RANK_KEY`); every other task's failure is
logged as before.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dask_ddp._launch.wire.entry_points import QUIET_RANK_FAILURES
from dask_ddp._launch.wire.names import RANK_KEY

#: The logger of Dask's worker that writes "Compute Failed".
WORKER_LOGGER = "distributed.worker"


class RankFailureFilter(logging.Filter):
    """Drops "Compute Failed" records whose task key is a rank's."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Compute Failed") or not record.args:
            return True
        key = record.args[0] if isinstance(record.args, tuple) else None
        return not (isinstance(key, str) and RANK_KEY.match(key))


class QuietRankFailures(WorkerPlugin):
    """Installs :class:`RankFailureFilter` in each worker (idempotent, by name)."""

    name = QUIET_RANK_FAILURES.name
    idempotent = True

    def setup(self, worker: Any) -> None:
        log = logging.getLogger(WORKER_LOGGER)
        if not any(isinstance(f, RankFailureFilter) for f in log.filters):
            log.addFilter(RankFailureFilter())
