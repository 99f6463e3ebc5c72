"""A job launched on Dask: :class:`Job`, the one handle its caller holds for both kinds of
job (public as :class:`dask_ddp.Job` and :class:`dask_ddp.ElasticJob`).

Its public surface is written once and reads from the job's
:class:`~dask_ddp._launch.client.controller.Controller` (the job's state, its attempts and
the policy's answer to each failed one) and from the current
:class:`~dask_ddp._launch.client.attempt.Attempt` (one placement of the ranks, whose
:class:`~dask_ddp._launch.client.watcher.Watcher` watches their tasks).
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

from dask_ddp._launch.client import interrupt, stall, summary
from dask_ddp._launch.client.attempt import Attempt
from dask_ddp._launch.client.controller import Controller
from dask_ddp._launch.client.watcher import Watcher, gather_values
from dask_ddp._launch.wire.live_records import Generation
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._states import JobState
from dask_ddp.errors import Restart, StallError

logger = logging.getLogger(__name__)


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
        first_id = job_id or uuid.uuid4().hex
        # One run id across restarts, as torchrun's TORCHELASTIC_RUN_ID.
        self.run_id = uuid.uuid4().hex if options.restarting else first_id
        self._control = Controller(client, options, self.run_id, keep_values=keep_values,
                                   keep_alive=keep_alive)
        if workers is None and options.elastic:
            workers = self._control.wait_for_workers(
                minimum=options.min_workers or 1, target=options.max_workers, grace=0.0)
        self._control.start(self, workers, first_id)
        # The controller's thread holds the job while it runs (the attempts' watchers
        # hold it too); nothing else does but the futures it hands out.
        threading.Thread(target=self._control.drive, args=(self,), daemon=True,
                         name=f"dask-ddp-job-{self.name}").start()

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
        return self._control.current

    @property
    def attempts(self) -> list[Attempt]:
        """Every attempt started so far (its ``id``, ``workers``, ``futures``); the last is
        the current one."""
        return self._control.attempts

    @property
    def restarts(self) -> list[Restart]:
        """The failed attempts so far, oldest first (empty for a job that does not
        restart)."""
        return self._control.restarts

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
        state = self._control.state
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
        return self._control.done.is_set()

    def wait_done(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`done`; whether it is."""
        return self._control.done.wait(timeout)

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
            done = self._control.done.wait(timeout)
        except KeyboardInterrupt:
            # Ctrl-C cancels the job; the frames of the interrupted wait are noise.
            raise interrupt.cancelled_by_interrupt(self) from None
        if not done:
            raise TimeoutError(f"job {self.name!r} still running after {timeout} s"
                               + self._stacks_note())
        if self._control.error is not None:
            raise self._control.error
        if self._control.state is JobState.CANCELLED:
            raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
        if self._control.values is None:  # not kept: read from the futures each time
            return gather_values(self.client, self.current.futures, self.workers, self.name)
        interrupt.release_at_exit(self)
        return list(self._control.values)

    def cancel(self) -> None:
        """Stop the current attempt's ranks (their processes are killed), cancel its
        futures and start no other attempt.

        A job that already ended is left as it is (its result stays).
        """
        with self._control.changed:
            if self._control.done.is_set():
                return
            self._control.cancelled = True
            current = self.current
        current.watcher.cancel()

    def metrics(self) -> Iterator[dict[str, Any]]:
        """The job's metric records as they arrive (see :mod:`dask_ddp.results`), attempt
        after attempt, live until the job ends."""
        i = 0
        while True:
            with self._control.changed:
                while i >= len(self.attempts) and not self._control.done.is_set():
                    self._control.changed.wait(1.0)
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
