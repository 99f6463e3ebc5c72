"""A job launched on Dask: :class:`Job`, the handle its caller holds and the controller of
its attempts (public as :class:`dask_ddp.Job` and :class:`dask_ddp.ElasticJob`).

A job runs in attempts. An :class:`Attempt` is one placement of the ranks (fresh rank
processes and rendezvous): the client places them (raising at once when they cannot all be
placed) and builds their specs; the attempt's :class:`~dask_ddp._launch.client.watcher.Watcher`
submits them and watches them on the client's event loop, asking the job's recovery policy
(:mod:`dask_ddp._launch.wire.policy`) about each lost worker and stall while the attempt runs.

The job's controller, a thread of its own, owns the job's state (a
:class:`~dask_ddp._states.JobState`): it waits for the attempt to end and reads its outcome
(values, or the root cause); when the attempt failed it asks the policy once, and starts
the next attempt (``RESTART``, or ``REGROUP``: a smaller group from scratch) on the workers
available then, recording the failed one as a :class:`~dask_ddp.errors.Restart`, or ends
the job with the error. A job that may not restart (no ``max_restarts``, ``min_workers``
or ``max_workers``) is the same controller with no restart: its first attempt's end is
the job's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dask_ddp._channel.monitor import JobMonitor
from dask_ddp._channel.reader import prepare as prepare_channel
from dask_ddp._cluster import cluster_info
from dask_ddp._dashboard import events as dashboard
from dask_ddp._launch.client import interrupt, payload, recovery, registry, stall, summary
from dask_ddp._launch.client.output import RankOutput
from dask_ddp._launch.client.placement import (
    available_workers,
    choose_workers,
    rank_layout,
    rank_specs,
)
from dask_ddp._launch.client.watcher import Watcher, gather_values
from dask_ddp._launch.wire.entry_points import JOB_GUARD, QUIET_RANK_FAILURES, WORKDIR_CLEANER
from dask_ddp._launch.wire.live_records import Generation
from dask_ddp._launch.wire.names import output_topic, progress_topic
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._launch.wire.policy import Action, RecoveryStatus, ask
from dask_ddp._states import JobState
from dask_ddp.errors import FailureKind, GangStartError, JobError, Restart, StallError

logger = logging.getLogger(__name__)


class Attempt:
    """One attempt of a job: its ranks' tasks, their watcher, output and metrics.

    Attributes
    ----------
    id : str
        The attempt's id (hex): its tasks' keys, topics and page carry it.
    watcher : Watcher
        The attempt's rank tasks and what the watch loop found about them.
    monitor : JobMonitor or None
        The reader of the attempt's metric records.
    start_time : float
        When the attempt was launched (``time.time()``).
    """

    def __init__(self, client: Any, options: LaunchOptions, attempt_id: str,
                 workers: list[str], keep_values: bool) -> None:
        self.client = client
        self.options = options
        self.id = attempt_id
        self.start_time = time.time()
        self.monitor: JobMonitor | None = None
        #: The futures handed out, each leading to the job; held weakly.
        self._handed = registry.Handed()
        #: The ranks' states as last read by :meth:`rank_states`.
        self._states: dict[int, Any] = {}
        self._output = RankOutput()
        self.watcher = Watcher(client, options, attempt_id, workers, keep_values=keep_values)

    @property
    def workers(self) -> list[str]:
        """The worker address of every rank, in rank order."""
        return self.watcher.workers

    @property
    def world_size(self) -> int:
        """The number of ranks (a live job's joining ranks included)."""
        return len(self.watcher.workers)

    @property
    def futures(self) -> list[Any]:
        """The attempt's own rank futures, in rank order."""
        return self.watcher.futures

    def handed(self, job: Any) -> list[Any]:
        """One future per rank, in rank order, each leading back to ``job``."""
        return self._handed.futures(self.watcher.futures, self.client, job)

    def start(self, layout: list[dict[str, Any]], restart: int, run_id: str,
              job: Any) -> None:
        """Build the ranks' specs from their ``layout``, submit them and watch them (the
        watch loop holds ``job`` until the attempt ends). On an error the caller
        abandons the attempt (:meth:`abandon`)."""
        machinery = recovery.for_job(self.client, self.options, self.id, self.options.name,
                                     self.workers)
        self.watcher.set_recovery(machinery)
        options = self.options
        # The ranks' specs carry the job's options whole, and a live job's store.
        specs = rank_specs(options, layout, self.workers, job_id=self.id, run_id=run_id,
                           restart=restart, scheduler=self.client.scheduler.address,
                           live_store=machinery.live_store)
        res = options.resources
        if options.stream_output:
            # Subscribe before submitting, so no early line is missed.
            self.client.subscribe_topic(output_topic(self.id), self._output.handler())
        self.watcher.start(
            specs, [dict(res) if res and i["proc_index"] == 0 else None for i in layout], job)
        self.monitor = JobMonitor(self.client, self.id, self.watcher.futures,
                                  name=options.name, output_dir=options.output_dir,
                                  progress=options.progress)
        self.watcher.watch(job)

    def abandon(self, job: Any) -> None:
        """A launch failed part-way: stop the ranks submitted so far and release them."""
        if not self.watcher.done.is_set():
            self.watcher.abandon(job)

    def outcome(self) -> list[Any] | None:
        """The ended attempt's values (``None`` where the watcher does not keep them:
        the caller gathers them); raises ``CancelledError`` when it was cancelled, else
        its root cause, or an error of its metrics' reading."""
        try:
            self._wait_output_eof(self.options.waits.output_eof)
            if self.watcher.cancelled:
                raise concurrent.futures.CancelledError(
                    f"job {self.options.name!r} was cancelled")
            error = self.root_error()
            if error is not None:
                raise error
            values = self.watcher.values
            if values is None and self.watcher.keep_values:
                values = gather_values(self.client, self.futures, self.workers,
                                       self.options.name)
        except BaseException:
            # The attempt's own error wins over a failure to collect its metrics.
            try:
                self._stop_monitor()
            except Exception:
                logger.exception("collecting the metrics of failed job %r failed",
                                 self.options.name)
            raise
        self._stop_monitor()
        return values

    def _stop_monitor(self) -> None:
        # The monitor stays attached: metrics() reads its records after the attempt.
        if self.monitor is not None:
            self.monitor.stop()

    def _wait_output_eof(self, timeout: float) -> None:
        if self.options.stream_output:
            # A rank whose worker died sends no end-of-output mark.
            self._output.finish(self.client, output_topic(self.id), self.watcher.forget_topics,
                                set(range(self.world_size)) - set(self.watcher.lost), timeout)

    def root_error(self) -> BaseException | None:
        """The error naming the attempt's root cause, or ``None`` while no rank failed."""
        root = self.watcher.root_cause()
        if isinstance(root, JobError) and self.options.sources:
            payload.name_sources(root, self.options.sources)
        return root

    def stacks(self, timeout: float | None) -> dict[int, str]:
        """The running ranks' live stacks (see :meth:`Job.stacks`)."""
        wait = self.options.waits.stacks_timeout if timeout is None else timeout
        return dict(self.client.sync(self.watcher.read_stacks, wait,
                                     callback_timeout=wait + 10))

    def rank_states(self) -> dict[int, dict[str, Any]]:
        """Every rank's state (see :meth:`Job.rank_states`)."""
        # The watcher's states stand in when none can be read (or the attempt ended).
        read = self.watcher.states
        if not self.watcher.done.is_set():
            with contextlib.suppress(Exception):
                events = self.client.sync(
                    self.client.scheduler.events, topic=progress_topic(self.id),
                    callback_timeout=self.options.waits.scheduler_call)
                self._states = read = dict(stall.latest_states(events))
        if self._states and not read:
            read = self._states  # the last states read here
        return stall.rank_table(read, [f.status for f in self.futures], self.workers,
                                self.start_time)

    def generations(self) -> list[Generation]:
        """The attempt's membership changes so far (see :attr:`Job.generations`)."""
        rec = self.watcher.recovery
        if self.watcher.done.is_set():
            return list(rec.generations)
        return list(self.client.sync(rec.read_generations,
                                     callback_timeout=self.options.waits.scheduler_call))


class Job:
    """A DDP job on Dask (see :func:`~dask_ddp.dispatch.submit`): its ranks, its outcome,
    and the means to stop it. A job that may restart (``max_restarts``, ``min_workers`` or
    ``max_workers``) is an :class:`ElasticJob`, this class under its own name.

    The rank attributes (``id``, ``futures``, ``workers``, ``world_size``) are the current
    attempt's; :meth:`result` returns the last attempt's values.

    Attributes
    ----------
    client : distributed.Client
    id : str
        The current attempt's id (hex).
    name : str
        The job's name; the Dask dashboard shows the rank tasks under it.
    futures : list of distributed.Future
        One per rank, in rank order; each leads back to the job
        (:func:`~dask_ddp.dispatch.job_of`). The same objects while anyone holds them.
    world_size : int
    workers : list of str
        The worker address of every rank, in rank order.
    storage : str or None
        The job's storage URL (checkpoints, results), when given.
    output_dir : pathlib.Path or None
        Where the client writes the job's results, when given.
    state : JobState
        Where the job is (see :attr:`state`).
    restarts : list of Restart
        The failed attempts so far, oldest first (empty for a job that does not restart).
    attempts : list of Attempt
        Every attempt started so far (its ``id``, ``workers``, ``futures``); the last is
        the current one.
    max_restarts : int
    run_id : str
        The ranks' ``TORCHELASTIC_RUN_ID``, the same in every attempt (as under torchrun);
        a job that does not restart: its ``id``.
    watcher : Watcher
        The current attempt's rank tasks and what the watch loop found about them (its
        own futures, lost workers, stall, values; see :mod:`dask_ddp._launch.client.watcher`).

    :func:`~dask_ddp.dispatch.submit`, :func:`~dask_ddp.dispatch.run` and
    :func:`~dask_ddp.dispatch.run_command` make jobs: ``job_id`` and ``workers`` are the
    first attempt's (default: a new id, the options' choice); ``keep_values=False``: the
    ranks' values stay in their futures; ``keep_alive``: what the job holds until its end.

    Nothing refers back to the job but the futures it hands out and, while an attempt
    runs, its controller: the job holds its tasks' own futures, and those it hands out
    (which lead to it) only weakly, so it and its tasks go as soon as nobody holds the job
    or a future of it once it ended (no reference cycle waits for Python's garbage
    collector).
    """

    def __init__(self, client: Any, options: LaunchOptions, job_id: str | None = None,
                 workers: list[str] | None = None, *, keep_values: bool = True,
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
        #: When the job was launched (``time.time()``).
        self.start_time = time.time()
        #: The ranks' return values, read by the watcher as an attempt ends (a worker that
        #: dies afterwards cannot take them along), when ``keep_values`` (``dispatch.run``
        #: hands the futures to its user instead: a large value would cross twice).
        self.keep_values = keep_values
        self.restarts: list[Restart] = []
        self.attempts: list[Attempt] = []
        first_id = job_id or uuid.uuid4().hex
        # One run id across restarts, as torchrun's TORCHELASTIC_RUN_ID.
        self.run_id = uuid.uuid4().hex if options.restarting else first_id
        self._state = JobState.STARTING
        self._changed = threading.Condition()
        self._done = threading.Event()
        self._cancelled = False
        self._values: list[Any] | None = None
        self._error: BaseException | None = None
        #: What the ranks read while they run, attempt after attempt (the collections
        #: behind the job's Tables), released as the job ends.
        self._keep_alive = list(keep_alive)
        self._preferred = list(options.workers or [])
        if workers is None and options.elastic:
            workers = self._wait_for_workers(minimum=options.min_workers or 1,
                                             target=options.max_workers, grace=0.0)
        self._start(workers, first_id)
        self._size = len(set(self.workers))
        self._driver = threading.Thread(target=self._drive, daemon=True,
                                        name=f"dask-ddp-job-{self.name}")
        self._driver.start()

    def __repr__(self) -> str:
        again = (f" attempt={len(self.attempts) - 1} restarts={len(self.restarts)}"
                 if self.options.restarting else "")
        return (f"<{type(self).__name__} {self.name!r} id={self.id[:8]} {self.state} "
                f"world_size={self.world_size} ranks_finished={self._ranks_finished()}{again}>")

    def _repr_html_(self) -> str:
        """The job in a notebook (as Dask's Client and Cluster show themselves)."""
        return summary.job_html(self, self._ranks_finished(), self.page_link)

    def _ranks_finished(self) -> int:
        return sum(f.status == "finished" for f in self.current.futures)

    # -- the current attempt ----------------------------------------------------------
    @property
    def current(self) -> Attempt:
        """The attempt running now (or the last one)."""
        return self.attempts[-1]

    @property
    def id(self) -> str:
        return self.current.id

    @property
    def watcher(self) -> Watcher:
        return self.current.watcher

    @property
    def workers(self) -> list[str]:
        """The worker address of every rank, in rank order."""
        return self.current.workers

    @property
    def world_size(self) -> int:
        """The number of ranks (a live job's joining ranks included)."""
        return self.current.world_size

    @property
    def futures(self) -> list[Any]:
        """One future per rank, in rank order, each leading back to the job."""
        return self.current.handed(self)

    @property
    def monitor(self) -> Any:
        """The :class:`~dask_ddp.results.JobMonitor` reading the current attempt's metrics."""
        return self.current.monitor

    @property
    def state(self) -> JobState:
        """The job's state: ``starting``, ``running`` (``stalled`` once a stall ends the
        attempt), ``restarting`` (an attempt failed and the policy restarts the job), then
        ``done``, ``failed`` or ``cancelled`` (:meth:`done`)."""
        state = self._state
        if state is JobState.RUNNING and self.current.watcher.stall is not None:
            return JobState.STALLED
        return state

    @property
    def page_link(self) -> str | None:
        """The URL of the job's page on the Dask dashboard (``None`` without one)."""
        return summary.page_link(self.client, self.run_id)

    @property
    def stalled(self) -> StallError | None:
        """The :class:`~dask_ddp.StallError` that ended the current attempt, if it stalled."""
        return self.current.watcher.stall

    @property
    def generations(self) -> list[Generation]:
        """A ``recovery="live"`` job's membership changes so far in the current attempt,
        oldest first (each a ``Generation``: time, cause, lost or joined ranks, recovery
        time); empty for other jobs."""
        return self.current.generations()

    # -- public API ---------------------------------------------------------------------
    def done(self) -> bool:
        """True once the job ended: finished, failed for good or cancelled."""
        return self._done.is_set()

    def wait_done(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`done`; whether it is."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> list[Any]:
        """Wait for the job and return each rank's return value, in rank order (the last
        attempt's).

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait; ``None`` waits until the job ends.

        Raises
        ------
        JobError
            The root cause when the job failed: :class:`RankFailedError` (a rank raised,
            exited non-zero or was killed; ``__cause__`` is the rank's own exception) or
            :class:`WorkerLostError`. It names the rank and its worker. Once a job's
            restarts ran out, the last attempt's, with ``err.attempts`` listing every
            attempt's failure (:class:`Restart`), and the message telling them.
        GangStartError
            A new attempt found too few workers within ``elastic_timeout``.
        concurrent.futures.CancelledError
            The job was cancelled with :meth:`cancel`.
        TimeoutError
            ``timeout`` passed first; the job keeps running.
        KeyboardInterrupt
            Ctrl-C while waiting: the job is cancelled and its ranks stopped first (the
            message says so).
        """
        try:
            done = self._done.wait(timeout)
        except KeyboardInterrupt:
            # Ctrl-C cancels the job; the frames of the interrupted wait are noise.
            raise interrupt.cancelled_by_interrupt(self) from None
        if not done:
            raise TimeoutError(f"job {self.name!r} still running after {timeout} s"
                               + self._stacks_note())
        if self._error is not None:
            raise self._error
        if self._state is JobState.CANCELLED:
            raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
        if self._values is None:  # not kept: read from the futures each time
            return gather_values(self.client, self.current.futures, self.workers, self.name)
        interrupt.release_at_exit(self)
        return list(self._values)

    def cancel(self) -> None:
        """Stop the current attempt's ranks (their processes are killed), cancel its
        futures and start no other attempt.

        A job that already ended is left as it is (its result stays).
        """
        with self._changed:
            if self._done.is_set():
                return
            self._cancelled = True
            current = self.current
        current.watcher.cancel()

    def metrics(self) -> Iterator[dict[str, Any]]:
        """The job's metric records as they arrive (see :mod:`dask_ddp.results`), attempt
        after attempt, live until the job ends."""
        i = 0
        while True:
            with self._changed:
                while i >= len(self.attempts) and not self._done.is_set():
                    self._changed.wait(1.0)
                if i >= len(self.attempts):
                    return
                monitor = self.attempts[i].monitor
            i += 1
            if monitor is None:
                continue
            # With an output folder the attempts append to one metrics.jsonl: stop at the
            # records this attempt's monitor wrote (the next attempt starts only after it
            # finished, so a record read before then is this attempt's).
            for n, record in enumerate(monitor.iter()):
                if monitor.finished and n >= monitor.count:
                    break
                yield record

    def stacks(self, timeout: float | None = None) -> dict[int, str]:
        """The live Python stack of every thread of each running rank process.

        Returns ``{rank: text}`` (faulthandler's format); a rank that cannot answer (its
        process is stopped, or it runs a command) says why in its text; a rank that ended
        is absent. Waits at most ``timeout`` seconds (``dask-ddp.launch.stacks-timeout``).
        """
        return self.current.stacks(timeout)

    def _stacks_note(self) -> str:
        """The ranks' stacks for an error message ("" when they cannot be read)."""
        if self.current.watcher.done.is_set():
            return ""
        return stall.stacks_note(self.stacks, self.workers)

    def rank_states(self) -> dict[int, dict[str, Any]]:
        """Every rank's state, by rank: ``{"state": ..., "collective": name, "since":
        time.time(), "worker": address}``.

        ``state`` is the stall detection's view while the rank runs (a RankActivity's
        value: "working", "blocked" in ``collective``, "returned", "frozen"); a running
        rank that has not entered a collective yet is "working" since the attempt's
        start; a rank whose task ended without a record is its task's end ("finished",
        "error", "cancelled", "lost"). ``c10d``, when the watcher saw one, is the rank's
        latest c10d collective (torch's flight recorder: ``name``, ``seq``, ``done``).
        Read from the scheduler while the job runs.
        """
        return self.current.rank_states()

    def root_error(self) -> BaseException | None:
        """The error naming the current attempt's root cause, or ``None`` while no rank
        failed."""
        return self.current.root_error()

    # -- the controller ---------------------------------------------------------------
    def _start(self, workers: list[str] | None, attempt_id: str | None = None) -> None:
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
            attempt.start(layout, len(self.attempts), self.run_id, self)
        except BaseException:
            # Interrupted (Ctrl-C) or failed before the watcher took over: nothing stays
            # running, and the page does not show the attempt "starting" for good.
            attempt.abandon(self)
            raise
        with self._changed:
            self.attempts.append(attempt)
            self._state = JobState.RUNNING
            self._changed.notify_all()
        logger.info("job %r (%s): %d ranks on %s", self.name, attempt.id, len(layout),
                    ", ".join(workers))

    def _drive(self) -> None:
        """The controller: each attempt's end, the policy's answer, the next attempt."""
        try:
            while True:
                attempt = self.current
                if self._cancelled:  # cancelled while the attempt was being placed
                    attempt.watcher.cancel()
                attempt.watcher.done.wait()
                try:
                    self._values = attempt.outcome()
                    self._end(JobState.DONE)
                    return
                except JobError as err:
                    record = Restart.of(len(self.attempts) - 1, err)
                    if self._cancelled:  # ranks stopped by cancel(): result() says so
                        raise concurrent.futures.CancelledError() from None
                    if self._decide(err) not in (Action.RESTART, Action.REGROUP):
                        self._fail(err, record)
                        return
                    self.restarts.append(record)
                    logger.warning("job %r: attempt %d failed (%s); restarting (%d of %d)",
                                   self.name, record.attempt, err, len(self.restarts),
                                   self.max_restarts)
                self._end(JobState.RESTARTING)
                self._restart()
        except concurrent.futures.CancelledError:
            self._end(JobState.CANCELLED)
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            if isinstance(exc, GangStartError):
                exc.attempts = list(self.restarts)
                exc.args = (f"{exc}\nearlier attempts of job {self.name!r}:\n"
                            f"{self._history()}",)
            else:  # not a rank's error (its metrics unread, a launcher's error)
                logger.debug("job %r ended with %s: %s", self.name, type(exc).__name__, exc)
            self._error = exc
            self._end(JobState.FAILED)
        finally:
            self._keep_alive.clear()  # the ranks read nothing more
            with self._changed:
                self._done.set()
                self._changed.notify_all()

    def _end(self, state: JobState) -> None:
        with self._changed:
            self._state = state
            self._changed.notify_all()

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
        self._error = err
        self._end(JobState.FAILED)

    def _history(self) -> str:
        return "\n".join(f"  {r}" for r in self.restarts)

    def _restart(self) -> None:
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
            chosen = self._wait_for_workers(minimum, target, opts.waits.restart_grace)
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

    def _wait_for_workers(self, minimum: int, target: int | None, grace: float) -> list[str]:
        """Workers for an attempt: ``target`` of them if they come within ``grace`` seconds,
        else at least ``minimum`` within ``elastic_timeout``, else GangStartError; a
        cancel raises ``CancelledError``."""
        t0 = time.monotonic()
        while True:
            if self._cancelled:
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


class ElasticJob(Job):
    """A job that starts again when a rank fails or its worker leaves (see
    :func:`~dask_ddp.dispatch.submit`: ``max_restarts``, ``min_workers``, ``max_workers``).

    A subclass of :class:`Job` with no body of its own (one handle, one controller): a
    name of its own so that ``isinstance(job, ElasticJob)`` tells a job that may restart,
    as it always has.
    Each attempt has fresh rank processes and rendezvous; ``futures``, ``workers``,
    ``world_size`` and ``id`` are the current attempt's, ``restarts`` and ``attempts``
    tell the earlier ones, and :meth:`result` returns the last attempt's values.
    """
