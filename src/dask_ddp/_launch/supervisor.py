"""The supervisor task: runs in a Dask worker and owns one rank process (internal).

One supervisor task per rank, pinned to its worker. It joins the job's rendezvous (rank 0's
supervisor hosts the store and publishes its address: :mod:`~dask_ddp._launch.rendezvous`),
starts the rank process (:mod:`~dask_ddp._launch.rank_process`), and watches it, the
job-wide abort event and its own task's state: it records the rank's activity on the job's
progress topic, kills the rank's process group when the job is aborted, the task is
cancelled or the worker closes, and turns the rank's end into its task's outcome (the
value, or an error naming the job's root fault).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from dask_ddp._channel.rank_writer import Forwarder
from dask_ddp._channel.wire import metrics_topic
from dask_ddp._dashboard.sampler import RankSampler
from dask_ddp._launch import collective_dump, probe
from dask_ddp._launch.live import leave as live_leave
from dask_ddp._launch.live import store as live_store
from dask_ddp._launch.live.group import mark_dead
from dask_ddp._launch.live.keys import JOIN_ENV, STORE_ENV
from dask_ddp._launch.live.records import LiveLeft
from dask_ddp._launch.names import failure_topic, output_topic, progress_topic
from dask_ddp._launch.placement import RankSpec
from dask_ddp._launch.rank_process import (
    ERROR_FILE,
    RankProcess,
    rank_command,
    rank_cwd,
    rank_environment,
)
from dask_ddp._launch.rendezvous import Rendezvous, RendezvousTimeout
from dask_ddp._launch.root_cause import (
    better_record,
    load_exception,
    looks_collective,
    lost_error,
    read_error_file,
    record_of,
    root_error,
)
from dask_ddp._launch.stacks import peer_stacks_text, read_job_stacks
from dask_ddp._launch.workdir import clean_orphans, create_workdir, remove_workdir
from dask_ddp._states import RankActivity
from dask_ddp.errors import (
    FailureKind,
    JobError,
    RankAbortedError,
    RankFailedError,
    RemoteException,
)

# read_job_stacks lives in dask_ddp._launch.stacks; the job still imports it from here.
__all__ = ["read_job_stacks", "run_rank"]

logger = logging.getLogger(__name__)

_RUNNING_STATES = ("executing", "long-running")


def _waited_for_peers(phase: str, what: str) -> bool:
    """Whether a rank's failure is a wait for its peers that ran out (rendezvous, process
    group setup, a timed-out collective)."""
    text = what.lower()
    return (phase in ("rendezvous", "init_process_group")
            or ("timed out" in text or "timeout" in text))


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
        # The rank's state last recorded on the progress topic, and since when.
        self._reported: tuple[RankActivity, str] | None = (RankActivity.WORKING, "")
        self._reported_since = 0.0
        # The rank's latest c10d collective last recorded (None: none, or still moving).
        self._reported_c10d: dict[str, Any] | None = None
        #: A live job's store (a client, connected before the rank starts).
        self._live_store: Any = None
        if spec.options.recovery == "live":
            with contextlib.suppress(Exception):  # connected again when a loss is recorded
                self._live_store = live_store.connect(
                    spec.options.env[STORE_ENV], self.waits.scheduler_call)

    # -- the task -----------------------------------------------------------------------
    def run(self) -> Any:
        spec = self.spec
        clean_orphans()
        workdir = self.workdir = create_workdir(spec.job_id, spec.rank)
        try:
            if spec.options.env.get(JOIN_ENV):
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
            raise self._failed("rendezvous", str(exc), None, "") from None

    def _run_process(self, port: int, workdir: str) -> Any:
        spec, opts = self.spec, self.spec.options
        env = rank_environment(spec, port, workdir, self.worker.nanny is not None)
        # The job page's sampler of this rank (step counters, metrics, CPU, RSS).
        sampler = RankSampler(self.worker, spec.job_id, spec.rank, workdir)
        env.update(sampler.environment())
        read_fd, write_fd = os.pipe()
        env["DASK_DDP_CHANNEL_FD"] = str(write_fd)
        argv = rank_command(spec, workdir, env)
        try:
            rank = RankProcess.start(argv, env, rank_cwd(spec), (write_fd,), opts.stream_output,
                                     job_id=spec.job_id, job_name=spec.job_name,
                                     rank=spec.rank, workdir=workdir)
        except OSError as exc:
            os.close(read_fd)
            raise self._failed("start", f"could not start {argv[0]!r}: {exc}", exc, "") from exc
        finally:
            os.close(write_fd)
        fwd = Forwarder(spec.job_id, spec.rank, read_fd,
                        tap=(metrics_topic(spec.job_id), sampler.tap))
        fwd.start()
        sampler.start(rank.pid)
        rank.start_pumps(self._on_output)
        if spec.options.env.get(STORE_ENV) is not None:
            live_leave.register(rank)  # a closing worker lets it leave first
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
        return self._outcome(rank.returncode, workdir, rank)

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
        if self.spec.options.recovery == "live":
            # The survivors wait for this record: made the moment the process is gone.
            threading.Thread(target=lambda: exited.wait() and self._live_left(-1, self.workdir),
                             name=f"dask-ddp-live-loss-{self.spec.rank}", daemon=True).start()
        state = probe.RankState(self.workdir)
        try:
            while not exited.wait(self.waits.abort_poll):
                self._check_stop(rank)
                self._observe(rank, state)
            # The rank's last state (returned, most often) at once: the stall rule must
            # not see it still blocked in a collective that completed as its peer ended.
            with contextlib.suppress(Exception):
                self._observe(rank, state)
        finally:
            state.close()

    def _observe(self, rank: RankProcess, state: probe.RankState) -> None:
        """Record on the job's progress topic when the rank's activity changes: blocked in
        a collective (for ``blocked_after``), working again, returned, frozen; and its
        latest c10d collective (:func:`~dask_ddp._launch.probe.latest_c10d`) once that has
        stood still for ``blocked_after`` (a moving count is work: nothing is recorded
        while a rank trains, one record when it stops issuing collectives)."""
        seen = state.read()
        now = time.time()
        if rank.is_stopped():
            current: tuple[RankActivity, str] = (RankActivity.FROZEN, "")
            age = 0.0 if self._reported is None or self._reported[0] is not RankActivity.FROZEN \
                else now - self._reported_since
        elif seen is None:
            return
        else:
            what, name, age = seen
            if what is RankActivity.BLOCKED and age < self.waits.blocked_after:
                # A collective that completes soon is work.
                what, name, age = RankActivity.WORKING, "", 0.0
            current = (what, name)
        c10d = state.read_c10d()
        if c10d is not None and now - float(c10d.get("since", now)) < self.waits.blocked_after:
            c10d = None
        if current == self._reported and c10d == self._reported_c10d:
            return
        if current != self._reported:
            self._reported, self._reported_since = current, now - age
        self._reported_c10d = c10d
        try:
            self.worker.log_event(progress_topic(self.spec.job_id), {
                "rank": self.spec.rank, "worker": self.spec.worker, "state": current[0].value,
                "collective": current[1], "since": self._reported_since, "c10d": c10d})
        except Exception as exc:  # the next change is recorded again
            logger.warning("rank %d of job %r: recording its state failed: %s",
                           self.spec.rank, self.spec.job_name, exc)

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
            raise self._root_or(err, self.waits.root_wait)
        raise err

    def _live_left(self, returncode: int, workdir: str) -> bool:
        """In a live job, a rank process that died (not raised) is recorded as lost on the
        job's store, so the survivors re-form at once; whether it was."""
        address = self.spec.options.env.get(STORE_ENV)
        if address is None or returncode == 0 \
                or os.path.exists(os.path.join(workdir, "result.pkl")):
            return False
        try:
            if self._live_store is None:
                self._live_store = live_store.connect(address, self.waits.scheduler_call)
            mark_dead(self._live_store, self.spec.rank)
        except Exception as exc:  # the survivors wait for the scheduler's notice instead
            logger.warning("rank %d of job %r: recording its loss failed: %s",
                           self.spec.rank, self.spec.job_name, exc)
        return True

    def _outcome(self, returncode: int, workdir: str, rank: RankProcess) -> Any:
        spec = self.spec
        report: dict[str, Any] | None = None
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(workdir, "result.pkl"), "rb") as f:
                report = pickle.load(f)
        if report is not None and report["status"] == "ok" and returncode == 0:
            return pickle.loads(report["value"])
        if spec.options.command is not None and returncode == 0:
            return 0
        if report is not None and report["status"] == "error":
            victim = looks_collective(report["type"], report["message"])
            err = self._failed(
                report["phase"], f"{report['type']}: {report['message']}",
                load_exception(report), report["traceback"],
                claimed=report.get("claimed", False), broken=victim)
        elif (recorded := read_error_file(os.path.join(workdir, ERROR_FILE))) is not None:
            # A script whose main is decorated with torch's @record.
            message, tb = recorded
            victim = looks_collective("", message)
            err = self._failed("run", message, None, tb, broken=victim)
        else:
            oom = rank.oom_reason() if returncode == -signal.SIGKILL else None
            if oom is not None:
                how = f"was {oom}"
            elif returncode < 0:
                how = f"was killed by signal {signal.Signals(-returncode).name}"
            else:
                how = f"exited with code {returncode}"
            tail = "\n".join(self.stderr_tail)
            detail = f"\nlast stderr lines:\n{tail}" if tail else ""
            # A collective's timeout (NCCL's watchdog) dumped the rank's last collectives.
            detail += collective_dump.dump_summary(workdir, spec.rank)
            victim = returncode > 0 and looks_collective("", tail)
            err = self._failed("run", f"the rank process {how}{detail}", None, tail, died=True,
                               broken=victim)
        # A rank whose collective broke (or that raised after another rank) is likely the
        # victim of a peer's fault: wait a moment to learn it and raise that instead.
        secondary = victim or err.kind is FailureKind.RAISED
        wait = self.waits.root_wait if secondary else 0.0
        if victim and spec.options.stall_timeout is not None:
            # A stall's record is published once the watcher read the ranks' stacks: a
            # collective that broke meanwhile (a peer ended) waits for it that much longer.
            wait += self.waits.stacks_timeout
        raise self._root_or(err, wait, broken=victim)

    def _failed(self, phase: str, what: str, cause: BaseException | None, tb: str,
                claimed: bool = False, died: bool = False,
                broken: bool = False) -> RankFailedError:
        """The rank's error, published on the job's failure topic (``broken``: it says the
        rank's collective broke, see :func:`~dask_ddp._launch.root_cause.better_record`)."""
        # A rank that gave up waiting for its peers: what they were doing is the diagnosis
        # (read before the abort below stops them; by the first rank to give up only, so
        # that many ranks timing out together do not all read every rank's stack).
        peers = (peer_stacks_text(self.client, self.spec, self.waits.stacks_timeout)
                 if _waited_for_peers(phase, what) and not self.rendezvous.aborted() else "")
        # Tell the peers first: they stop within one abort poll instead of waiting in a
        # collective until the backend's timeout.
        self.rendezvous.abort()
        spec = self.spec
        where = f" in {phase}" if phase in ("init_process_group", "rendezvous", "start") else ""
        msg = (f"rank {spec.rank} of job {spec.job_name!r} on worker {spec.worker} "
               f"failed{where}: {what}")
        if tb and not died:
            msg += f"\n\nTraceback from rank {spec.rank}:\n{tb.rstrip()}"
        msg += peers
        if cause is None and tb:
            cause = RemoteException(tb)
        kind = (FailureKind.DIED if died else
                FailureKind.RAISED_FIRST if claimed else FailureKind.RAISED)
        err = RankFailedError(msg, spec.rank, spec.worker, tb, cause, kind)
        self._publish({**record_of(err), "broken": broken})
        return err

    def _on_output(self, stream: str, line: str) -> None:
        """A line of the rank's captured output, or its end (stream ``"eof"``)."""
        if stream == "stderr":
            self.stderr_tail.append(line)
        if not self.spec.options.stream_output:
            return
        with contextlib.suppress(Exception):
            self.worker.log_event(output_topic(self.spec.job_id),
                                  {"rank": self.spec.rank, "stream": stream, "line": line})

    def _publish(self, record: Mapping[str, Any]) -> None:
        with contextlib.suppress(Exception):
            self.worker.log_event(failure_topic(self.spec.job_id), dict(record))

    def _root_or(self, err: JobError, wait: float, broken: bool = False) -> JobError:
        """The job's root fault, if another rank's fault is more fundamental than ``err``
        (``err`` chained as its ``__cause__``), else ``err``. ``broken``: ``err`` says the
        rank's collective broke.

        A seed-style ``client.gather(futures)`` raises the first failed future in rank
        order: so every future of the job names the root cause. Waits up to ``wait``
        seconds for the fault to be known (a peer's failure record, or its worker gone).
        """
        deadline = time.monotonic() + wait
        while True:
            best = self._better_fault(err.kind, broken)
            if best is not None:
                return root_error(best, err)
            if time.monotonic() >= deadline:
                return err
            time.sleep(0.2)

    def _better_fault(self, kind: FailureKind, broken: bool) -> Mapping[str, Any] | None:
        records: list[Mapping[str, Any]] = []
        with contextlib.suppress(Exception):
            records = [m for _, m in self.client.sync(
                self.client.scheduler.events, topic=failure_topic(self.spec.job_id),
                callback_timeout=self.waits.scheduler_call)]
        records += self._lost_peers()
        return better_record(records, self.spec.rank, kind, broken)

    def _lost_peers(self) -> list[dict[str, Any]]:
        """Failure records of the ranks whose worker left the cluster (published too)."""
        spec = self.spec
        peers = sorted(set(spec.workers) - {spec.worker})
        if not peers:
            return []
        try:
            present = self.client.sync(self.client.scheduler.ncores, workers=peers,
                                       callback_timeout=self.waits.scheduler_call)
        except Exception:
            return []
        lost = [record_of(lost_error(spec.job_name, r, w)) for r, w in enumerate(spec.workers)
                if w in peers and w not in present]
        for record in lost[:1]:
            self._publish(record)
        return lost
