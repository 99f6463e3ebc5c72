"""The jobs behind futures: :func:`dask_ddp.dispatch.job_of` (internal).

``dispatch.run`` returns a plain list of futures (dask's gather only treats exact lists as
collections), so the :class:`~dask_ddp.Job` behind them must be found from a future. Each
future of a job carries its job (so the job lives exactly as long as the caller holds its
futures), and a table by key finds the job of another future object of the same key while
the job runs. The table holds no finished job: a job leaves it when it ends.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_ATTR = "_dask_ddp_job"
_lock = threading.Lock()
_running: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def remember(job: Any) -> None:
    """Make ``job`` findable from its futures (the launcher calls this once it submitted)."""
    with _lock:
        for fut in job.futures:
            setattr(fut, _ATTR, job)
            _running[fut.key] = job


def forget(job: Any) -> None:
    """The job ended: only the futures the caller holds still lead to it."""
    with _lock:
        for fut in job.futures:
            if _running.get(fut.key) is job:
                del _running[fut.key]


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
                job = _running.get(getattr(fut, "key", None))  # type: ignore[arg-type]
        if job is not None:
            return job
    return None
