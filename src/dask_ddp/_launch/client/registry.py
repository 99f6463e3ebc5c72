"""The jobs behind futures: :func:`dask_ddp.dispatch.job_of` (internal).

``dispatch.run`` returns a plain list of futures (dask's gather only treats exact lists as
collections), so the :class:`~dask_ddp.Job` behind them must be found from a future. Each
future a job hands out carries its job (so the job lives exactly as long as the caller
holds its futures; the job holds them only weakly, so no cycle keeps either alive), and a
table by key finds the job of another future object of the same key while the job runs.
The table holds no finished job: a job leaves it when it ends.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

_ATTR = "_dask_ddp_job"
_lock = threading.Lock()
_running: weakref.WeakValueDictionary[Any, Any] = weakref.WeakValueDictionary()


def attach(future: Any, job: Any) -> None:
    """Make ``job`` findable from ``future``, a future of its that it hands out."""
    setattr(future, _ATTR, job)


def remember(job: Any, keys: Iterable[Any]) -> None:
    """Make the running ``job`` findable by its tasks' ``keys`` (once it submitted)."""
    with _lock:
        for key in keys:
            _running[key] = job


def forget(job: Any, keys: Iterable[Any]) -> None:
    """The job ended: only the futures it handed out still lead to it."""
    with _lock:
        for key in keys:
            if _running.get(key) is job:
                del _running[key]


def running() -> list[Any]:
    """The jobs running now (one entry per job)."""
    with _lock:
        jobs = list(_running.values())
    return list({id(j): j for j in jobs}.values())


def job_of(futures: Any) -> Any:
    """The job a future (or a list of futures) belongs to, or ``None``."""
    items = futures if isinstance(futures, (list, tuple)) else [futures]
    for fut in items:
        job = getattr(fut, _ATTR, None)
        if job is None:
            with _lock:
                job = _running.get(getattr(fut, "key", None))
        if job is not None:
            return job
    return None


class Handed:
    """The futures a job hands out (its ``futures``): one per rank, each carrying the job
    (:func:`attach`), held weakly by the job so that they, not the job, decide how long it
    lives; the same objects while anyone holds them."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref[Any] | None] = []
        self._lock = threading.Lock()

    def futures(self, own: list[Any], client: Any, job: Any) -> list[Any]:
        """A future per future of ``own`` (the job's own, in rank order), for ``job``."""
        from distributed import Future

        with self._lock:
            # A live job's joining ranks add futures as it runs.
            self._refs.extend([None] * (len(own) - len(self._refs)))
            handed = []
            for rank, mine in enumerate(own):
                ref = self._refs[rank]
                fut = ref() if ref is not None else None
                if fut is None and mine.key in client.futures:
                    # Shares the state of the job's own future of the key (its status,
                    # value or error): a second reference to the same task.
                    fut = Future(mine.key, client)
                    if fut.status != mine.status:  # cancelled in between: see below
                        fut = None
                    else:
                        attach(fut, job)
                        self._refs[rank] = weakref.ref(fut)
                # Dask forgets a cancelled key's state (a new future of it would read
                # pending for good): the job's own future stands in, cancelled, holding
                # nothing on the scheduler.
                handed.append(fut if fut is not None else mine)
            return handed
