"""The launcher's scheduler side: nothing of an ended job stays on the scheduler.

**A finished rank is never computed again.** A rank's task is pinned to its worker. When
that worker leaves after the rank finished (its job ended, or is ending) while a client
still holds the rank's future, Dask computes the task again to get the value back; pinned
to a worker that is gone, the task would wait in ``no-worker`` for good, and
``future.result()`` with it. A rank cannot run again outside its job anyway (its peers
are gone). :class:`JobGuard` errs such a task as soon as it reaches ``no-worker``, with a
:class:`~dask_ddp.WorkerLostError` naming the rank, its job and the worker.
(``Job.result()`` keeps the values the job's watcher read when the job ended.)

**An ended job's event topics go.** Dask keeps every event topic for the scheduler's
life (up to ``distributed.admin.low-level-log-length`` events each): a job's progress,
failure and output topics, and the one Dask makes for the rendezvous Variable's
pseudo-client, would pile up job after job. The job's cleanup asks the guard to forget
them (:data:`FORGET_HANDLER`); it does so ``dask-ddp.launch.forget-delay`` later (the
job's option, sent with the call), when the messages still in flight on the workers' and
client's streams have landed, and leaves a topic that someone still subscribes to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from dask_ddp._launch.wire.entry_points import JOB_GUARD, RUN_RANK, path_of
from dask_ddp._launch.wire.names import FORGET_HANDLER, RANK_KEY
from dask_ddp.errors import FailureKind, WorkerLostError

logger = logging.getLogger(__name__)

def lost_value_error(key: str, worker: str) -> WorkerLostError | None:
    """The error of a finished rank whose value left with ``worker`` (``None``: not a rank)."""
    match = RANK_KEY.match(key)
    if match is None:
        return None
    rank = int(match["rank"])
    return WorkerLostError(
        f"rank {rank} of job {match['name']!r} ({match['id']}) finished, but its return "
        f"value was lost with its worker {worker}, which left the cluster; a rank does not "
        "run again outside its job (Job.result() keeps the values read at the job's end)",
        rank, worker, kind=FailureKind.LOST)


class JobGuard(SchedulerPlugin):
    """Errs a finished rank's task that Dask would compute again; forgets an ended job's
    event topics (see the module).

    Only a task that left memory (its value was lost or released) and then waits in
    ``no-worker`` is touched: a rank still running whose worker leaves is the job
    watcher's to report.
    """

    name = JOB_GUARD.name
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None
        self._left_memory: set[str] = set()

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers[FORGET_HANDLER] = self.forget_topics

    def forget_topics(self, topics: list[str], delay: float) -> None:
        """Drop these event topics in ``delay`` seconds (a scheduler handler)."""
        asyncio.get_running_loop().call_later(delay, self._drop, list(topics))

    def _drop(self, topics: list[str]) -> None:
        broker = getattr(self.scheduler, "_broker", None)
        known = getattr(broker, "_topics", None)
        if not isinstance(known, dict):  # a Dask without the broker: nothing to drop
            return
        for name in topics:
            topic = known.get(name)
            if topic is not None and not getattr(topic, "subscribers", None):
                del known[name]

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "memory" and finish == "released":
            if isinstance(key, str) and RANK_KEY.match(key) and self._is_rank(key):
                self._left_memory.add(key)
        elif key in self._left_memory:
            if finish == "no-worker":
                # Not from inside the scheduler's transitions: once they are done.
                asyncio.get_running_loop().call_soon(self._err, key)
            elif finish in ("memory", "erred", "forgotten"):
                self._left_memory.discard(key)

    def _is_rank(self, key: str) -> bool:
        """Whether ``key`` is a rank's task: it runs the launcher's ``run_rank``, pinned."""
        ts = self.scheduler.tasks.get(key) if self.scheduler is not None else None
        func = getattr(getattr(ts, "run_spec", None), "func", None)
        return (ts is not None and not ts.loose_restrictions
                and path_of(func) == RUN_RANK.path)

    def _err(self, key: str) -> None:
        scheduler = self.scheduler
        ts = scheduler.tasks.get(key)
        if ts is None or ts.state != "no-worker":
            return
        self._left_memory.discard(key)
        worker = ", ".join(sorted(ts.worker_restrictions or ())) or "(unknown)"
        error = lost_value_error(key, worker)
        if error is None:  # the set holds rank keys only
            return
        from distributed.protocol import pickle

        stimulus_id = f"dask-ddp-rank-value-lost-{time.time()}"
        try:
            recommendations = scheduler.transition(
                key, "erred", stimulus_id=stimulus_id, exception=pickle.dumps(error),
                cause=key, exception_text=str(error))
            scheduler.transitions(recommendations, stimulus_id=stimulus_id)
        except Exception:
            logger.exception("dask-ddp: could not fail the lost rank task %r", key)
            return
        logger.warning("%s", error)
