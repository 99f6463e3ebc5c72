"""One attempt of a job (internal): an :class:`Attempt` is one placement of the ranks (fresh
rank processes and rendezvous), with the watcher of their tasks, their output and metrics.
The job's controller (:mod:`dask_ddp._launch.client.controller`) starts one per attempt.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from typing import Any

from dask_ddp._channel.monitor import JobMonitor
from dask_ddp._launch.client import payload, recovery, registry, stall
from dask_ddp._launch.client.output import RankOutput
from dask_ddp._launch.client.placement import rank_specs
from dask_ddp._launch.client.watcher import Watcher, gather_values
from dask_ddp._launch.wire.live_records import Generation
from dask_ddp._launch.wire.names import output_topic, progress_topic
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp.errors import JobError

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
