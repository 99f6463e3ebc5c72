"""The supervisor task: runs in a Dask worker and owns one rank process (internal).

One supervisor task per rank, pinned to its worker. It joins the job's rendezvous (rank 0's
supervisor hosts the store and publishes its address: :mod:`~dask_ddp._launch.worker.rendezvous`),
starts the rank process (:mod:`~dask_ddp._launch.worker.rank_process`), and watches it, the
job-wide abort event and its own task's state: it records the rank's activity on the job's
progress topic (:mod:`~dask_ddp._launch.worker.activity`), kills the rank's process group when the
job is aborted, the task is cancelled or the worker closes, and turns the rank's end into
its task's outcome (:mod:`~dask_ddp._launch.worker.outcome`: the value, or an error naming the
job's root fault). A live job's rank that died is recorded lost on the job's store at once
(:mod:`~dask_ddp._launch.worker.live_loss`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import time
from collections import deque
from typing import Any

from dask_ddp._channel.rank_writer import Forwarder
from dask_ddp._channel.wire import metrics_topic
from dask_ddp._dashboard.sampler import RankSampler
from dask_ddp._launch.wire.live_records import LiveLeft, LiveStart
from dask_ddp._launch.wire.names import output_topic
from dask_ddp._launch.wire.policy import RecoveryStatus
from dask_ddp._launch.wire.rank_spec import RankSpec
from dask_ddp._launch.worker import live_leave, probe
from dask_ddp._launch.worker.activity import ActivityReporter
from dask_ddp._launch.worker.live_loss import LossRecorder
from dask_ddp._launch.worker.outcome import RankOutcome
from dask_ddp._launch.worker.rank_process import (
    RankProcess,
    rank_command,
    rank_cwd,
    rank_environment,
)
from dask_ddp._launch.worker.rendezvous import Rendezvous, RendezvousTimeout
from dask_ddp._launch.worker.workdir import clean_orphans, create_workdir, remove_workdir
from dask_ddp.errors import FailureKind, RankAbortedError

logger = logging.getLogger(__name__)

_RUNNING_STATES = ("executing", "long-running")


def run_rank(spec: RankSpec) -> Any:
    """Start rank ``spec.rank`` of a job in its own process and supervise it.

    Returns what the rank's function returned (function mode) or the exit code 0
    (command mode). Raises :class:`RankFailedError` when the rank fails and
    :class:`RankAbortedError` when it was stopped because of another rank or a cancel.
    """
    from distributed import get_worker, secede

    worker = get_worker()
    if worker.address != spec.worker:
        raise RuntimeError(
            f"rank {spec.rank} of job {spec.job_name!r} was pinned to {spec.worker} "
            f"but runs on {worker.address}")
    key = worker.get_current_task()
    # The task waits for a process, not for CPU: leave the thread pool so a job never
    # blocks another job's supervisors (no gang deadlock between jobs on busy workers).
    secede()
    return _Supervisor(spec, worker, key).run()


def _task_running(worker: Any, key: Any, timeout: float) -> bool:
    """Whether task ``key`` still runs on ``worker``, read on the worker's event loop (the
    worker's state is not thread-safe) within ``timeout`` seconds."""
    async def running() -> bool:
        ts = worker.state.tasks.get(key)
        return ts is not None and ts.state in _RUNNING_STATES

    coro = running()
    try:
        fut = asyncio.run_coroutine_threadsafe(coro, worker.loop.asyncio_loop)
    except Exception:  # the loop is gone: the worker is closing
        coro.close()  # never scheduled: no "coroutine was never awaited" warning
        return False
    try:
        return fut.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        # The worker's loop is busy (a long task holding the GIL, a slow handler): no
        # answer is not "cancelled"; the next poll asks again.
        fut.cancel()
        return True
    except Exception:
        return False


class _LeftLive(Exception):
    """A live job's rank left because its worker is closing (not a failure)."""


class _Supervisor:
    def __init__(self, spec: RankSpec, worker: Any, key: Any) -> None:
        from distributed import get_client

        self.spec = spec
        self.worker = worker
        self.key = key
        self.client: Any = get_client()
        self.rendezvous = Rendezvous(spec, self.client)
        self.stderr_tail: deque[str] = deque(maxlen=30)
        self.waits = spec.options.waits
        self.workdir = ""
        #: What the rank's end means for the task (its value, or the job's root fault).
        self.outcome = RankOutcome(spec, worker, self.client, self.rendezvous)
        #: The rank's activity on the job's progress topic.
        self.activity = ActivityReporter(spec, worker)
        #: The record of its rank's loss, when the job's policy regroups (its store
        #: connected before the rank starts); None for other jobs.
        self.live = self._loss_recorder(spec)

    def _loss_recorder(self, spec: RankSpec) -> LossRecorder | None:
        opts = spec.options
        if not opts.policy.regroups:
            return None
        if spec.live_store is None:
            raise RuntimeError(f"rank {spec.rank} of job {spec.job_name!r}: its policy "
                               f"{opts.policy.name!r} regroups, but its spec names no live "
                               "store")
        # The rank's death as this process sees it: the group's size is not known here
        # (the group checks min_workers again as it re-forms).
        died = RecoveryStatus(kind=FailureKind.DIED, rank=spec.rank, restarts=spec.restart,
                              max_restarts=opts.max_restarts,
                              min_workers=opts.min_workers or 1, live_workers=None)
        return LossRecorder(spec.live_store, spec.rank, spec.job_name,
                            self.waits.scheduler_call, policy=opts.policy, died=died)

    # -- the task -----------------------------------------------------------------------
    def run(self) -> Any:
        spec = self.spec
        clean_orphans()
        workdir = self.workdir = create_workdir(spec.job_id, spec.rank)
        try:
            if spec.joins:
                port = 0  # joins a live job's running group through its store alone
            elif spec.rank == 0:
                port = self.rendezvous.host()
                # Taken back when the job ended meanwhile (its client's cleanup may have
                # run before this): the run's end withdraws the address.
                self._check_stop(None)
            else:
                port = self._await_master_port()
            return self._run_process(port, workdir)
        finally:
            self.rendezvous.close()
            remove_workdir(workdir)

    def _await_master_port(self) -> int:
        try:
            return self.rendezvous.await_port(lambda: self._check_stop(None))
        except RendezvousTimeout as exc:
            raise self.outcome.failed("rendezvous", str(exc), None, "") from None

    def _run_process(self, port: int, workdir: str) -> Any:
        spec, opts = self.spec, self.spec.options
        # A launch that failed part way (or a cancel) may have come while the port was
        # found: no rank is started for a task nobody waits on.
        self._check_stop(None)
        env = rank_environment(spec, port, workdir, self.worker.nanny is not None)
        # The job page's sampler of this rank (step counters, metrics, CPU, RSS).
        sampler = RankSampler(self.worker, spec.job_id, spec.rank, workdir,
                              opts.waits.dashboard_sample)
        env.update(sampler.environment())
        read_fd, write_fd = os.pipe()
        env["DASK_DDP_CHANNEL_FD"] = str(write_fd)
        argv = rank_command(spec, workdir, env)
        if self.live is not None:
            assert spec.live_store is not None  # checked with the recorder
            # The part of the job's options the rank's live group needs.
            LiveStart(store=spec.live_store, min_size=opts.min_workers or 1,
                      max_size=opts.max_workers, join=spec.joins).write(workdir)
        try:
            rank = RankProcess.start(argv, env, rank_cwd(spec), (write_fd,), opts.stream_output,
                                     job_id=spec.job_id, job_name=spec.job_name,
                                     rank=spec.rank, workdir=workdir)
        except (OSError, ValueError) as exc:  # ValueError: a bad dask-ddp.launch setting
            os.close(read_fd)
            raise self.outcome.failed("start", f"could not start {argv[0]!r}: {exc}", exc,
                                      "") from exc
        finally:
            os.close(write_fd)
        fwd = Forwarder(spec.job_id, spec.rank, read_fd,
                        tap=(metrics_topic(spec.job_id), sampler.tap))
        fwd.start()
        sampler.start(rank.pid)
        rank.start_pumps(self._on_output)
        if self.live is not None:
            # A closing worker lets it leave first.
            live_leave.register(rank, self.waits.leave_grace)
        left = False
        try:
            try:
                self._watch(rank)
            except _LeftLive:
                left = True
            # A live job's survivors re-form once the loss is recorded: at once, before
            # the rank's output and records are wound up.
            self._live_left(-1, workdir)
        finally:
            live_leave.unregister(rank)
            rank.stop(self.waits.term_grace)
            self._on_output("eof", "")
            self._close_forwarder(fwd)
            sampler.stop(rank.returncode)
        assert rank.returncode is not None  # stop() reaped it
        if left or self._live_left(rank.returncode, workdir):
            # A live job goes on without this rank: no error, no abort of its peers.
            return LiveLeft(spec.rank, f"the rank process ended with {rank.returncode}")
        return self.outcome.of_exit(rank.returncode, workdir, rank, self.stderr_tail)

    def _close_forwarder(self, fwd: Forwarder) -> None:
        """Hand the rank's last records on; a failure here never hides the rank's outcome."""
        try:
            fwd.close(timeout=self.waits.forward_close)
        except Exception as exc:
            logger.error("rank %d of job %r: %s", self.spec.rank, self.spec.job_name, exc)
        if not _task_running(self.worker, self.key, self.waits.abort_poll):
            # Nobody reads this job's records any more (its client let go of the job):
            # free its topic on the scheduler, after this rank's last put; and once more
            # after a read the dead client left in flight could have made it again.
            for pause in (0.0, self.waits.reclose):
                time.sleep(pause)
                with contextlib.suppress(Exception):
                    self.client.sync(self.client.scheduler.dask_ddp_results_close,
                                     topic=metrics_topic(self.spec.job_id),
                                     callback_timeout=self.waits.scheduler_call)

    # -- watching -----------------------------------------------------------------------
    def _watch(self, rank: RankProcess) -> None:
        # A thread blocks in waitid() so the exit is seen at once, while this loop wakes
        # only twice a second: the rank's cores are not shared with a polling loop.
        exited = rank.watch_exit()
        if self.live is not None:
            # The survivors wait for this record: made the moment the process is gone.
            self.live.watch(exited, self.workdir)
        state = probe.RankState(self.workdir)
        try:
            while not exited.wait(self.waits.abort_poll):
                self._check_stop(rank)
                self.activity.observe(rank, state)
            # The rank's last state (returned, most often) at once: the stall rule must
            # not see it still blocked in a collective that completed as its peer ended.
            with contextlib.suppress(Exception):
                self.activity.observe(rank, state)
        finally:
            state.close()

    def _check_stop(self, rank: RankProcess | None) -> None:
        """Raise :class:`RankAbortedError` (after killing the rank) if the rank must stop."""
        from distributed.core import Status

        reason = None
        if not _task_running(self.worker, self.key, self.waits.abort_poll):
            reason = "its task was cancelled"
        elif self.worker.status in (Status.closing, Status.closed, Status.failed):
            reason = "its worker is closing"
        elif self.rendezvous.aborted():
            reason = "another rank of the job failed or the job was cancelled"
        if reason is None:
            return
        if rank is not None:
            # A live rank asked to stop (SIGTERM) leaves at its next step boundary.
            rank.kill(self.waits.term_grace)
            if self._live_left(-1, self.workdir) and reason == "its worker is closing":
                raise _LeftLive(reason)
        msg = (f"rank {self.spec.rank} of job {self.spec.job_name!r} on worker "
               f"{self.spec.worker} was stopped: {reason}")
        err = RankAbortedError(msg, self.spec.rank, self.spec.worker, kind=FailureKind.ABORTED)
        if reason.startswith("another rank"):
            raise self.outcome.root_or(err, self.waits.root_wait)
        raise err

    def _live_left(self, returncode: int, workdir: str) -> bool:
        """In a live job, a rank process that died (not raised) is recorded as lost on the
        job's store, so the survivors re-form at once; whether it was."""
        return self.live is not None and self.live.record(returncode, workdir)

    def _on_output(self, stream: str, line: str) -> None:
        """A line of the rank's captured output, or its end (stream ``"eof"``)."""
        if stream == "stderr":
            self.stderr_tail.append(line)
        if not self.spec.options.stream_output:
            return
        with contextlib.suppress(Exception):
            self.worker.log_event(output_topic(self.spec.job_id),
                                  {"rank": self.spec.rank, "stream": stream, "line": line})
