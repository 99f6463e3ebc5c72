"""Ctrl-C while the client waits for a job: the job is cancelled (internal).

:meth:`~dask_ddp.Job.result` catches ``KeyboardInterrupt``, cancels the job, waits a
bounded time until its rank processes are gone on their workers, and raises a
``KeyboardInterrupt`` that says so once ("job 'train' cancelled (Ctrl-C); ranks
stopped"), without the ``threading`` frames the interrupted wait would show.

A cancelled job's rank processes are killed with records maybe still in their pipes, so
their results streams end without an end marker: :class:`CancelledStreams` keeps the
reader's "its worker may have died" warning for the streams of jobs that were not
cancelled (no worker died).

At the interpreter's exit, the tasks of the jobs whose values were returned are released
(:func:`release_at_exit`): no alarm after a success when a script ends without closing
its cluster.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import threading
import time
import weakref
from typing import Any

from dask_ddp._launch.wire.entry_points import LIVE_RANKS

logger = logging.getLogger(__name__)

#: Jobs cancelled in this process, newest last (bounded: an old id matters no more).
_cancelled: collections.deque[str] = collections.deque(maxlen=256)
_lock = threading.Lock()
_installed = False
_READER_LOGGER = "dask_ddp._channel.reader"


class CancelledStreams(logging.Filter):
    """Drops the reader's "no end marker" warning for a cancelled job's topic."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "has no end marker" not in str(record.msg) or not record.args:
            return True
        topic = record.args[0] if isinstance(record.args, tuple) else None
        with _lock:
            return not any(str(topic).endswith(job_id) for job_id in _cancelled)


def mark_cancelled(job_id: str) -> None:
    """The job ``job_id`` is being cancelled: its streams' missing end markers are expected."""
    global _installed
    with _lock:
        _cancelled.append(job_id)
        if not _installed:
            logging.getLogger(_READER_LOGGER).addFilter(CancelledStreams())
            _installed = True


def wait_ranks_gone(client: Any, job_id: str, workers: list[str], timeout: float,
                    poll: float = 0.25) -> bool:
    """Wait up to ``timeout`` seconds until no worker runs a rank process of the job."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            counts = client.run(LIVE_RANKS, job_id, workers=sorted(set(workers)),
                                on_error="return", wait=True)
            if all(c == 0 for c in counts.values() if isinstance(c, int)):
                return True
        except Exception as exc:  # the workers may be gone with their ranks
            logger.debug("reading the ranks of job %s: %s", job_id, exc)
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def cancelled_by_interrupt(job: Any) -> KeyboardInterrupt:
    """Cancel ``job`` after a Ctrl-C; the ``KeyboardInterrupt`` to raise in its place."""
    waits = job.options.waits
    try:
        job.cancel()
        # The supervisors see the abort within a poll and give each rank term_grace.
        bound = waits.abort_poll + waits.term_grace + 5.0
        job.wait_done(bound)
        stopped = wait_ranks_gone(job.client, job.id, job.workers, bound)
    except Exception as exc:
        logger.debug("cancelling job %r after Ctrl-C: %s", job.name, exc)
        stopped = False
    how = "ranks stopped" if stopped else "its ranks are still being stopped"
    message = f"job {job.name!r} cancelled (Ctrl-C); {how}"
    logger.info("%s", message)
    return KeyboardInterrupt(message)


# -- a successful script's exit ----------------------------------------------------------
#: Jobs whose values result() returned; their tasks are released at the interpreter's exit.
_returned: weakref.WeakSet[Any] = weakref.WeakSet()
_exit_hook = False
#: How long the exit waits for the scheduler to forget the released tasks.
RELEASE_WAIT_S = 2.0


def release_at_exit(job: Any) -> None:
    """``job``'s values were returned: at the interpreter's exit its tasks are released
    before Dask closes the cluster (registered after Dask's own exit handlers, so it runs
    before them). A script that ends without closing its cluster otherwise makes the
    scheduler warn that it loses computed tasks and the launcher report each rank's value
    lost with its worker: an alarm after a success."""
    global _exit_hook
    with _lock:
        _returned.add(job)
        if not _exit_hook:
            atexit.register(_release_returned)
            _exit_hook = True


def _release_returned() -> None:
    for job in list(_returned):
        futures = [f for f in job.watcher.futures if f.status == "finished"]
        if not futures or job.client.status not in ("running", "connecting"):
            continue
        keys = [f.key for f in futures]
        for fut in futures:
            fut.release()
        deadline = time.monotonic() + RELEASE_WAIT_S
        with contextlib.suppress(Exception):
            while time.monotonic() < deadline:
                held = job.client.sync(job.client.scheduler.who_has, keys=keys,
                                       callback_timeout=RELEASE_WAIT_S)
                if not any(held.get(k) for k in keys):
                    break
                time.sleep(0.05)
