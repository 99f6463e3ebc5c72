"""The supervisor task: runs in a Dask worker and owns one rank process (internal).

One supervisor task per rank, pinned to its worker. It starts the rank process
(``python -m dask_ddp._launch.rank`` for a function, the user's command for ``run_command``),
watches it, the job-wide abort event and its own task's state, and kills the rank's
process group when the job is aborted, the task is cancelled or the worker closes. Rank
0's supervisor hosts the job's rendezvous store (a ``TCPStore`` on a free port, as
torchrun's agent does) and publishes its address through a Dask ``Variable``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from datetime import timedelta
from typing import IO, Any

from dask_ddp._channel.rank_writer import Forwarder
from dask_ddp._channel.wire import metrics_topic
from dask_ddp._dashboard.sampler import RankSampler
from dask_ddp._launch import probe, rank_env, stall
from dask_ddp._launch.names import (
    abort_event_name,
    failure_topic,
    master_variable_name,
    output_topic,
    progress_topic,
)
from dask_ddp._launch.placement import RankSpec, worker_host
from dask_ddp._launch.root_cause import (
    better_record,
    load_exception,
    looks_collective,
    lost_error,
    read_error_file,
    record_of,
    root_error,
)
from dask_ddp._launch.workdir import clean_orphans, create_workdir, remove_workdir
from dask_ddp.errors import (
    FailureKind,
    JobError,
    RankAbortedError,
    RankFailedError,
    RemoteException,
)

logger = logging.getLogger(__name__)

ERROR_FILE = "error.json"

# Rank processes alive in this worker, killed if the worker process exits under us.
_LIVE: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()
# The ranks this worker supervises now, by (job id, rank): where stack requests go.
_RUNNING: dict[tuple[str, int], tuple[str, subprocess.Popen[bytes], str]] = {}
_running_lock = threading.Lock()


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


class _Supervisor:
    def __init__(self, spec: RankSpec, worker: Any, key: Any) -> None:
        from distributed import Event, get_client

        self.spec = spec
        self.worker = worker
        self.key = key
        self.client: Any = get_client()
        self.abort = Event(abort_event_name(spec.job_id), client=self.client)
        self.stderr_tail: deque[str] = deque(maxlen=30)
        self.waits = spec.options.waits
        self.workdir = ""
        # The rank's state last recorded on the progress topic, and since when.
        self._reported: tuple[str, str] | None = ("working", "")
        self._reported_since = 0.0

    # -- the task -----------------------------------------------------------------------
    def run(self) -> Any:
        spec = self.spec
        store = None
        clean_orphans()
        workdir = self.workdir = create_workdir(spec.job_id, spec.rank)
        try:
            if spec.rank == 0:
                store = _host_store(spec)
                port = int(store.port)
                self._publish_master(port)
            else:
                port = self._await_master_port()
            return self._run_process(port, workdir)
        finally:
            if spec.rank == 0 and store is not None:
                # However rank 0 ended, its address is of no use any more; the client's
                # cleanup may have run before it was published (a cancel that reached this
                # worker only after the publish).
                self._withdraw_master()
            remove_workdir(workdir)
            del store  # stops rank 0's rendezvous server and frees its port

    def _publish_master(self, port: int) -> None:
        """Publish rank 0's rendezvous address; taken back when the job ended meanwhile
        (its client's cleanup may have run before this: nothing of it must stay)."""
        from distributed import Event, Variable

        name = master_variable_name(self.spec.job_id)
        Variable(name, client=self.client).set(f"{self.spec.master_addr}:{port}")
        Event(name, client=self.client).set()
        self._check_stop(None)  # the run's end withdraws the address

    def _withdraw_master(self) -> None:
        """Take rank 0's rendezvous address back off the scheduler (never raises)."""
        from distributed import Variable

        name = master_variable_name(self.spec.job_id)
        # Dask deletes a Variable through a stream message (no reply to wait for).
        with contextlib.suppress(Exception):
            Variable(name, client=self.client).delete()
        with contextlib.suppress(Exception):
            self.client.sync(self.client.scheduler.event_clear, name=name,
                             callback_timeout=self.waits.scheduler_call)

    def _await_master_port(self) -> int:
        from distributed import Event, Variable

        name = master_variable_name(self.spec.job_id)
        # Wait on an Event (a timed-out wait is quiet; a timed-out Variable.get logs an
        # error on the scheduler), checking for an abort between waits.
        ready = Event(name, client=self.client)
        deadline = time.monotonic() + self.spec.options.rendezvous_timeout
        while not ready.wait(timeout=self.waits.abort_poll):
            self._check_stop(None)
            if time.monotonic() > deadline:
                raise self._failed(
                    "rendezvous", "rank 0 did not publish its rendezvous address within "
                    f"{self.spec.options.rendezvous_timeout:.0f} s", None, "")
        # The Event was set after the Variable; the Variable can still be gone (the job
        # ended in between): read it with a bound, checking for the job's end between reads.
        variable = Variable(name, client=self.client)
        while True:
            try:
                value = variable.get(timeout=max(self.waits.abort_poll, 1.0))
                return int(str(value).rsplit(":", 1)[1])
            except TimeoutError:
                self._check_stop(None)
                if time.monotonic() > deadline:
                    raise self._failed(
                        "rendezvous", "rank 0's rendezvous address was withdrawn (its job "
                        "ended) and not published again within "
                        f"{self.spec.options.rendezvous_timeout:.0f} s", None, "") from None

    def _run_process(self, port: int, workdir: str) -> Any:
        spec, opts = self.spec, self.spec.options
        env = self._environment(port, workdir)
        # The job page's sampler of this rank (step counters, metrics, CPU, RSS).
        sampler = RankSampler(self.worker, spec.job_id, spec.rank, workdir)
        env.update(sampler.environment())
        read_fd, write_fd = os.pipe()
        env["DASK_DDP_CHANNEL_FD"] = str(write_fd)
        if opts.command is not None:
            argv = list(opts.command)
            if argv[0] in ("python", "python3"):
                argv[0] = sys.executable  # the worker's Python, where dask-ddp is installed
                if len(argv) > 1 and argv[1].endswith(".py") and os.path.isfile(argv[1]):
                    # A script runs behind the probe (stall detection, live stacks).
                    argv[1:2] = ["-m", "dask_ddp._launch.script", argv[1]]
                    env["DASK_DDP_WORKDIR"] = workdir
            if sys.platform.startswith("linux"):
                guard = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tether.py")
                argv = [sys.executable, guard, *argv]
        else:
            with open(os.path.join(workdir, "spec.pkl"), "wb") as f:
                pickle.dump({"payload": opts.payload, "init_kwargs": opts.init_kwargs,
                             "backend": opts.backend, "pass_local_rank": opts.pass_local_rank,
                             "sys_path": list(sys.path), "worker": spec.worker,
                             "rendezvous_timeout": opts.rendezvous_timeout}, f)
            argv = [sys.executable, "-m", "dask_ddp._launch.rank", workdir]
        pipe = subprocess.PIPE if opts.stream_output else None
        try:
            proc = subprocess.Popen(argv, env=env, pass_fds=(write_fd,), stdout=pipe,
                                    stderr=pipe, start_new_session=True, cwd=self._cwd())
        except OSError as exc:
            os.close(read_fd)
            raise self._failed("start", f"could not start {argv[0]!r}: {exc}", exc, "") from exc
        finally:
            os.close(write_fd)
        _install_exit_hook()
        _LIVE.add(proc)
        with _running_lock:
            _RUNNING[(spec.job_id, spec.rank)] = (spec.job_name, proc, workdir)
        fwd = Forwarder(spec.job_id, spec.rank, read_fd,
                        tap=(metrics_topic(spec.job_id), sampler.tap))
        fwd.start()
        sampler.start(proc.pid)
        pumps = self._start_pumps(proc)
        try:
            self._watch(proc)
        finally:
            with _running_lock:
                _RUNNING.pop((spec.job_id, spec.rank), None)
            _kill_group(proc, self.waits.term_grace)
            for t in pumps:
                t.join(10)
            self._log_output("eof", "")
            self._close_forwarder(fwd)
            sampler.stop(proc.returncode)
        return self._outcome(proc.returncode, workdir)

    def _close_forwarder(self, fwd: Forwarder) -> None:
        """Hand the rank's last records on; a failure here never hides the rank's outcome."""
        try:
            fwd.close(timeout=self.waits.forward_close)
        except Exception as exc:
            logger.error("rank %d of job %r: %s", self.spec.rank, self.spec.job_name, exc)
        if not self._task_running():
            # Nobody reads this job's records any more (its client let go of the job):
            # free its topic on the scheduler, after this rank's last put; and once more
            # after a read the dead client left in flight could have made it again.
            for pause in (0.0, self.waits.reclose):
                time.sleep(pause)
                with contextlib.suppress(Exception):
                    self.client.sync(self.client.scheduler.dask_ddp_results_close,
                                     topic=metrics_topic(self.spec.job_id),
                                     callback_timeout=self.waits.scheduler_call)

    def _cwd(self) -> str:
        # The client's directory when this worker has it (a local cluster, a shared file
        # system), so relative paths in a command mean what they meant to the user.
        cwd = self.spec.options.cwd
        return cwd if cwd and os.path.isdir(cwd) else os.getcwd()

    # -- watching -----------------------------------------------------------------------
    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        # A thread blocks in wait() so the exit is seen at once, while this loop wakes
        # only twice a second: the rank's cores are not shared with a polling loop.
        exited = threading.Event()

        def reap() -> None:
            _wait_exit(proc, None)
            exited.set()

        threading.Thread(target=reap, name=f"dask-ddp-reap-{self.spec.rank}",
                         daemon=True).start()
        state = probe.RankState(self.workdir)
        try:
            while not exited.wait(self.waits.abort_poll):
                self._check_stop(proc)
                self._observe(proc, state)
        finally:
            state.close()

    def _observe(self, proc: subprocess.Popen[bytes], state: probe.RankState) -> None:
        """Record on the job's progress topic when the rank's state changes: blocked in a
        collective (for ``blocked_after``), working again, returned, frozen."""
        seen = state.read()
        now = time.time()
        if probe.is_stopped(proc.pid):
            current: tuple[str, str] = ("frozen", "")
            age = 0.0 if self._reported is None or self._reported[0] != "frozen" \
                else now - self._reported_since
        elif seen is None:
            return
        else:
            what, name, age = seen
            if what == "collective":
                if age < self.waits.blocked_after:
                    what, name, age = "working", "", 0.0
                else:
                    what = "blocked"
            current = (what, name)
        if current == self._reported:
            return
        self._reported, self._reported_since = current, now - age
        try:
            self.worker.log_event(progress_topic(self.spec.job_id), {
                "rank": self.spec.rank, "worker": self.spec.worker, "state": current[0],
                "collective": current[1], "since": now - age})
        except Exception as exc:  # the next change is recorded again
            logger.warning("rank %d of job %r: recording its state failed: %s",
                           self.spec.rank, self.spec.job_name, exc)

    def _check_stop(self, proc: subprocess.Popen[bytes] | None) -> None:
        """Raise :class:`RankAbortedError` (after killing the rank) if the rank must stop."""
        from distributed.core import Status

        reason = None
        if not self._task_running():
            reason = "its task was cancelled"
        elif self.worker.status in (Status.closing, Status.closed, Status.failed):
            reason = "its worker is closing"
        elif self._aborted():
            reason = "another rank of the job failed or the job was cancelled"
        if reason is None:
            return
        if proc is not None:
            _kill_group(proc, self.waits.term_grace)
        msg = (f"rank {self.spec.rank} of job {self.spec.job_name!r} on worker "
               f"{self.spec.worker} was stopped: {reason}")
        err = RankAbortedError(msg, self.spec.rank, self.spec.worker, kind=FailureKind.ABORTED)
        if reason.startswith("another rank"):
            raise self._root_or(err, self.waits.root_wait)
        raise err

    def _aborted(self) -> bool:
        """Whether the job's abort event is set; a scheduler that does not answer within
        ``scheduler-call`` counts as "not yet" (the next poll asks again)."""
        try:
            return bool(self.client.sync(self.client.scheduler.event_is_set,
                                         name=abort_event_name(self.spec.job_id),
                                         callback_timeout=self.waits.scheduler_call))
        except (TimeoutError, OSError) as exc:
            logger.warning("rank %d of job %r: the abort event could not be read: %s",
                           self.spec.rank, self.spec.job_name, exc)
            return False

    def _task_running(self) -> bool:
        """Whether this rank's task still runs, read on the worker's event loop (the
        worker's state is not thread-safe)."""
        async def running() -> bool:
            ts = self.worker.state.tasks.get(self.key)
            return ts is not None and ts.state in _RUNNING_STATES

        try:
            fut = asyncio.run_coroutine_threadsafe(running(), self.worker.loop.asyncio_loop)
        except Exception:  # the loop is gone: the worker is closing
            return False
        try:
            return fut.result(timeout=self.waits.abort_poll)
        except concurrent.futures.TimeoutError:
            # The worker's loop is busy (a long task holding the GIL, a slow handler): no
            # answer is not "cancelled"; the next poll asks again.
            fut.cancel()
            return True
        except Exception:
            return False

    def _outcome(self, returncode: int, workdir: str) -> Any:
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
            err = self._failed(
                report["phase"], f"{report['type']}: {report['message']}",
                load_exception(report), report["traceback"],
                claimed=report.get("claimed", False))
            victim = looks_collective(report["type"], report["message"])
        elif (recorded := read_error_file(os.path.join(workdir, ERROR_FILE))) is not None:
            # A script whose main is decorated with torch's @record.
            message, tb = recorded
            err = self._failed("run", message, None, tb)
            victim = looks_collective("", message)
        else:
            if returncode < 0:
                how = f"was killed by signal {signal.Signals(-returncode).name}"
            else:
                how = f"exited with code {returncode}"
            tail = "\n".join(self.stderr_tail)
            detail = f"\nlast stderr lines:\n{tail}" if tail else ""
            err = self._failed("run", f"the rank process {how}{detail}", None, tail, died=True)
            victim = returncode > 0 and looks_collective("", tail)
        # A rank whose collective broke (or that raised after another rank) is likely the
        # victim of a peer's fault: wait a moment to learn it and raise that instead.
        secondary = victim or err.kind is FailureKind.RAISED
        raise self._root_or(err, self.waits.root_wait if secondary else 0.0)

    def _failed(self, phase: str, what: str, cause: BaseException | None, tb: str,
                claimed: bool = False, died: bool = False) -> RankFailedError:
        # A rank that gave up waiting for its peers: what they were doing is the diagnosis
        # (read before the abort below stops them; by the first rank to give up only, so
        # that many ranks timing out together do not all read every rank's stack).
        peers = (self._peer_stacks()
                 if _waited_for_peers(phase, what) and not self._aborted() else "")
        # Tell the peers first: they stop within one abort poll instead of waiting in a
        # collective until the backend's timeout.
        with contextlib.suppress(Exception):
            self.abort.set()
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
        self._publish(record_of(err))
        return err

    def _peer_stacks(self) -> str:
        """The other ranks' live stacks, and the ranks with no process, as message text."""
        spec, wait = self.spec, self.waits.stacks_timeout

        try:
            stacks = self.client.sync(read_job_stacks, self.client, spec.job_id,
                                      list(spec.workers), wait, callback_timeout=wait + 10)
        except Exception as exc:  # the error it goes into matters more
            return f"\n\n(the other ranks' stacks could not be read: {exc})"
        stacks.pop(spec.rank, None)
        text = ""
        if stacks:
            text += ("\n\nPython stacks of the other ranks still running:\n"
                     + stall.stacks_text(stacks, list(spec.workers)))
        missing = [r for r in range(len(spec.workers)) if r != spec.rank and r not in stacks]
        if missing:
            text += ("\n\nranks with no process running: "
                     + ", ".join(f"{r} (worker {spec.workers[r]})" for r in missing)
                     + ": not started yet (its worker busy with other tasks, or waiting "
                     "for rank 0's rendezvous address), or already ended")
        return text

    def _publish(self, record: Mapping[str, Any]) -> None:
        with contextlib.suppress(Exception):
            self.worker.log_event(failure_topic(self.spec.job_id), dict(record))

    def _root_or(self, err: JobError, wait: float) -> JobError:
        """The job's root fault, if another rank's fault is more fundamental than ``err``
        (``err`` chained as its ``__cause__``), else ``err``.

        A seed-style ``client.gather(futures)`` raises the first failed future in rank
        order: so every future of the job names the root cause. Waits up to ``wait``
        seconds for the fault to be known (a peer's failure record, or its worker gone).
        """
        deadline = time.monotonic() + wait
        while True:
            best = self._better_fault(err.kind)
            if best is not None:
                return root_error(best, err)
            if time.monotonic() >= deadline:
                return err
            time.sleep(0.2)

    def _better_fault(self, kind: FailureKind) -> Mapping[str, Any] | None:
        records: list[Mapping[str, Any]] = []
        with contextlib.suppress(Exception):
            records = [m for _, m in self.client.sync(
                self.client.scheduler.events, topic=failure_topic(self.spec.job_id),
                callback_timeout=self.waits.scheduler_call)]
        records += self._lost_peers()
        return better_record(records, self.spec.rank, kind)

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

    # -- process setup ------------------------------------------------------------------
    def _environment(self, port: int, workdir: str) -> dict[str, str]:
        spec = self.spec
        import dask_ddp

        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(dask_ddp.__file__)))
        user_path = spec.options.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        launcher = {
            "PYTHONPATH": os.pathsep.join(p for p in (pkg_root, user_path) if p),
            "RANK": str(spec.rank),
            "LOCAL_RANK": str(spec.local_rank),
            "WORLD_SIZE": str(spec.world_size),
            "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "GROUP_RANK": str(spec.group_rank),
            "GROUP_WORLD_SIZE": str(spec.group_world_size),
            "ROLE_RANK": str(spec.rank),
            "ROLE_NAME": "default",
            "ROLE_WORLD_SIZE": str(spec.world_size),
            "MASTER_ADDR": spec.master_addr,
            "MASTER_PORT": str(port),
            # Lightning, Accelerate and torch.distributed.is_torchelastic_launched() read
            # this as "launched by torchrun" (without it Lightning on SLURM-started workers
            # believes SLURM launched each rank alone).
            "TORCHELASTIC_RUN_ID": spec.run_id or spec.job_id,
            "TORCHELASTIC_RESTART_COUNT": str(spec.restart),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.options.max_restarts),
            # torch's @record writes a failing rank's traceback here; read back on failure.
            "TORCHELASTIC_ERROR_FILE": os.path.join(workdir, ERROR_FILE),
            # Rank 0's supervisor hosts the store: every rank, rank 0 included, is a
            # client of it (the contract torchrun's agent uses, honoured by env://).
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "DASK_DDP_JOB_ID": spec.job_id,
            "DASK_DDP_JOB_NAME": spec.job_name,
            "DASK_DDP_RESTART": str(spec.restart),
            "DASK_DDP_SCHEDULER": spec.scheduler,
            "DASK_DDP_WORKER": spec.worker,
            "DASK_DDP_SUPERVISOR_PID": str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
        }
        # The worker's environment less what the nanny added for the worker process
        # itself (MALLOC_TRIM_THRESHOLD_ doubles a CPU step), then the job's, then ours.
        env = rank_env.rank_environment(
            os.environ, rank_env.nanny_environ(self.worker.nanny is not None),
            rank_env.pre_spawn_defaults(), spec.options.env, launcher, spec.local_world_size)
        if spec.options.storage:
            env["DASK_DDP_STORAGE"] = spec.options.storage
        if spec.options.output_dir:
            env["DASK_DDP_OUTPUT_DIR"] = spec.options.output_dir
        iface = rank_env.interface_of(worker_host(spec.worker))
        if iface:
            # The collectives must use the interface the peers reach this worker on, not
            # whatever the host name resolves to.
            env.setdefault("GLOO_SOCKET_IFNAME", iface)
            env.setdefault("NCCL_SOCKET_IFNAME", iface)
        devices = rank_env.rotated_devices(env.get("CUDA_VISIBLE_DEVICES"), spec.proc_index,
                                   spec.options.nprocs_per_worker)
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        return env

    def _start_pumps(self, proc: subprocess.Popen[bytes]) -> list[threading.Thread]:
        threads = []
        for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            if stream is None:
                continue
            t = threading.Thread(target=self._pump, args=(stream, name), daemon=True,
                                 name=f"dask-ddp-{name}-{self.spec.rank}")
            t.start()
            threads.append(t)
        return threads

    def _pump(self, stream: IO[bytes], name: str) -> None:
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                if name == "stderr":
                    self.stderr_tail.append(line)
                self._log_output(name, line)

    def _log_output(self, stream: str, line: str) -> None:
        if not self.spec.options.stream_output:
            return
        with contextlib.suppress(Exception):
            self.worker.log_event(output_topic(self.spec.job_id),
                                  {"rank": self.spec.rank, "stream": stream, "line": line})


def _host_store(spec: RankSpec) -> Any:
    """Start the job's rendezvous store on a free port (port 0: no fixed port, no race)."""
    from torch.distributed import TCPStore

    return TCPStore(spec.master_addr, 0, spec.world_size, True,
                    timedelta(seconds=spec.options.rendezvous_timeout), wait_for_workers=False)


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float | None) -> bool:
    """Wait until the rank process exited, without reaping it (``WNOWAIT``): while it is
    not reaped its pid, which is its process group's id, cannot be reused, so a later
    ``killpg`` reaches its own group and no stranger's. True once it exited."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if proc.returncode is not None:
            return True
        flags = os.WEXITED | os.WNOWAIT | (os.WNOHANG if deadline is not None else 0)
        try:
            if os.waitid(os.P_PID, proc.pid, flags) is not None:
                return True
        except ChildProcessError:
            return True  # reaped already
        if deadline is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _kill_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM then SIGKILL the rank's process group (its DataLoader workers too); the
    rank is reaped only after its group was killed (see :func:`_wait_exit`)."""
    if not _wait_exit(proc, 0.0):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        if not _wait_exit(proc, grace):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _wait_exit(proc, None)
    # Children left behind by the rank (its group outlives its leader).
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _LIVE.discard(proc)


async def collect_stacks(job: str, timeout: float,
                         dask_worker: Any = None) -> dict[str, dict[str, Any]]:
    """The live Python stacks of the ranks of ``job`` (an id, an id's prefix of at least 8
    characters, or a name; ``""``: every job) that this worker supervises.

    Run on a worker with ``client.run``: ``{job_id: {"name": str, "stacks": {rank: text}}}``.
    """
    with _running_lock:
        chosen = [(key, entry) for key, entry in _RUNNING.items()
                  if not job or entry[0] == job or key[0] == job
                  or (len(job) >= 8 and key[0].startswith(job))]
    texts = await asyncio.gather(*(
        asyncio.to_thread(probe.read_stacks, proc.pid, workdir, timeout)
        for _, (_, proc, workdir) in chosen))
    found: dict[str, dict[str, Any]] = {}
    for ((job_id, rank), (name, _, _)), text in zip(chosen, texts, strict=True):
        found.setdefault(job_id, {"name": name, "stacks": {}})["stacks"][rank] = text
    return found


async def read_job_stacks(client: Any, job_id: str, workers: list[str],
                          timeout: float) -> dict[int, str]:
    """The live stacks of job ``job_id``'s running ranks on ``workers``, by rank."""
    replies = await client.run(collect_stacks, job_id, timeout, workers=sorted(set(workers)),
                               on_error="return", asynchronous=True)
    stacks: dict[int, str] = {}
    for reply in replies.values():
        if isinstance(reply, dict) and job_id in reply:
            stacks.update(reply[job_id]["stacks"])
    return dict(sorted(stacks.items()))


def _kill_all_live() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            os.killpg(proc.pid, signal.SIGKILL)


_exit_hook_installed = False


def _install_exit_hook() -> None:
    """Kill this process's live ranks when it exits (installed with its first rank).

    A worker that exits normally (nanny restart, cluster close) kills its ranks; a worker
    killed outright is covered by the rank process watching its parent.
    """
    global _exit_hook_installed
    with _exit_hook_lock:
        if _exit_hook_installed:
            return
        _exit_hook_installed = True
    import atexit
    from multiprocessing import util

    atexit.register(_kill_all_live)
    util.Finalize(None, _kill_all_live, exitpriority=100)


_exit_hook_lock = threading.Lock()
