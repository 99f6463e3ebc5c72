"""What the launcher tells the job pages: a job started, its state changed, it stalled.

Each call is one message to the scheduler's dashboard extension, sent from a client or
a worker (``via``), from any thread: from the thread running ``via``'s event loop it is
sent in the background, from any other thread it waits up to :data:`SEND_TIMEOUT_S` for
the scheduler. None of them raises: the pages are best effort and never fail a job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dask_ddp._states import JobState

logger = logging.getLogger(__name__)

SEND_TIMEOUT_S = 5.0
_background: set[asyncio.Task[Any]] = set()


def install(client: Any) -> None:
    """Put the job pages on ``client``'s scheduler (idempotent: one cheap round trip)."""
    from dask_ddp._dashboard.extension import DashboardPlugin

    try:
        client.register_plugin(DashboardPlugin())
    except Exception:
        logger.warning("dask-ddp dashboard: could not install the job pages on the "
                       "scheduler", exc_info=True)


def job_started(client: Any, *, job_id: str, run_id: str, name: str, attempt: int,
                workers: Sequence[str], max_restarts: int = 0) -> None:
    """Attempt ``attempt`` of the job ``run_id`` (a plain job: its own id) started on
    ``workers`` (one per rank, in rank order)."""
    send(client, job_id, {"kind": "started", "run_id": run_id, "name": name,
                          "attempt": attempt, "workers": list(workers),
                          "world_size": len(workers), "max_restarts": max_restarts,
                          "time": time.time()})


def job_state(via: Any, job_id: str, state: JobState | str, **fields: Any) -> None:
    """The attempt ``job_id`` is now ``state``: running, done, failed or cancelled (see
    :func:`job_stalled` for stalled). A failure's root cause comes from the rank's failure
    record, which the extension reads itself. The event carries the state's value."""
    send(via, job_id, {"kind": "state", "state": str(state), "time": time.time(), **fields})


def job_generation(via: Any, job_id: str, generation: Mapping[str, Any]) -> None:
    """A live job's group changed: ``generation`` has ``generation`` (1, 2, ...),
    ``time``, ``cause``, ``lost`` and ``joined`` (first ranks), ``world_size``, ``step``
    and ``recovery_s``; the page lists them and shows the new world size."""
    send(via, job_id, {"kind": "generation", **{k: generation[k] for k in (
        "generation", "time", "cause", "lost", "joined", "world_size", "step",
        "recovery_s")}})


def job_stalled(via: Any, job_id: str, ranks: Sequence[int], collective: str,
                stacks: Mapping[int, str]) -> None:
    """The attempt ``job_id`` stalled: ``ranks`` are blocked in ``collective`` (e.g.
    ``"all_reduce"``); ``stacks`` maps a rank to its Python stack (text).

    The page then flags the job and these ranks "stalled" and shows the collective and
    the stacks; a later ``job_state(via, job_id, "running")`` clears it, and the job's end
    (``done``/``failed``/``cancelled``) replaces it.

    Parameters
    ----------
    via
        A ``distributed.Client`` or ``distributed.Worker`` connected to the job's scheduler.
    """
    send(via, job_id, {"kind": "state", "state": JobState.STALLED.value,
                       "ranks": [int(r) for r in ranks],
                       "collective": str(collective),
                       "stacks": {str(int(r)): str(s) for r, s in stacks.items()},
                       "time": time.time()})


def send(via: Any, job_id: str, event: dict[str, Any]) -> None:
    """One event to the extension through ``via`` (a Client or a Worker); never raises."""
    try:
        loop = via.loop.asyncio_loop
        coro = via.scheduler.dask_ddp_dashboard_job(job_id=job_id, event=event)
    except Exception:
        logger.debug("dask-ddp dashboard: no scheduler to tell about %s", job_id, exc_info=True)
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None and running is loop:
        task = running.create_task(_quiet(coro, job_id))
        _background.add(task)
        task.add_done_callback(_background.discard)
        return
    try:
        fut = asyncio.run_coroutine_threadsafe(_quiet(coro, job_id), loop)
    except RuntimeError:  # the loop is closed
        coro.close()
        return
    try:
        fut.result(SEND_TIMEOUT_S)
    except Exception:
        fut.cancel()
        logger.debug("dask-ddp dashboard: event for %s not sent in time", job_id)


async def _quiet(coro: Any, job_id: str) -> None:
    try:
        await asyncio.wait_for(coro, SEND_TIMEOUT_S)
    except Exception:
        logger.debug("dask-ddp dashboard: event for %s not sent", job_id, exc_info=True)
