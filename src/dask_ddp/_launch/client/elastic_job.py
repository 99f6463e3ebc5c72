"""A job that starts again when it fails: :class:`ElasticJob`.

Each attempt is a :class:`~dask_ddp._launch.job.Job` of its own (fresh rank processes and
rendezvous), launched with the same :class:`~dask_ddp._launch.options.LaunchOptions`; a driver
thread carries out what the job's recovery policy (:mod:`dask_ddp._launch.policy`) decides
about the attempt's root cause once it failed, recording each failed attempt as a
:class:`~dask_ddp.errors.Restart`, and starts the next attempt on the workers available
then.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dask_ddp._cluster import cluster_info
from dask_ddp._launch.client import interrupt
from dask_ddp._launch.client.job import Job, launch
from dask_ddp._launch.client.placement import available_workers
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._launch.wire.policy import Action, RecoveryStatus, ask
from dask_ddp._states import JobState
from dask_ddp.errors import FailureKind, GangStartError, JobError, Restart, StallError

logger = logging.getLogger(__name__)


class ElasticJob:
    """A job that starts again when a rank fails or its worker leaves (see :func:`submit`).

    It has the API of :class:`Job`; ``futures``, ``workers``, ``world_size`` and ``id``
    are the current attempt's. Each attempt is a :class:`Job` of its own (fresh rank
    processes and rendezvous); :meth:`result` returns the last attempt's results.

    Attributes
    ----------
    restarts : list of Restart
        The failed attempts so far, oldest first.
    attempts : list of Job
        Every attempt started so far; the last is the current one.
    max_restarts : int
    run_id : str
        The ranks' ``TORCHELASTIC_RUN_ID``, the same in every attempt (as under torchrun);
        ``id`` is the current attempt's.
    """

    def __init__(self, client: Any, options: LaunchOptions, *,
                 keep_alive: Sequence[Any] = ()) -> None:
        if client.asynchronous:
            raise TypeError("dask-ddp needs a synchronous distributed.Client "
                            "(got one created with asynchronous=True)")
        self.client = client
        self.options = options
        self.name = options.name
        self.storage = options.storage
        self.output_dir = Path(options.output_dir) if options.output_dir is not None else None
        self.max_restarts = options.max_restarts
        # One run id across restarts, as torchrun's TORCHELASTIC_RUN_ID.
        self.run_id = uuid.uuid4().hex
        self.restarts: list[Restart] = []
        self.attempts: list[Job] = []
        self._preferred = list(options.workers or [])
        self._cancelled = False
        self._done = threading.Event()
        self._changed = threading.Condition()
        self._values: list[Any] | None = None
        self._error: BaseException | None = None
        #: What the ranks read while they run, attempt after attempt (see ``launch``).
        self._keep_alive = list(keep_alive)
        if options.elastic:
            first = self._start(self._wait_for_workers(minimum=options.min_workers or 1,
                                                       target=options.max_workers, grace=0.0))
        else:
            first = self._start(None)
        self._size = len(set(first.workers))
        self._driver = threading.Thread(target=self._drive, daemon=True,
                                        name=f"dask-ddp-elastic-{self.name}")
        self._driver.start()

    def __repr__(self) -> str:
        state = JobState.DONE if self._done.is_set() else JobState.RUNNING
        return (f"<ElasticJob {self.name!r} attempt={len(self.attempts) - 1} "
                f"world_size={self.world_size} restarts={len(self.restarts)} {state}>")

    # -- the current attempt ----------------------------------------------------------
    @property
    def current(self) -> Job:
        """The attempt running now (or the last one)."""
        return self.attempts[-1]

    @property
    def futures(self) -> list[Any]:
        return self.current.futures

    @property
    def workers(self) -> list[str]:
        return self.current.workers

    @property
    def world_size(self) -> int:
        return self.current.world_size

    @property
    def id(self) -> str:
        return self.current.id

    # -- public API ---------------------------------------------------------------------
    def done(self) -> bool:
        """True once the job finished, failed for good or was cancelled."""
        return self._done.is_set()

    def wait_done(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`done`; whether it is."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> list[Any]:
        """Wait for the job; each rank's return value of the last attempt, in rank order.

        Raises
        ------
        JobError
            The last attempt's root cause once the restarts ran out; ``err.attempts``
            lists every attempt's failure (:class:`Restart`), and the message tells them.
        GangStartError
            A new attempt found too few workers within ``elastic_timeout``.
        concurrent.futures.CancelledError
            The job was cancelled.
        TimeoutError
            ``timeout`` passed first; the job keeps running.
        KeyboardInterrupt
            Ctrl-C: the job was cancelled and its ranks stopped (the message says so).
        """
        try:
            done = self._done.wait(timeout)
        except KeyboardInterrupt:
            # Ctrl-C cancels the job; the frames of the interrupted wait are noise.
            raise interrupt.cancelled_by_interrupt(self) from None
        if not done:
            raise TimeoutError(f"job {self.name!r} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        if self._cancelled or self._values is None:
            raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
        return list(self._values)

    def cancel(self) -> None:
        """Stop the current attempt's ranks and start no other (an ended job is left as
        it is)."""
        if self._done.is_set():
            return
        with self._changed:
            self._cancelled = True
            current = self.current
        current.cancel()

    def stacks(self, timeout: float | None = None) -> dict[int, str]:
        """The current attempt's live rank stacks (see :meth:`Job.stacks`)."""
        return self.current.stacks(timeout)

    @property
    def stalled(self) -> StallError | None:
        """The current attempt's :class:`~dask_ddp.StallError`, if it stalled."""
        return self.current.stalled

    @property
    def generations(self) -> list[Any]:
        """The current attempt's generations (``recovery="live"``, see
        :attr:`Job.generations`)."""
        return self.current.generations

    def rank_states(self) -> dict[int, dict[str, Any]]:
        """The current attempt's rank states (see :meth:`Job.rank_states`)."""
        return self.current.rank_states()

    def metrics(self) -> Iterator[dict[str, Any]]:
        """Every attempt's metric records, attempt after attempt, live until the job ends."""
        i = 0
        while True:
            with self._changed:
                while i >= len(self.attempts) and not self._done.is_set():
                    self._changed.wait(1.0)
                if i >= len(self.attempts):
                    return
                attempt = self.attempts[i]
            # With an output folder the attempts append to one metrics.jsonl: stop at the
            # records this attempt's monitor wrote (the next attempt starts only after it
            # finished, so a record read before then is this attempt's).
            monitor, n = attempt.monitor, 0
            for record in attempt.metrics():
                if monitor is not None and monitor.finished and n >= monitor.count:
                    break
                yield record
                n += 1
            i += 1

    # -- attempts ---------------------------------------------------------------------
    def _start(self, workers: list[str] | None) -> Job:
        job = launch(self.client, self.options, workers=workers, restart=len(self.attempts),
                     run_id=self.run_id)
        with self._changed:
            self.attempts.append(job)
            self._changed.notify_all()
        return job

    def _wait_for_workers(self, minimum: int, target: int | None, grace: float) -> list[str]:
        """Workers for an attempt: ``target`` of them if they come within ``grace`` seconds,
        else at least ``minimum`` within ``elastic_timeout``, else GangStartError."""
        t0 = time.monotonic()
        while True:
            fit = available_workers(self.client, self.options.resources, self._preferred)
            waited = time.monotonic() - t0
            if target is not None and len(fit) >= target:
                return fit[:target]
            if len(fit) >= minimum and (target is None or waited >= grace):
                return fit
            if self._cancelled:
                raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
            timeout, resources = self.options.elastic_timeout, self.options.resources
            if waited >= timeout:
                raise GangStartError(
                    f"job {self.name!r} needs at least {minimum} workers"
                    + (f" with resources {dict(resources)}" if resources else "")
                    + f"; {len(fit)} were available after waiting {timeout:g} s"
                    + self._missing(fit))
            time.sleep(self.options.waits.worker_poll)

    def _missing(self, fit: list[str]) -> str:
        """Which workers of the last attempt are missing now, and why (for an error)."""
        if not self.attempts:
            return ""
        try:
            known = dict(cluster_info(self.client).get("workers", {}))
        except Exception:
            known = {}
        lost = {r.worker for r in self.restarts if r.kind == FailureKind.LOST}
        why = []
        for w in sorted(set(self.current.workers) - set(fit)):
            if w in known:
                status = known[w].get("status", "?")
                why.append(f"{w} (status {status}: it cannot take a rank)")
            elif w in lost:
                why.append(f"{w} (it died during an attempt and no worker came back in "
                           "its place: its nanny is gone too, or did not restart it because "
                           "it died twice within distributed.deploy.lost-worker-timeout)")
            else:
                why.append(f"{w} (it left the cluster)")
        return "; missing: " + ", ".join(why) if why else ""

    def _history(self) -> str:
        return "\n".join(f"  {r}" for r in self.restarts)

    def _drive(self) -> None:
        try:
            while True:
                attempt = self.current
                try:
                    self._values = attempt.result()
                    return
                except concurrent.futures.CancelledError:
                    self._cancelled = True
                    return
                except JobError as err:
                    record = Restart.of(len(self.attempts) - 1, err)
                    if self._cancelled:  # ranks stopped by cancel(): result() says so
                        return
                    if self._decide(err) in (Action.RAISE, Action.CONTINUE):
                        self._fail(err, record)
                        return
                    self.restarts.append(record)
                    logger.warning("job %r: attempt %d failed (%s); restarting (%d of %d)",
                                   self.name, record.attempt, err, len(self.restarts),
                                   self.max_restarts)
                try:
                    if self.options.elastic:
                        target = self.options.max_workers or self._size
                        minimum = self.options.min_workers or 1
                    else:
                        target = minimum = self._size
                    self._restart(minimum, target)
                except concurrent.futures.CancelledError:
                    return
                except GangStartError as exc:
                    exc.attempts = list(self.restarts)
                    exc.args = (f"{exc}\nearlier attempts of job {self.name!r}:\n"
                                f"{self._history()}",)
                    self._error = exc
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            logger.exception("restarting job %r failed", self.name)
            self._error = exc
        finally:
            self._keep_alive.clear()
            with self._changed:
                self._done.set()
                self._changed.notify_all()

    def _decide(self, err: JobError) -> Action:
        """The policy's answer to an attempt that ended with ``err``: ``RESTART`` (or
        ``REGROUP``: a smaller group, from scratch) starts the next; ``RAISE`` (or
        ``CONTINUE``: nothing runs to go on) ends the job."""
        return ask(self.options.policy, RecoveryStatus.of(
            err, restarts=len(self.restarts), max_restarts=self.max_restarts,
            min_workers=self.options.min_workers or 1))

    def _restart(self, minimum: int, target: int | None) -> None:
        """Start the next attempt once enough workers are there. A worker chosen that
        leaves before its rank is placed (killed again) is waited for again, within
        ``elastic_timeout``, instead of failing the job."""
        deadline = time.monotonic() + self.options.elastic_timeout
        while True:
            chosen = self._wait_for_workers(minimum, target, self.options.waits.restart_grace)
            with self._changed:
                if self._cancelled:
                    raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
            try:
                self._start(chosen)
            except GangStartError as exc:
                if time.monotonic() >= deadline:
                    raise
                logger.warning("job %r: placing the restart failed (%s); waiting for "
                               "workers again", self.name, exc)
                continue
            self._size = len(chosen)
            return

    def _fail(self, err: JobError, record: Restart) -> None:
        if self.restarts:
            err.args = (f"{err}\n(attempt {record.attempt}, after {len(self.restarts)} "
                        f"restart(s); earlier attempts of job {self.name!r}:\n"
                        f"{self._history()})",)
        err.attempts = [*self.restarts, record]
        self._error = err
