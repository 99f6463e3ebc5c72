"""The supervisor task: runs in a Dask worker and owns one rank process (internal).

One supervisor task per rank, pinned to its worker. It starts the rank process
(``python -m dask_ddp._rank`` for a function, the user's command for ``run_command``),
watches it, the job-wide abort event and its own task's state, and kills the rank's
process group when the job is aborted, the task is cancelled or the worker closes. Rank
0's supervisor hosts the job's rendezvous store (a ``TCPStore`` on a free port, as
torchrun's agent does) and publishes its address through a Dask ``Variable``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from datetime import timedelta
from typing import IO, Any

from . import _channel, _rankenv
from ._errors import RankAbortedError, RankFailedError, RemoteException
from ._plan import RankSpec, worker_host

logger = logging.getLogger(__name__)

ABORT_POLL_S = 0.5
ERROR_FILE = "error.json"
TERM_GRACE_S = 5.0

# Rank processes alive in this worker, killed if the worker process exits under us.
_LIVE: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()


def abort_event_name(job_id: str) -> str:
    return f"dask-ddp-abort-{job_id}"


def master_variable_name(job_id: str) -> str:
    return f"dask-ddp-master-{job_id}"


def output_topic(job_id: str) -> str:
    return f"dask-ddp-output-{job_id}"


def failure_topic(job_id: str) -> str:
    return f"dask-ddp-failure-{job_id}"


# How fundamental a failure is: a lower value is more likely the root cause of the job's end.
KIND_ORDER = {"lost": 0, "died": 1, "raised-first": 2, "raised": 3, "aborted": 4}
ROOT_WAIT_S = 3.0


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
        self.client = get_client()
        self.abort = Event(abort_event_name(spec.job_id), client=self.client)
        self.stderr_tail: deque[str] = deque(maxlen=30)

    # -- the task -----------------------------------------------------------------------
    def run(self) -> Any:
        spec = self.spec
        store = None
        workdir = tempfile.mkdtemp(prefix=f"dask-ddp-{spec.job_id[:8]}-r{spec.rank}-")
        try:
            if spec.rank == 0:
                store = _host_store(spec)
                port = int(store.port)
                from distributed import Event, Variable
                Variable(master_variable_name(spec.job_id), client=self.client).set(
                    f"{spec.master_addr}:{port}")
                Event(master_variable_name(spec.job_id), client=self.client).set()
            else:
                port = self._await_master_port()
            return self._run_process(port, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            del store  # stops rank 0's rendezvous server and frees its port

    def _await_master_port(self) -> int:
        from distributed import Event, Variable

        name = master_variable_name(self.spec.job_id)
        # Wait on an Event (a timed-out wait is quiet; a timed-out Variable.get logs an
        # error on the scheduler), checking for an abort between waits.
        ready = Event(name, client=self.client)
        deadline = time.monotonic() + self.spec.rendezvous_timeout
        while not ready.wait(timeout=ABORT_POLL_S):
            self._check_stop(None)
            if time.monotonic() > deadline:
                raise self._failed(
                    "rendezvous", "rank 0 did not publish its rendezvous address within "
                    f"{self.spec.rendezvous_timeout:.0f} s", None, "")
        value = Variable(name, client=self.client).get()
        return int(str(value).rsplit(":", 1)[1])

    def _run_process(self, port: int, workdir: str) -> Any:
        spec = self.spec
        env = self._environment(port, workdir)
        read_fd, write_fd = os.pipe()
        env["DASK_DDP_CHANNEL_FD"] = str(write_fd)
        if spec.command is not None:
            argv = list(spec.command)
            if argv[0] in ("python", "python3"):
                argv[0] = sys.executable  # the worker's Python, where dask-ddp is installed
            if sys.platform.startswith("linux"):
                guard = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_guard.py")
                argv = [sys.executable, guard, *argv]
        else:
            with open(os.path.join(workdir, "spec.pkl"), "wb") as f:
                pickle.dump({"payload": spec.payload, "init_kwargs": spec.init_kwargs,
                             "backend": spec.backend, "pass_local_rank": spec.pass_local_rank,
                             "sys_path": list(sys.path), "worker": spec.worker,
                             "rendezvous_timeout": spec.rendezvous_timeout}, f)
            argv = [sys.executable, "-m", "dask_ddp._rank", workdir]
        pipe = subprocess.PIPE if spec.stream_output else None
        try:
            proc = subprocess.Popen(argv, env=env, pass_fds=(write_fd,), stdout=pipe,
                                    stderr=pipe, start_new_session=True, cwd=self._cwd())
        except OSError as exc:
            os.close(read_fd)
            raise self._failed("start", f"could not start {argv[0]!r}: {exc}", exc, "") from exc
        finally:
            os.close(write_fd)
        _LIVE.add(proc)
        fwd = _channel.Forwarder(spec.job_id, spec.rank, read_fd)
        fwd.start()
        pumps = self._start_pumps(proc)
        try:
            self._watch(proc)
        finally:
            _kill_group(proc)
            for t in pumps:
                t.join(10)
            self._log_output("eof", "")
            fwd.close(timeout=30)
        return self._outcome(proc.returncode, workdir)

    def _cwd(self) -> str:
        # The client's directory when this worker has it (a local cluster, a shared file
        # system), so relative paths in a command mean what they meant to the user.
        cwd = self.spec.cwd
        return cwd if cwd and os.path.isdir(cwd) else os.getcwd()

    # -- watching -----------------------------------------------------------------------
    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        # A thread blocks in wait() so the exit is seen at once, while this loop wakes
        # only twice a second: the rank's cores are not shared with a polling loop.
        exited = threading.Event()

        def reap() -> None:
            proc.wait()
            exited.set()

        threading.Thread(target=reap, name=f"dask-ddp-reap-{self.spec.rank}",
                         daemon=True).start()
        while not exited.wait(ABORT_POLL_S):
            self._check_stop(proc)

    def _check_stop(self, proc: subprocess.Popen[bytes] | None) -> None:
        """Raise :class:`RankAbortedError` (after killing the rank) if the rank must stop."""
        from distributed.core import Status

        reason = None
        ts = self.worker.state.tasks.get(self.key)
        if ts is None or ts.state not in ("executing", "long-running"):
            reason = "its task was cancelled"
        elif self.worker.status in (Status.closing, Status.closed, Status.failed):
            reason = "its worker is closing"
        elif self.abort.is_set():
            reason = "another rank of the job failed or the job was cancelled"
        if reason is None:
            return
        if proc is not None:
            _kill_group(proc)
        msg = (f"rank {self.spec.rank} of job {self.spec.job_name!r} on worker "
               f"{self.spec.worker} was stopped: {reason}")
        if reason.startswith("another rank"):
            msg += self._root_cause_note("aborted")
        raise RankAbortedError(msg, self.spec.rank, self.spec.worker, kind="aborted")

    def _outcome(self, returncode: int, workdir: str) -> Any:
        spec = self.spec
        report: dict[str, Any] | None = None
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(workdir, "result.pkl"), "rb") as f:
                report = pickle.load(f)
        if report is not None and report["status"] == "ok" and returncode == 0:
            return pickle.loads(report["value"])
        if spec.command is not None and returncode == 0:
            return 0
        if report is not None and report["status"] == "error":
            cause = _load_exception(report)
            err = self._failed(
                report["phase"], f"{report['type']}: {report['message']}", cause,
                report["traceback"], claimed=report.get("claimed", False))
        elif (recorded := _read_error_file(os.path.join(workdir, ERROR_FILE))) is not None:
            # A script whose main is decorated with torch's @record.
            message, tb = recorded
            err = self._failed("run", message, None, tb)
        else:
            if returncode < 0:
                how = f"was killed by signal {signal.Signals(-returncode).name}"
            else:
                how = f"exited with code {returncode}"
            tail = "\n".join(self.stderr_tail)
            detail = f"\nlast stderr lines:\n{tail}" if tail else ""
            err = self._failed("run", f"the rank process {how}{detail}", None, tail, died=True)
        raise err

    def _failed(self, phase: str, what: str, cause: BaseException | None, tb: str,
                claimed: bool = False, died: bool = False) -> RankFailedError:
        # Tell the peers first: they stop within ABORT_POLL_S instead of waiting in a
        # collective until the backend's timeout.
        with contextlib.suppress(Exception):
            self.abort.set()
        spec = self.spec
        where = f" in {phase}" if phase in ("init_process_group", "rendezvous", "start") else ""
        msg = (f"rank {spec.rank} of job {spec.job_name!r} on worker {spec.worker} "
               f"failed{where}: {what}")
        if tb and not died:
            msg += f"\n\nTraceback from rank {spec.rank}:\n{tb.rstrip()}"
        if cause is None and tb:
            cause = RemoteException(tb)
        kind = "died" if died else "raised-first" if claimed else "raised"
        self._record_failure(kind, msg)
        if kind == "raised":
            msg += self._root_cause_note(kind)
        return RankFailedError(msg, spec.rank, spec.worker, tb, cause, kind)

    def _record_failure(self, kind: str, msg: str) -> None:
        with contextlib.suppress(Exception):
            self.worker.log_event(failure_topic(self.spec.job_id), {
                "rank": self.spec.rank, "kind": kind, "message": msg.split("\n\n")[0]})

    def _root_cause_note(self, kind: str) -> str:
        """Name the failure of another rank that explains ours, if one is reported soon.

        A seed-style ``client.gather(futures)`` raises the first failed future in rank
        order, so every secondary error says what the root cause was.
        """
        deadline = time.monotonic() + ROOT_WAIT_S
        while True:
            try:
                events = self.client.get_events(failure_topic(self.spec.job_id))
            except Exception:
                return ""
            better = [m for _, m in events if m["rank"] != self.spec.rank
                      and KIND_ORDER.get(m["kind"], 3) < KIND_ORDER[kind]]
            if better:
                best = min(better, key=lambda m: (KIND_ORDER.get(m["kind"], 3), m["rank"]))
                return f"\n(root cause: {best['message']})"
            if time.monotonic() > deadline:
                return ""
            time.sleep(0.2)

    # -- process setup ------------------------------------------------------------------
    def _environment(self, port: int, workdir: str) -> dict[str, str]:
        spec = self.spec
        import dask_ddp

        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(dask_ddp.__file__)))
        user_path = spec.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
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
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
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
        env = _rankenv.rank_environment(
            os.environ, _rankenv.nanny_environ(self.worker.nanny is not None),
            _rankenv.pre_spawn_defaults(), spec.env, launcher, spec.local_world_size)
        if spec.storage:
            env["DASK_DDP_STORAGE"] = spec.storage
        if spec.output_dir:
            env["DASK_DDP_OUTPUT_DIR"] = spec.output_dir
        iface = _interface_of(worker_host(spec.worker))
        if iface:
            # The collectives must use the interface the peers reach this worker on, not
            # whatever the host name resolves to.
            env.setdefault("GLOO_SOCKET_IFNAME", iface)
            env.setdefault("NCCL_SOCKET_IFNAME", iface)
        devices = _rotated_devices(env.get("CUDA_VISIBLE_DEVICES"), spec.proc_index,
                                   spec.nprocs_per_worker)
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
        if not self.spec.stream_output:
            return
        with contextlib.suppress(Exception):
            self.worker.log_event(output_topic(self.spec.job_id),
                                  {"rank": self.spec.rank, "stream": stream, "line": line})


def _host_store(spec: RankSpec) -> Any:
    """Start the job's rendezvous store on a free port (port 0: no fixed port, no race)."""
    from torch.distributed import TCPStore

    return TCPStore(spec.master_addr, 0, spec.world_size, True,
                    timedelta(seconds=spec.rendezvous_timeout), wait_for_workers=False)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM then SIGKILL the rank's process group (its DataLoader workers too)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Children left behind by the rank (its group outlives its leader).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    _LIVE.discard(proc)


def _kill_all_live() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            os.killpg(proc.pid, signal.SIGKILL)


def _read_error_file(path: str) -> tuple[str, str] | None:
    """(message, traceback) from a ``TORCHELASTIC_ERROR_FILE`` torch's ``@record`` wrote."""
    import json

    try:
        with open(path) as f:
            data = json.load(f)
        message = data["message"]
        if isinstance(message, str):  # torch's format for errors without a Python trace
            return message, ""
        return str(message["message"]), str(message.get("extraInfo", {}).get("py_callstack", ""))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("cannot read the rank's error file %s: %s", path, exc)
        return None


def _load_exception(report: dict[str, Any]) -> BaseException | None:
    blob = report.get("exception")
    if blob is None:
        return None
    try:
        exc = pickle.loads(blob)
    except Exception:
        return None
    return exc if isinstance(exc, BaseException) else None


def _rotated_devices(visible: str | None, proc_index: int, nprocs: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for process ``proc_index`` of a worker.

    As dask-cuda does per worker, each process sees its own GPU first, so
    ``torch.device(0)`` is a different GPU in each of the worker's rank processes.
    """
    if nprocs <= 1:
        return None
    if visible:
        devices = [d for d in visible.split(",") if d.strip()]
    else:
        devices = [str(i) for i in range(_gpu_count())]
    if not devices:
        return None
    k = proc_index % len(devices)
    return ",".join(devices[k:] + devices[:k])


def _gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _interface_of(host: str) -> str | None:
    """The name of the local network interface holding ``host``'s address, if any."""
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return None
    for name, ip in _interface_addresses():
        if ip == addr:
            return name
    return None


def _interface_addresses() -> Iterator[tuple[str, str]]:
    try:
        import fcntl
        import struct
    except ImportError:  # not Linux: let the backend choose
        return
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            yield name, socket.inet_ntoa(packed[20:24])


def _install_exit_hook() -> None:
    # A worker that exits normally (nanny restart, cluster close) kills its ranks; a worker
    # killed outright is covered by the rank process watching its parent.
    import atexit
    from multiprocessing import util

    atexit.register(_kill_all_live)
    util.Finalize(None, _kill_all_live, exitpriority=100)


_install_exit_hook()
