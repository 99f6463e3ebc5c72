"""One attempt of a job: :class:`Job`, and :func:`launch`, which places and starts it.

Each rank runs in its own process, started and watched by a supervisor task pinned to its
worker (:mod:`dask_ddp._launch.supervisor`). The client side here places the ranks (raising at
once when they cannot all be placed) and builds their specs; the job's
:class:`~dask_ddp._launch.watcher.Watcher` submits them and watches them on the client's
event loop, with the job's recovery (:mod:`dask_ddp._launch.recovery`) saying what a rank's
end means. :class:`Job` is the handle: what the caller reads, waits for and cancels.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dask_ddp._channel.monitor import JobMonitor
from dask_ddp._channel.reader import prepare as prepare_channel
from dask_ddp._cluster import cluster_info
from dask_ddp._dashboard import events as dashboard
from dask_ddp._launch.client import interrupt, payload, recovery, registry, stall
from dask_ddp._launch.client.output import RankOutput
from dask_ddp._launch.client.placement import choose_workers, rank_layout, rank_specs
from dask_ddp._launch.client.watcher import Watcher, gather_values
from dask_ddp._launch.wire.entry_points import JOB_GUARD, QUIET_RANK_FAILURES, WORKDIR_CLEANER
from dask_ddp._launch.wire.live_records import Generation
from dask_ddp._launch.wire.names import output_topic, progress_topic
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._states import JobState
from dask_ddp.errors import JobError, Restart, StallError

logger = logging.getLogger(__name__)


class Job:
    """A running DDP job: one supervisor task (and rank process) per rank.

    Attributes
    ----------
    client : distributed.Client
    id : str
        Unique job id (hex).
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
    watcher : Watcher
        The job's rank tasks and what the watch loop found about them (its own futures,
        lost workers, stall, values; see :mod:`dask_ddp._launch.watcher`).

    Nothing refers back to the job but the futures it hands out: the job holds its tasks'
    own futures, and those it hands out (which lead to it) only weakly, so it and its tasks
    go as soon as nobody holds the job or a future of it (no reference cycle waits for
    Python's garbage collector), also while the job runs.
    """

    def __init__(self, client: Any, options: LaunchOptions, job_id: str,
                 workers: list[str], *, keep_values: bool = True,
                 keep_alive: Sequence[Any] = ()) -> None:
        self.client = client
        self.options = options
        self.id = job_id
        self.name = options.name
        #: The futures handed out (:attr:`futures`), each leading to the job; held weakly.
        self._handed = registry.Handed()
        self.storage = options.storage
        self.output_dir = Path(options.output_dir) if options.output_dir is not None else None
        #: When the job was launched (``time.time()``).
        self.start_time = time.time()
        self._monitor: JobMonitor | None = None
        #: The ranks' return values, read by the watcher as the job ends (a worker that
        #: dies afterwards cannot take them along; its rank's future becomes "lost"), when
        #: ``keep_values`` (``dispatch.run`` hands the futures to its user instead: a
        #: large value would cross twice).
        self.keep_values = keep_values
        #: The values :meth:`result` returned (kept with ``keep_values``).
        self._values: list[Any] | None = None
        #: The ranks' states as last read by :meth:`rank_states`.
        self._states: dict[int, Any] = {}
        self._output = RankOutput()
        #: Failed attempts: always empty here (see :class:`ElasticJob`).
        self.restarts: list[Restart] = []
        self.watcher = Watcher(client, options, job_id, workers, keep_values=keep_values,
                               keep_alive=keep_alive)

    def __repr__(self) -> str:
        return (f"<Job {self.name!r} id={self.id[:8]} {self.state} "
                f"world_size={self.world_size} ranks_finished={self._ranks_finished()}>")

    def _repr_html_(self) -> str:
        """The job in a notebook (as Dask's Client and Cluster show themselves)."""
        from dask_ddp._launch.client import summary

        return summary.job_html(self, self._ranks_finished(), self.page_link)

    def _ranks_finished(self) -> int:
        return sum(f.status == "finished" for f in self.watcher.futures)

    @property
    def workers(self) -> list[str]:
        """The worker address of every rank, in rank order."""
        return self.watcher.workers

    @property
    def world_size(self) -> int:
        """The number of ranks (a live job's joining ranks included)."""
        return len(self.watcher.workers)

    @property
    def state(self) -> JobState:
        """The job's state: ``running`` (``stalled`` once a stall ended it) until every
        rank has ended, then ``done``, ``failed`` or ``cancelled``."""
        done = self.watcher.done.is_set()
        if self.watcher.stall is not None:
            return JobState.STALLED if not done else JobState.FAILED
        if not done:
            return JobState.RUNNING
        return self.watcher.final_state()

    @property
    def page_link(self) -> str | None:
        """The URL of the job's page on the Dask dashboard (``None`` without one)."""
        from dask_ddp._launch.client import summary

        return summary.page_link(self.client, self.id)

    # -- public API ---------------------------------------------------------------------
    @property
    def futures(self) -> list[Any]:
        """One future per rank, in rank order, each leading back to the job."""
        return self._handed.futures(self.watcher.futures, self.client, self)

    def done(self) -> bool:
        """True once every rank has ended (finished, failed or cancelled)."""
        return self.watcher.done.is_set()

    def wait_done(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`done`; whether it is."""
        return self.watcher.done.wait(timeout)

    def result(self, timeout: float | None = None) -> list[Any]:
        """Wait for the job and return each rank's return value, in rank order.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait; ``None`` waits until the job ends.

        Raises
        ------
        JobError
            The root cause when the job failed: :class:`RankFailedError` (a rank raised,
            exited non-zero or was killed; ``__cause__`` is the rank's own exception) or
            :class:`WorkerLostError`. It names the rank and its worker.
        concurrent.futures.CancelledError
            The job was cancelled with :meth:`cancel`.
        TimeoutError
            ``timeout`` passed first; the job keeps running.
        KeyboardInterrupt
            Ctrl-C while waiting: the job is cancelled and its ranks stopped first (the
            message says so).
        """
        try:
            return self._result(timeout)
        except KeyboardInterrupt:
            # Ctrl-C cancels the job; the frames of the interrupted wait are noise.
            raise interrupt.cancelled_by_interrupt(self) from None

    def _result(self, timeout: float | None) -> list[Any]:
        if not self.watcher.done.wait(timeout):
            raise TimeoutError(f"job {self.name!r} still running after {timeout} s"
                               + self._stacks_note())
        monitor_timeout = 30.0 if timeout is None else max(timeout, 1.0)
        try:
            self._wait_output_eof(self.options.waits.output_eof)
            error = self.root_error()
            if error is not None:
                raise error
            if self.watcher.cancelled:
                raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
            values = self._values if self._values is not None else self.watcher.values
            if values is None:
                values = gather_values(self.client, self.watcher.futures, self.workers,
                                       self.name)
        except BaseException:
            # The job's own error wins over a failure to collect its metrics.
            try:
                self._stop_monitor(monitor_timeout)
            except Exception:
                logger.exception("collecting the metrics of failed job %r failed", self.name)
            raise
        self._stop_monitor(monitor_timeout)
        if self.keep_values:
            self._values = values
            interrupt.release_at_exit(self)
        return values

    def _stop_monitor(self, timeout: float) -> None:
        # The monitor stays attached: metrics() reads its records after the job.
        if self._monitor is not None:
            self._monitor.stop(timeout=timeout)

    def cancel(self) -> None:
        """Stop every rank of the job (their processes are killed) and cancel its futures.

        A job that already ended is left as it is (its result stays).
        """
        self.watcher.cancel()

    def metrics(self) -> Iterator[dict[str, Any]]:
        """The job's metric records as they arrive (see :mod:`dask_ddp.results`)."""
        if self._monitor is None:
            self._monitor = self._start_monitor(progress=False)
        return self._monitor.iter()

    def _start_monitor(self, progress: bool) -> JobMonitor:
        return JobMonitor(self.client, self.id, self.watcher.futures, name=self.name,
                          output_dir=self.output_dir, progress=progress)

    @property
    def monitor(self) -> Any:
        """The :class:`~dask_ddp.results.JobMonitor` reading the job's metrics, if any."""
        return self._monitor

    def stacks(self, timeout: float | None = None) -> dict[int, str]:
        """The live Python stack of every thread of each running rank process.

        Returns ``{rank: text}`` (faulthandler's format); a rank that cannot answer (its
        process is stopped, or it runs a command) says why in its text; a rank that ended
        is absent. Waits at most ``timeout`` seconds (``dask-ddp.launch.stacks-timeout``).
        """
        wait = self.options.waits.stacks_timeout if timeout is None else timeout
        return dict(self.client.sync(self.watcher.read_stacks, wait,
                                     callback_timeout=wait + 10))

    def _stacks_note(self) -> str:
        """The ranks' stacks for an error message ("" when they cannot be read)."""
        return "" if self.watcher.done.is_set() else stall.stacks_note(self.stacks,
                                                                       self.workers)

    @property
    def stalled(self) -> StallError | None:
        """The :class:`~dask_ddp.StallError` that ended the job, if it stalled."""
        return self.watcher.stall

    def rank_states(self) -> dict[int, dict[str, Any]]:
        """Every rank's state, by rank: ``{"state": ..., "collective": name, "since":
        time.time(), "worker": address}``.

        ``state`` is the stall detection's view while the rank runs (a RankActivity's
        value: "working", "blocked" in ``collective``, "returned", "frozen"); a running
        rank that has not entered a collective yet is "working" since the job's start; a
        rank whose task ended without a record is its task's end ("finished", "error",
        "cancelled", "lost"). ``c10d``, when the watcher saw one, is the rank's latest
        c10d collective (torch's flight recorder: ``name``, ``seq``, ``done``). Read from
        the scheduler while the job runs.
        """
        # The watcher's states stand in when none can be read (or the job ended).
        read = self.watcher.states
        if not self.watcher.done.is_set():
            with contextlib.suppress(Exception):
                events = self.client.sync(
                    self.client.scheduler.events, topic=progress_topic(self.id),
                    callback_timeout=self.options.waits.scheduler_call)
                self._states = read = dict(stall.latest_states(events))
        if self._states and not read:
            read = self._states  # the last states read here
        return stall.rank_table(read, [f.status for f in self.watcher.futures], self.workers,
                                self.start_time)

    @property
    def generations(self) -> list[Generation]:
        """A ``recovery="live"`` job's membership changes so far, oldest first (each a
        ``Generation``: time, cause, lost or joined ranks, recovery time); empty for other
        jobs."""
        rec = self.watcher.recovery
        if self.watcher.done.is_set():
            return list(rec.generations)
        return list(self.client.sync(rec.read_generations,
                                     callback_timeout=self.options.waits.scheduler_call))

    def root_error(self) -> BaseException | None:
        """The error naming the job's root cause, or ``None`` while no rank failed."""
        root = self.watcher.root_cause()
        if isinstance(root, JobError) and self.options.sources:
            payload.name_sources(root, self.options.sources)
        return root

    # -- starting -------------------------------------------------------------------------
    def start(self, layout: list[dict[str, Any]], restart: int, run_id: str | None) -> None:
        """Build the ranks' specs from their ``layout`` and submit them (their watcher
        then runs). Raises with nothing left running."""
        try:
            machinery = recovery.for_job(self.client, self.options, self.id, self.name,
                                         self.workers)
            self.watcher.set_recovery(machinery)
            options = self.options
            # The ranks' specs carry the job's options whole, and a live job's store.
            specs = rank_specs(options, layout, self.workers, job_id=self.id,
                               run_id=run_id or self.id, restart=restart,
                               scheduler=self.client.scheduler.address,
                               live_store=machinery.live_store)
            res = options.resources
            if options.stream_output:
                # Subscribe before submitting, so no early line is missed.
                self.client.subscribe_topic(output_topic(self.id), self._output.handler())
            self.watcher.start(
                specs, [dict(res) if res and i["proc_index"] == 0 else None for i in layout],
                self)
            self._monitor = self._start_monitor(progress=options.progress)
        except BaseException:
            self.abandon()
            raise
        self.watcher.watch(self)

    def abandon(self) -> None:
        """A launch failed part-way: stop the ranks submitted so far and release them."""
        self.watcher.abandon(self)

    # -- rank output --------------------------------------------------------------------
    def _wait_output_eof(self, timeout: float) -> None:
        if self.options.stream_output:
            # A rank whose worker died sends no end-of-output mark.
            self._output.finish(self.client, output_topic(self.id), self.watcher.forget_topics,
                                set(range(self.world_size)) - set(self.watcher.lost), timeout)


def launch(client: Any, options: LaunchOptions, *, workers: list[str] | None = None,
           restart: int = 0, run_id: str | None = None, keep_values: bool = True,
           keep_alive: Sequence[Any] = ()) -> Job:
    """Place and start one attempt of a job; ``workers`` overrides ``options``'s choice;
    ``keep_values=False``: the job's watcher does not read the ranks' values at the end;
    ``keep_alive``: what the job holds until its end (the collections behind its Tables).

    Raises
    ------
    GangStartError
        At once, when the ranks cannot all be placed.
    """
    if client.asynchronous:
        raise TypeError("dask-ddp needs a synchronous distributed.Client "
                        "(got one created with asynchronous=True)")
    if workers is None:
        workers = choose_workers(cluster_info(client), options.n_workers,
                                 options.workers, options.resources)
    layout = rank_layout(workers, options.nprocs_per_worker)
    job = Job(client, options, uuid.uuid4().hex, [i["worker"] for i in layout],
              keep_values=keep_values, keep_alive=keep_alive)
    prepare_channel(client, job.id, options.storage)
    WORKDIR_CLEANER.install(client)
    JOB_GUARD.install(client)
    QUIET_RANK_FAILURES.install(client)
    dashboard.install(client)
    try:
        dashboard.job_started(client, job_id=job.id, run_id=run_id or job.id, name=job.name,
                              attempt=restart, workers=job.workers,
                              max_restarts=options.max_restarts)
        job.start(layout, restart, run_id)
    except BaseException:
        # Interrupted (Ctrl-C) or failed before the watcher took over: nothing stays
        # running, and the page does not show the job "starting" for good.
        if not job.done():
            job.abandon()
        raise
    logger.info("job %r (%s): %d ranks on %s", job.name, job.id, len(layout),
                ", ".join(workers))
    return job
