"""One attempt of a job: :class:`Job`, and :func:`launch`, which places and submits it.

Each rank runs in its own process, started and watched by a supervisor task pinned to its
worker (:mod:`dask_ddp._launch.supervisor`). The client side here places the ranks (raising at
once when they cannot all be placed), submits the supervisor tasks, and runs a watcher on
the client's event loop that notices failed ranks and lost workers, so a job ends with one
error naming the failing rank instead of hanging.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dask_ddp._channel.monitor import JobMonitor
from dask_ddp._channel.reader import prepare as prepare_channel
from dask_ddp._cluster import cluster_info
from dask_ddp._dashboard import events as dashboard
from dask_ddp._launch import interrupt, payload, quiet, registry, scheduler_plugin, stall, workdir
from dask_ddp._launch.live import JOIN_ENV, Generation
from dask_ddp._launch.live_job import LiveWatch
from dask_ddp._launch.names import (
    abort_event_name,
    failure_topic,
    master_variable_name,
    output_topic,
    progress_topic,
)
from dask_ddp._launch.options import LaunchOptions
from dask_ddp._launch.placement import RankSpec, choose_workers, rank_layout, worker_host
from dask_ddp._launch.root_cause import lost_error, pick_root, record_of
from dask_ddp._launch.supervisor import read_job_stacks, run_rank
from dask_ddp._states import JobState, RankActivity
from dask_ddp.errors import FailureKind, JobError, Restart, StallError, WorkerLostError

logger = logging.getLogger(__name__)

#: The statuses of a Dask future whose task will not run again (Dask's names).
_FUTURE_ENDED = ("finished", "error", "cancelled", "lost")


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
        #: The rank tasks' futures, the job's own (no future refers to the job).
        self._futures: list[Any] = []
        #: The futures handed out (:attr:`futures`), each leading to the job; held weakly.
        self._handed: list[weakref.ref[Any] | None] = []
        self._handed_lock = threading.Lock()
        #: What the ranks read while they run (a persisted collection behind a Table).
        self._keep_alive = list(keep_alive)
        self.workers = workers
        self.world_size = len(workers)
        self.storage = options.storage
        self.output_dir = Path(options.output_dir) if options.output_dir is not None else None
        #: When the job was launched (``time.time()``).
        self.start_time = time.time()
        self._monitor: JobMonitor | None = None
        self._lost: dict[int, WorkerLostError] = {}
        #: The ranks' return values, read by the watcher as the job ends (a worker that
        #: dies afterwards cannot take them along; its rank's future becomes "lost"), when
        #: ``keep_values`` (``dispatch.run`` hands the futures to its user instead: a
        #: large value would cross twice).
        self.keep_values = keep_values
        self._values: list[Any] | None = None
        #: Every rank finished: the job's outcome, fixed (a later loss changes nothing).
        self._all_finished = False
        self._stall: StallError | None = None
        self._states: dict[int, Any] = {}
        #: When the watcher first saw each rank's task finished (the stall rule's progress).
        self._finished_at: dict[int, float] = {}
        self._cancelled = False
        self._done = threading.Event()
        self._eof: set[int] = set()
        self._eof_cond = threading.Condition()
        #: Failed attempts: always empty here (see :class:`ElasticJob`).
        self.restarts: list[Restart] = []
        #: ``recovery="live"``: the job's store and generations (see ``live_job``).
        self._live: LiveWatch | None = None
        #: The ranks' specs as submitted (a rank that joins a live job is made from them).
        self._specs: list[RankSpec] = []

    def __repr__(self) -> str:
        return (f"<Job {self.name!r} id={self.id[:8]} {self.state} "
                f"world_size={self.world_size} ranks_finished={self._ranks_finished()}>")

    def _repr_html_(self) -> str:
        """The job in a notebook (as Dask's Client and Cluster show themselves)."""
        from dask_ddp._launch import summary

        return summary.job_html(self, self._ranks_finished(), self.page_link)

    def _ranks_finished(self) -> int:
        return sum(f.status == "finished" for f in self._futures)

    @property
    def state(self) -> JobState:
        """The job's state: ``running`` (``stalled`` once a stall ended it) until every
        rank has ended, then ``done``, ``failed`` or ``cancelled``."""
        if self._stall is not None:
            return JobState.STALLED if not self._done.is_set() else JobState.FAILED
        if not self._done.is_set():
            return JobState.RUNNING
        return self._final_state()

    @property
    def page_link(self) -> str | None:
        """The URL of the job's page on the Dask dashboard (``None`` without one)."""
        link = getattr(self.client, "dashboard_link", None)
        if not link:
            return None
        return f"{link.rsplit('/', 1)[0]}/dask-ddp/job/{self.id}"

    # -- public API ---------------------------------------------------------------------
    @property
    def futures(self) -> list[Any]:
        """One future per rank, in rank order, each leading back to the job."""
        from distributed import Future

        with self._handed_lock:
            handed = []
            for rank, own in enumerate(self._futures):
                ref = self._handed[rank]
                fut = ref() if ref is not None else None
                if fut is None and own.key in self.client.futures:
                    # Shares the state of the job's own future of the key (its status,
                    # value or error): a second reference to the same task.
                    fut = Future(own.key, self.client)
                    if fut.status != own.status:  # cancelled in between: see below
                        fut = None
                    else:
                        registry.attach(fut, self)
                        self._handed[rank] = weakref.ref(fut)
                # Dask forgets a cancelled key's state (a new future of it would read
                # pending for good): the job's own future stands in, cancelled, holding
                # nothing on the scheduler.
                handed.append(fut if fut is not None else own)
            return handed

    def done(self) -> bool:
        """True once every rank has ended (finished, failed or cancelled)."""
        return self._done.is_set()

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
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.name!r} still running after {timeout} s"
                               + self._stacks_note())
        monitor_timeout = 30.0 if timeout is None else max(timeout, 1.0)
        try:
            self._wait_output_eof(self.options.waits.output_eof)
            error = self.root_error()
            if error is not None:
                raise error
            if self._cancelled:
                raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
            values = self._values if self._values is not None else self._gather_values()
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

    def _gather_values(self) -> list[Any]:
        """The ranks' return values from their futures (the watcher could not read them);
        a value lost with its worker raises instead of waiting for a recomputation that
        cannot run (each rank is pinned to its worker)."""
        for r, f in enumerate(self._futures):
            if f.status in ("lost", "cancelled"):
                raise WorkerLostError(
                    f"rank {r} of job {self.name!r} finished, but its return value was lost "
                    f"with its worker {self.workers[r]} before the client read it",
                    r, self.workers[r], kind=FailureKind.LOST)
        return list(self.client.gather(self._futures))

    def _stop_monitor(self, timeout: float) -> None:
        # The monitor stays attached: metrics() reads its records after the job.
        if self._monitor is not None:
            self._monitor.stop(timeout=timeout)

    def cancel(self) -> None:
        """Stop every rank of the job (their processes are killed) and cancel its futures.

        A job that already ended is left as it is (its result stays).
        """
        if self._done.is_set():
            return
        self._cancelled = True
        interrupt.mark_cancelled(self.id)
        self.client.sync(self._set_abort, callback_timeout=self.options.waits.scheduler_call)
        self.client.cancel(self._futures, reason="dask-ddp job cancelled",
                           msg=f"job {self.name!r} was cancelled")

    def metrics(self) -> Iterator[dict[str, Any]]:
        """The job's metric records as they arrive (see :mod:`dask_ddp.results`)."""
        if self._monitor is None:
            self._monitor = self._start_monitor(progress=False)
        return self._monitor.iter()

    def _start_monitor(self, progress: bool) -> JobMonitor:
        return JobMonitor(self.client, self.id, self._futures, name=self.name,
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
        return dict(self.client.sync(self._stacks, wait, callback_timeout=wait + 10))

    async def _stacks(self, timeout: float) -> dict[int, str]:
        return await read_job_stacks(self.client, self.id, self.workers, timeout)

    def _stacks_note(self) -> str:
        """The ranks' stacks for an error message ("" when they cannot be read)."""
        if self._done.is_set():
            return ""
        try:
            stacks = self.stacks()
        except Exception as exc:  # the error it goes into matters more
            return f"\n(the ranks' stacks could not be read: {exc})"
        if not stacks:
            return ""
        return "\n\nPython stacks of the ranks:\n" + stall.stacks_text(stacks, self.workers)

    @property
    def stalled(self) -> StallError | None:
        """The :class:`~dask_ddp.StallError` that ended the job, if it stalled."""
        return self._stall

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
        if not self._done.is_set():
            with contextlib.suppress(Exception):  # the last states read stand in
                events = self.client.sync(
                    self.client.scheduler.events, topic=progress_topic(self.id),
                    callback_timeout=self.options.waits.scheduler_call)
                self._states = dict(stall.latest_states(events))
        states: dict[int, dict[str, Any]] = {}
        for rank, fut in enumerate(self._futures):
            recorded = self._states.get(rank)
            if recorded is not None and (fut.status == "pending" or recorded.get("state")
                                         == RankActivity.RETURNED):
                entry = {k: recorded[k] for k in ("state", "collective", "since")
                         if k in recorded}
            elif fut.status == "pending":
                entry = {"state": RankActivity.WORKING.value, "collective": "",
                         "since": self.start_time}
            else:
                entry = {"state": fut.status, "collective": "", "since": None}
            if recorded is not None and recorded.get("c10d"):
                entry["c10d"] = recorded["c10d"]  # its latest c10d collective the watcher saw
            states[rank] = {**entry, "worker": self.workers[rank]}
        return states

    @property
    def generations(self) -> list[Generation]:
        """A ``recovery="live"`` job's membership changes so far, oldest first (each a
        ``Generation``: time, cause, lost or joined ranks, recovery time); empty for other
        jobs."""
        live = self._live
        if live is None:
            return []
        if self._done.is_set():
            return list(live.generations)
        return list(self.client.sync(live.read,
                                     callback_timeout=self.options.waits.scheduler_call))

    def root_error(self) -> BaseException | None:
        """The error naming the job's root cause, or ``None`` while no rank failed."""
        if self._stall is not None:
            return self._stall
        if self._all_finished:
            return None  # every rank finished: a value lost later changes nothing
        errors: list[tuple[int, BaseException]] = []
        for rank, fut in enumerate(self._futures):
            if rank in self._lost:
                errors.append((rank, self._lost[rank]))
            elif fut.status == "error":
                errors.append((rank, fut.exception()))
        root = pick_root(errors)
        if isinstance(root, JobError) and self.options.sources:
            payload.name_sources(root, self.options.sources)
        return root

    # -- starting -------------------------------------------------------------------------
    def _submit(self, specs: list[RankSpec], resources: list[dict[str, float] | None]) -> None:
        """Submit the supervisor tasks, then watch them. Raises with nothing left running."""
        self._specs = specs
        try:
            if self.options.stream_output:
                # Subscribe before submitting, so no early line is missed.
                self.client.subscribe_topic(output_topic(self.id), _output_printer(self))
            for spec, res in zip(specs, resources, strict=True):
                # Pinned, never moved, never retried: a rank belongs to its worker; if that
                # worker goes, the job fails (the watcher notices) instead of waiting forever.
                self._futures.append(self.client.submit(
                    run_rank, spec, key=scheduler_plugin.rank_key(self.name, self.id, spec.rank),
                    workers=[spec.worker], allow_other_workers=False, pure=False, retries=0,
                    resources=res))
                self._handed.append(None)
            registry.remember(self, [f.key for f in self._futures])
            self._monitor = self._start_monitor(progress=self.options.progress)
        except BaseException:
            self._abandon()
            raise
        self.client.loop.add_callback(self._watch)

    def _abandon(self) -> None:
        """A launch failed part-way: stop the ranks submitted so far and release them."""
        registry.forget(self, [f.key for f in self._futures])
        bound = self.options.waits.scheduler_call
        with contextlib.suppress(Exception):
            self.client.sync(self._set_abort, callback_timeout=bound)
        with contextlib.suppress(Exception):
            self.client.cancel(self._futures, reason="dask-ddp launch failed",
                               msg=f"launching job {self.name!r} failed")
        with contextlib.suppress(Exception):
            self.client.sync(self._cleanup, callback_timeout=4 * bound)
        # The page showed the job "starting": it never runs.
        with contextlib.suppress(Exception):
            dashboard.job_state(self.client, self.id, JobState.CANCELLED)
        self._done.set()

    # -- the watcher (runs on the client's event loop) -----------------------------------
    async def _set_abort(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.scheduler.event_set(name=abort_event_name(self.id))

    async def _watch(self) -> None:
        waits = self.options.waits
        aborted = False
        next_check = 0.0
        try:
            while True:
                statuses = [f.status for f in self._futures]
                if all(s in _FUTURE_ENDED for s in statuses):
                    break
                if self.client.status in ("closing", "closed"):
                    break  # nothing left to watch with
                try:
                    if not aborted and (any(s in ("error", "cancelled") for s in statuses)
                                        if self._live is None
                                        else self._live.fatal(statuses, self._lost)):
                        await self._bounded(self._set_abort())
                        aborted = True
                    if time.monotonic() >= next_check:
                        next_check = time.monotonic() + waits.worker_check
                        left = await self._bounded(self._live.workers_left()) \
                            if self._live is not None else {}
                        found = await self._bounded(self._check_workers(statuses, left))
                        if self._live is not None:
                            await self._bounded(self._live.publish())
                            await self._bounded(self._grow(statuses, left))
                        if not found and self.options.stall_timeout is not None:
                            found = await self._check_stall(statuses)
                        # A live job goes on without a lost worker's rank.
                        if found and not aborted and (self._live is None or self._stall):
                            await self._bounded(self._set_abort())
                            aborted = True
                except Exception as exc:
                    # One poll failed (the scheduler is slow or away for a moment): the
                    # job goes on and the next poll tries again.
                    logger.warning("watcher of job %r: %s: %s (retrying)", self.name,
                                   type(exc).__name__, exc)
                await asyncio.sleep(waits.watch_poll)
            statuses = [f.status for f in self._futures]
            self._all_finished = (all(s == "finished" for s in statuses) if self._live is None
                                  else self._live.finished(statuses, self._lost))
            if self._all_finished and self.keep_values:
                try:
                    done = [f for f in self._futures if f.status == "finished"]
                    self._values = list(await self._bounded(
                        self.client.gather(done, asynchronous=True)))
                    if self._live is not None:
                        self._values = self._live.values(self._values)
                except Exception as exc:  # result() reads them again, or names the loss
                    logger.warning("job %r: reading the ranks' return values failed: %s: %s",
                                   self.name, type(exc).__name__, exc)
        except Exception:
            logger.exception("watcher of job %r failed; stopping the job", self.name)
        finally:
            await self._cleanup()
            registry.forget(self, [f.key for f in self._futures])
            dashboard.job_state(self.client, self.id, self._final_state())
            self._keep_alive.clear()  # the ranks read nothing more
            self._done.set()

    async def _grow(self, statuses: list[str], left: Mapping[str, int]) -> None:
        """``recovery="live"`` below ``max_workers``: a rank on each worker new to the
        job, which joins the running group at a step boundary (see ``live_job``)."""
        assert self._live is not None
        if self.options.nprocs_per_worker != 1:
            return
        busy = [self.workers[r] for r, s in enumerate(statuses)
                if s == "pending" and r not in self._lost]
        for worker in await self._live.new_workers(self.workers, busy, len(busy),
                                                   self.options.resources, left):
            template = self._specs[0]
            self.workers = [*self.workers, worker]
            self.world_size = len(self.workers)
            rank = self.world_size - 1
            spec = dataclasses.replace(
                template, rank=rank, group_rank=rank, group_world_size=self.world_size,
                local_rank=0, local_world_size=1, proc_index=0, workers=tuple(self.workers),
                options=dataclasses.replace(template.options,
                                            env={**template.options.env, JOIN_ENV: "1"}))
            res = self.options.resources
            self._futures.append(self.client.submit(
                run_rank, spec, key=scheduler_plugin.rank_key(self.name, self.id, rank),
                workers=[worker], allow_other_workers=False, pure=False, retries=0,
                resources=dict(res) if res else None))
            self._handed.append(None)
            registry.remember(self, [self._futures[-1].key])
            await self._live.joined(self.workers, left)
            logger.warning("job %r: rank %d starts on %s to join the group", self.name, rank,
                           worker)

    async def _bounded(self, coro: Any) -> Any:
        """Await a call to the scheduler for at most ``dask-ddp.launch.scheduler-call``."""
        return await asyncio.wait_for(coro, self.options.waits.scheduler_call)

    async def _check_stall(self, statuses: list[str]) -> bool:
        """Read the ranks' states; end the job with a :class:`StallError` when it stalled."""
        timeout = self.options.stall_timeout
        assert timeout is not None
        events = await self._bounded(
            self.client.scheduler.events(topic=progress_topic(self.id)))
        self._states = dict(stall.latest_states(events))
        now = time.time()
        for r, s in enumerate(statuses):
            if s == "finished":
                self._finished_at.setdefault(r, now)
        finished = {r: t for r, t in self._finished_at.items() if statuses[r] == "finished"}
        found = stall.find_stall(self._states, finished, self.world_size, now, timeout)
        if found is None or self._stall is not None:
            return False
        if self._live is not None and await self._live.end_frozen(found, self.workers):
            return False  # the frozen ranks are killed: the others re-form without them
        try:
            stacks = await asyncio.wait_for(self._stacks(self.options.waits.stacks_timeout),
                                            self.options.waits.stacks_timeout + 10)
        except Exception as exc:
            logger.warning("job %r stalled; its stacks could not be read: %s", self.name, exc)
            stacks = {}
        err = stall.stall_error(found, self.name, self.workers, timeout, stacks, now)
        self._stall = err
        logger.error("%s", str(err).split("\n\n")[0])
        # Every rank's supervisor raises this in place of its abort (the seed's gather
        # names the stall too); a dashboard reads it on the failure topic.
        await self._bounded(self.client.scheduler.log_event(
            topic=failure_topic(self.id), msg=stall.stall_record(err)))
        return True

    def _final_state(self) -> JobState:
        """The ended job's state for the job page (its root cause comes from the ranks)."""
        statuses = {f.status for f in self._futures}
        if self._all_finished:
            return JobState.DONE
        if self._cancelled:  # the ranks stopped by the cancel may have erred: not a failure
            return JobState.CANCELLED
        if self._lost or statuses & {"error", "lost"}:  # lost: a value went with its worker
            return JobState.FAILED
        return JobState.CANCELLED if self._cancelled or statuses - {"finished"} \
            else JobState.DONE

    async def _check_workers(self, statuses: list[str], left: Mapping[str, int]) -> bool:
        """Detect ranks whose worker left; cancel their futures (else they stay pending).
        ``left``: a live job's count of workers that left at each address."""
        present = await self.client.scheduler.ncores(workers=sorted(set(self.workers)))
        # A live job also knows the workers that left and came back at their address.
        gone = set(self._live.gone(self.workers, left)) if self._live is not None else set()
        lost = [r for r, w in enumerate(self.workers)
                if (w not in present or r in gone) and statuses[r] == "pending"
                and r not in self._lost]
        for r in lost:
            self._lost[r] = lost_error(self.name, r, self.workers[r])
        for r in lost:
            # Tell the other ranks' supervisors the root cause: a rank that failed because
            # its peer vanished then reports it at once instead of waiting for one.
            with contextlib.suppress(Exception):
                await self.client.scheduler.log_event(topic=failure_topic(self.id),
                                                      msg=record_of(self._lost[r]))
        if lost:
            await self.client.cancel([self._futures[r] for r in lost], asynchronous=True,
                                     reason="dask-ddp worker lost",
                                     msg="; ".join(str(self._lost[r]) for r in lost))
        return bool(lost)

    async def _cleanup(self) -> None:
        if self._live is not None:
            await self._live.close()
        # No task of an ended job stays on the scheduler (a pinned task of a lost worker
        # would wait in no-worker and ask an adaptive cluster for workers).
        # A "lost" future (its rank finished, then its worker died with the value) is not
        # cancelled: the scheduler's JobGuard errs it with the loss (see scheduler_plugin.py).
        left = [f for f in self._futures if f.status not in _FUTURE_ENDED]
        if left:
            with contextlib.suppress(Exception):
                await self._bounded(self.client.cancel(
                    left, asynchronous=True, reason="dask-ddp job ended",
                    msg=f"job {self.name!r} ended"))
        # Dask deletes a Variable through a stream message (no reply to wait for).
        with contextlib.suppress(Exception):
            from distributed import Variable

            Variable(master_variable_name(self.id), client=self.client).delete()
        for event in (abort_event_name(self.id), master_variable_name(self.id)):
            with contextlib.suppress(Exception):
                await self._bounded(self.client.scheduler.event_clear(name=event))
        await self._forget_topics(progress_topic(self.id), failure_topic(self.id),
                                  output_topic(self.id),
                                  # Dask's topic of the Variable's pseudo-client
                                  f"variable-{master_variable_name(self.id)}")

    async def _forget_topics(self, *topics: str) -> None:
        """Have the scheduler drop these event topics of the ended job (see scheduler_plugin.py)."""
        with contextlib.suppress(Exception):
            await self._bounded(getattr(self.client.scheduler, scheduler_plugin.FORGET_HANDLER)(
                topics=list(topics)))

    # -- rank output --------------------------------------------------------------------
    def _on_output(self, event: Any) -> None:
        _, msg = event
        rank, stream, line = msg["rank"], msg["stream"], msg["line"]
        if stream == "eof":
            with self._eof_cond:
                self._eof.add(rank)
                self._eof_cond.notify_all()
            return
        out = sys.stderr if stream == "stderr" else sys.stdout
        out.write(f"[rank {rank}] {line}\n")
        out.flush()

    def _wait_output_eof(self, timeout: float) -> None:
        if not self.options.stream_output:
            return
        deadline = time.monotonic() + timeout
        # A rank whose worker died sends no end-of-output mark.
        expected = set(range(self.world_size)) - set(self._lost)
        with self._eof_cond:
            while not expected <= self._eof:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._eof_cond.wait(left)
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(output_topic(self.id))
            self.client.sync(self._forget_topics, output_topic(self.id))


def _output_printer(job: Job) -> Callable[[Any], None]:
    """The handler of ``job``'s output topic; it holds the job weakly (Dask keeps a topic's
    handler after an unsubscribe: the job would never go)."""
    ref = weakref.ref(job)

    def on_output(event: Any) -> None:
        alive = ref()
        if alive is not None:
            alive._on_output(event)

    return on_output


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
    workdir.install_cleaner(client)
    scheduler_plugin.install(client)
    quiet.install(client)
    dashboard.install(client)
    try:
        dashboard.job_started(client, job_id=job.id, run_id=run_id or job.id, name=job.name,
                              attempt=restart, workers=job.workers,
                              max_restarts=options.max_restarts)
        _start(client, job, options, layout, restart, run_id)
    except BaseException:
        # Interrupted (Ctrl-C) or failed before the watcher took over: nothing stays
        # running, and the page does not show the job "starting" for good.
        if not job.done():
            job._abandon()
        raise
    logger.info("job %r (%s): %d ranks on %s", job.name, job.id, len(layout),
                ", ".join(workers))
    return job


def _start(client: Any, job: Job, options: LaunchOptions, layout: list[dict[str, Any]],
           restart: int, run_id: str | None) -> None:
    """Build the ranks' specs and submit them (their watcher then runs)."""
    scheduler = client.scheduler.address
    if options.recovery == "live":
        job._live = LiveWatch(client, job.id, job.workers, options.waits.scheduler_call,
                              min_size=options.min_workers or 1,
                              max_size=options.max_workers)
        options = job.options = dataclasses.replace(
            options, env={**options.env, **job._live.env()})
    specs = [RankSpec(
        options=options, job_id=job.id, run_id=run_id or job.id, restart=restart,
        rank=i["rank"], local_rank=i["local_rank"], local_world_size=i["local_world_size"],
        group_rank=i["group_rank"], group_world_size=i["group_world_size"],
        proc_index=i["proc_index"], workers=tuple(job.workers),
        master_addr=worker_host(layout[0]["worker"]), scheduler=scheduler) for i in layout]
    res = options.resources
    job._submit(specs, [dict(res) if res and i["proc_index"] == 0 else None for i in layout])


