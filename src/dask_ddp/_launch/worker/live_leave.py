"""A live rank leaves before its worker goes (internal).

A worker that closes (``client.retire_workers``, an adaptive scale-down, a spot notice)
asks its live ranks to leave (SIGTERM): each finishes the step it is in and leaves the
group at the top of the next one, so every step it took counts and the others go on
without it (:mod:`dask_ddp._launch.rank.live.group`). A rank dies with its worker's process, though
(its warm template and its parent watch end it), and a retired worker's process ends
soon after the scheduler removed it: the nanny closing with it (``scale_down``) gives the
worker a few seconds before killing it. Asked only by its supervisor, which looks every
``abort_poll`` seconds, a rank on a loaded host was killed mid-step before it got there.

So the worker holds its close for its live ranks: :class:`LeaveBeforeClose`, a worker
plugin whose ``teardown`` (awaited early in ``Worker.close``, while the worker, its
templates and its ranks still run) asks every live rank of the worker to leave and waits
until each has left, at most its job's ``dask-ddp.launch.leave-grace`` (under the nanny's
wait before it kills a closing worker). The supervisors register their live ranks here
(:func:`register`), each with its job's grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dask_ddp._launch.wire.entry_points import LEAVE_BEFORE_CLOSE

logger = logging.getLogger(__name__)

#: How often the wait looks whether they left.
POLL_S = 0.01

#: The live ranks of this worker process: their supervisors' processes and their jobs'
#: leave grace, by (job, rank).
_LIVE: dict[tuple[str, int], tuple[Any, float]] = {}
_lock = threading.Lock()


def register(rank: Any, grace: float) -> None:
    """Record ``rank`` (a :class:`~dask_ddp._launch.worker.rank_process.RankProcess` of a live
    job) as one to let leave before this worker closes, within ``grace`` seconds."""
    with _lock:
        _LIVE[(rank.job_id, rank.rank)] = (rank, grace)


def unregister(rank: Any) -> None:
    """Its supervisor is done with ``rank`` (it ended)."""
    key = (rank.job_id, rank.rank)
    with _lock:
        if key in _LIVE and _LIVE[key][0] is rank:
            del _LIVE[key]


def _running() -> list[tuple[Any, float]]:
    with _lock:
        return list(_LIVE.values())


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not a zombie its supervisor has yet to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def let_ranks_leave() -> list[int]:
    """Ask this worker's live ranks to leave and wait until they have, at most the
    longest of their jobs' grace; the pids of those still running then (their supervisors
    end them)."""
    ranks = _running()
    pids = [r.pid for r, _ in ranks]
    grace = max((g for _, g in ranks), default=0.0)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # the rank's handler: leave at the next step top
    deadline = time.monotonic() + grace
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    if left:
        logger.warning("live ranks (pids %s) did not leave within %g s of their worker "
                       "closing", left, grace)
    return left


class LeaveBeforeClose(WorkerPlugin):
    """Hold a closing worker until its live ranks have left (see the module)."""

    name = LEAVE_BEFORE_CLOSE.name
    idempotent = True

    async def teardown(self, worker: Any) -> None:
        if _running():
            await let_ranks_leave()
