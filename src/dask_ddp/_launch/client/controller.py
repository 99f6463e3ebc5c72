"""The controller of a job (internal): one per :class:`~dask_ddp._launch.client.job.Job`,
which is the handle its caller holds.

The controller owns the job's state (a :class:`~dask_ddp._states.JobState`) and its
attempts. It places and starts each :class:`~dask_ddp._launch.client.attempt.Attempt`
(raising at once when its ranks cannot all be placed); a thread of its own then waits for
the attempt to end and reads its outcome (values, or the root cause). When the attempt
failed it asks the job's recovery policy (:mod:`dask_ddp._launch.wire.policy`) once, and
starts the next attempt (``RESTART``, or ``REGROUP``: a smaller group from scratch) on the
workers available then, recording the failed one as a :class:`~dask_ddp.errors.Restart`,
or ends the job with the error. A job that may not restart (no ``max_restarts``,
``min_workers`` or ``max_workers``) is the same controller with no restart: its first
attempt's end is the job's. It holds no reference to the job: the thread that drives it
is handed the job, so nothing but the futures it hands out and, while an attempt runs,
that thread refers back to the job.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from dask_ddp._channel.reader import prepare as prepare_channel
from dask_ddp._cluster import cluster_info
from dask_ddp._dashboard import events as dashboard
from dask_ddp._launch.client.attempt import Attempt
from dask_ddp._launch.client.placement import available_workers, choose_workers, rank_layout
from dask_ddp._launch.wire.entry_points import JOB_GUARD, QUIET_RANK_FAILURES, WORKDIR_CLEANER
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._launch.wire.policy import Action, RecoveryStatus, ask
from dask_ddp._states import JobState
from dask_ddp.errors import FailureKind, GangStartError, JobError, Restart

logger = logging.getLogger(__name__)


class Controller:
    """A job's state and attempts, and the loop that decides what follows each attempt.

    Attributes
    ----------
    state : JobState
        Where the job is (the handle derives ``stalled`` from the current attempt).
    attempts : list of Attempt
        Every attempt started so far; the last is the current one.
    restarts : list of Restart
        The failed attempts so far, oldest first.
    values : list or None
        The last attempt's values once the job finished (``None``: not kept).
    error : BaseException or None
        What the job ended with, once it failed.
    done : threading.Event
        Set once the job ended (finished, failed for good or cancelled).
    changed : threading.Condition
        Notified at every change of the above.
    cancelled : bool
        Whether the job was asked to stop.
    """

    def __init__(self, client: Any, options: LaunchOptions, run_id: str, *,
                 keep_values: bool, keep_alive: Sequence[Any]) -> None:
        self.client = client
        self.options = options
        self.name = options.name
        self.max_restarts = options.max_restarts
        self.run_id = run_id
        self.keep_values = keep_values
        self.state = JobState.STARTING
        self.attempts: list[Attempt] = []
        self.restarts: list[Restart] = []
        self.values: list[Any] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.changed = threading.Condition()
        self.cancelled = False
        #: What the ranks read while they run, attempt after attempt (the collections
        #: behind the job's Tables), released as the job ends.
        self._keep_alive = list(keep_alive)
        self._preferred = list(options.workers or [])
        self._size = 0

    @property
    def current(self) -> Attempt:
        """The attempt running now (or the last one)."""
        return self.attempts[-1]

    def start(self, job: Any, workers: list[str] | None,
              attempt_id: str | None = None) -> None:
        """Place and start the next attempt (on ``workers``, else the options' choice);
        raises :class:`GangStartError` at once, with nothing left running, when its ranks
        cannot all be placed."""
        client, options = self.client, self.options
        if workers is None:
            workers = choose_workers(cluster_info(client), options.n_workers,
                                     options.workers, options.resources)
        layout = rank_layout(workers, options.nprocs_per_worker)
        attempt = Attempt(client, options, attempt_id or uuid.uuid4().hex,
                          [i["worker"] for i in layout], self.keep_values)
        prepare_channel(client, attempt.id, options.storage)
        for plugin in (WORKDIR_CLEANER, JOB_GUARD, QUIET_RANK_FAILURES):
            plugin.install(client)
        dashboard.install(client)
        try:
            dashboard.job_started(client, job_id=attempt.id, run_id=self.run_id,
                                  name=self.name, attempt=len(self.attempts),
                                  workers=attempt.workers, max_restarts=self.max_restarts)
            attempt.start(layout, len(self.attempts), self.run_id, job)
        except BaseException:
            # Interrupted (Ctrl-C) or failed before the watcher took over: nothing stays
            # running, and the page does not show the attempt "starting" for good.
            attempt.abandon(job)
            raise
        with self.changed:
            self.attempts.append(attempt)
            self._size = self._size or len(set(attempt.workers))
            self.state = JobState.RUNNING
            self.changed.notify_all()
        logger.info("job %r (%s): %d ranks on %s", self.name, attempt.id, len(layout),
                    ", ".join(workers))

    def drive(self, job: Any) -> None:
        """The controller's thread: each attempt's end, the policy's answer, the next
        attempt (``job``, held while it runs, is what the attempts' watchers hold)."""
        try:
            while True:
                attempt = self.current
                if self.cancelled:  # cancelled while the attempt was being placed
                    attempt.watcher.cancel()
                attempt.watcher.done.wait()
                try:
                    self.values = attempt.outcome()
                    self.end(JobState.DONE)
                    return
                except JobError as err:
                    record = Restart.of(len(self.attempts) - 1, err)
                    if self.cancelled:  # ranks stopped by cancel(): result() says so
                        raise concurrent.futures.CancelledError() from None
                    if self._decide(err) not in (Action.RESTART, Action.REGROUP):
                        self._fail(err, record)
                        return
                    self.restarts.append(record)
                    logger.warning("job %r: attempt %d failed (%s); restarting (%d of %d)",
                                   self.name, record.attempt, err, len(self.restarts),
                                   self.max_restarts)
                self.end(JobState.RESTARTING)
                self._restart(job)
        except concurrent.futures.CancelledError:
            self.end(JobState.CANCELLED)
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            if isinstance(exc, GangStartError):
                exc.attempts = list(self.restarts)
                exc.args = (f"{exc}\nearlier attempts of job {self.name!r}:\n"
                            f"{self._history()}",)
            else:  # not a rank's error (its metrics unread, a launcher's error)
                logger.debug("job %r ended with %s: %s", self.name, type(exc).__name__, exc)
            self.error = exc
            self.end(JobState.FAILED)
        finally:
            self._keep_alive.clear()  # the ranks read nothing more
            with self.changed:
                self.done.set()
                self.changed.notify_all()

    def end(self, state: JobState) -> None:
        with self.changed:
            self.state = state
            self.changed.notify_all()

    def _decide(self, err: JobError) -> Action:
        """The policy's answer to an attempt that ended with ``err`` (a job that may not
        restart raises without asking): ``RESTART`` (or ``REGROUP``: a smaller group,
        from scratch) starts the next; ``RAISE`` (or ``CONTINUE``: nothing runs to go on)
        ends the job."""
        if not self.options.restarting:
            return Action.RAISE
        return ask(self.options.policy, RecoveryStatus.of(
            err, restarts=len(self.restarts), max_restarts=self.max_restarts,
            min_workers=self.options.min_workers or 1))

    def _fail(self, err: JobError, record: Restart) -> None:
        if self.options.restarting:
            if self.restarts:
                err.args = (f"{err}\n(attempt {record.attempt}, after {len(self.restarts)} "
                            f"restart(s); earlier attempts of job {self.name!r}:\n"
                            f"{self._history()})",)
            err.attempts = [*self.restarts, record]
        self.error = err
        self.end(JobState.FAILED)

    def _history(self) -> str:
        return "\n".join(f"  {r}" for r in self.restarts)

    def _restart(self, job: Any) -> None:
        """Start the next attempt once enough workers are there. A worker chosen that
        leaves before its rank is placed (killed again) is waited for again, within
        ``elastic_timeout``, instead of failing the job."""
        opts = self.options
        if opts.elastic:
            target, minimum = opts.max_workers or self._size, opts.min_workers or 1
        else:
            target = minimum = self._size
        deadline = time.monotonic() + opts.elastic_timeout
        while True:
            chosen = self.wait_for_workers(minimum, target, opts.waits.restart_grace)
            try:
                self.start(job, chosen)
            except GangStartError as exc:
                if time.monotonic() >= deadline:
                    raise
                logger.warning("job %r: placing the restart failed (%s); waiting for "
                               "workers again", self.name, exc)
                continue
            self._size = len(chosen)
            return

    def wait_for_workers(self, minimum: int, target: int | None, grace: float) -> list[str]:
        """Workers for an attempt: ``target`` of them if they come within ``grace`` seconds,
        else at least ``minimum`` within ``elastic_timeout``, else GangStartError; a
        cancel raises ``CancelledError``."""
        t0 = time.monotonic()
        while True:
            if self.cancelled:
                raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
            fit = available_workers(self.client, self.options.resources, self._preferred)
            waited = time.monotonic() - t0
            if target is not None and len(fit) >= target:
                return fit[:target]
            if len(fit) >= minimum and (target is None or waited >= grace):
                return fit
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
