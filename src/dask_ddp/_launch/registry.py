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
