"""Metric records whose values are not ready yet, written in call order (internal).

``report()`` of a CUDA tensor must not wait for the GPU: the value is copied to pinned
host memory without blocking and read once the copy's CUDA event has completed. Until
then its record waits here, and so does every record reported after it in this process,
so that records reach the results channel in call order.

A waiting record is written as soon as its value is ready: by the next ``report()``
(which first writes the ready head of the queue), by a background poller (every
:data:`POLL_S` while something waits), and at the flush points, which wait for every
value: :func:`flush_pending`, called by a checkpoint save, a Loader's end of epoch and
this process's exit (an ``atexit`` handler, run by the rank's own exit path).

Loss: a rank killed before a value was ready (SIGKILL, or the launcher's SIGTERM when the
job stops) loses the records still waiting here, and only those; every record written
before it stays exactly-once.

This module imports nothing of ``dask_ddp`` and not torch, so the data and checkpoint
layers can call :func:`flush_pending`; :mod:`dask_ddp.results` puts the records in.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

logger = logging.getLogger(__name__)

#: Seconds between the poller's looks at the head of the queue while a record waits.
POLL_S = 0.01
#: At the process's exit, how long to wait for the values still pending (seconds): a GPU
#: that never finishes (a hung collective) must not keep a finished rank alive.
EXIT_WAIT_S = 60.0


class Deferred(Protocol):
    """A record whose payload can be made once :meth:`ready` says so."""

    def ready(self) -> bool:
        """Whether every value of the record can be read without waiting."""
        ...

    def payload(self) -> bytes:
        """The record's bytes (called once, after :meth:`ready` returned True)."""
        ...


#: Writes one record to its channel (``functools.partial(write, topic)``).
Writer = Callable[[bytes], None]


class _Queue:
    """This process's waiting records (a forked child makes its own)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()  # held while writing: the writes keep the call order
        self.changed = threading.Condition(self.lock)
        self.items: collections.deque[tuple[bytes | Deferred, Writer]] = collections.deque()
        self.poller: threading.Thread | None = None
        self.lost = 0

    def put(self, item: bytes | Deferred, write: Writer) -> None:
        with self.lock:
            self._drain()
            if not self.items and isinstance(item, bytes):
                write(item)  # the common case: nothing waits, written before returning
                return
            self.items.append((item, write))
            if self.poller is None:
                self.poller = threading.Thread(target=self._poll, daemon=True,
                                               name="dask-ddp-pending-metrics")
                self.poller.start()
            self.changed.notify()

    def _drain(self) -> None:
        """Write the ready head of the queue, in order (the lock is held)."""
        items = self.items
        while items:
            item, write = items[0]
            if isinstance(item, bytes):
                data = item
            else:
                try:
                    if not item.ready():
                        return
                    data = item.payload()
                except Exception as exc:  # noqa: BLE001 - e.g. a CUDA error: this record only
                    items.popleft()
                    self.lost += 1
                    logger.error("a metric record is dropped: its value could not be read "
                                 "(%s: %s)", type(exc).__name__, exc)
                    continue
                items[0] = (data, write)  # read once, even if the write below fails
            write(data)
            items.popleft()

    def _poll(self) -> None:
        try:
            with self.lock:
                while True:
                    while not self.items:
                        self.changed.wait()
                    self._drain()
                    if self.items:
                        self.changed.wait(POLL_S)
        except Exception as exc:  # noqa: BLE001 - report() and the flushes write from now on
            logger.warning("the pending metrics poller stopped: %s: %s",
                           type(exc).__name__, exc)

    def flush(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0002
        while True:
            with self.lock:
                self._drain()
                if not self.items:
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(2 * delay, 0.005)

    def waiting(self) -> int:
        with self.lock:
            return len(self.items)


_queue: _Queue | None = None
_queue_lock = threading.Lock()
_exit_hook = False


def _this_queue() -> _Queue:
    global _queue, _queue_lock, _exit_hook
    q = _queue
    if q is not None and q.pid == os.getpid():
        return q
    if q is not None:  # forked: the parent's records are the parent's to write
        _queue_lock = threading.Lock()
    with _queue_lock:
        if _queue is None or _queue.pid != os.getpid():
            _queue = _Queue()
            if not _exit_hook:
                _exit_hook = True
                atexit.register(_flush_at_exit)
        return _queue


def put(item: bytes | Deferred, write: Writer) -> None:
    """Write ``item`` with ``write`` after every record put before it in this process:
    now when nothing waits and it is bytes, else once it and those before it are ready.

    Raises what ``write`` raises when it writes in this call (a closed channel).
    """
    _this_queue().put(item, write)


def flush_pending(timeout: float | None = None) -> bool:
    """Write every metric record this process reported that is still waiting for its
    value (a CUDA tensor whose copy to the host had not finished), waiting for them.

    Called at a checkpoint save, at a Loader's end of epoch and at the rank's exit; call
    it yourself before anything that must see the metrics reported so far. Costs nothing
    when no record waits; otherwise it waits for the GPU to reach the last reported value
    (not for the whole device).

    Parameters
    ----------
    timeout
        Seconds to wait at most; ``None``: until every record is written.

    Returns
    -------
    bool
        True when no record waits any more; False when ``timeout`` passed first (those
        records stay queued and are written later).

    Raises
    ------
    RuntimeError
        The results channel is closed (as :func:`dask_ddp.report` raises it).
    """
    q = _queue
    if q is None or q.pid != os.getpid():
        return True
    return q.flush(timeout)


def waiting() -> int:
    """How many records of this process wait (for tests and logs)."""
    q = _queue
    return 0 if q is None or q.pid != os.getpid() else q.waiting()


def _flush_at_exit() -> None:
    q = _queue
    if q is None or q.pid != os.getpid():
        return
    try:
        done = q.flush(EXIT_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - the exit goes on
        logger.error("metric records not written at exit: %s: %s", type(exc).__name__, exc)
        return
    if not done:
        logger.error("%d metric record(s) lost at exit: their values were not ready "
                     "within %g s", q.waiting(), EXIT_WAIT_S)
