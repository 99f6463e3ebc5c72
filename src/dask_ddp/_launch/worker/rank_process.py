"""A rank's process, seen from its supervisor: what it runs, starting, watching, killing it
(internal).

- **What it runs** (:func:`rank_command`, :func:`rank_environment`, :func:`rank_cwd`): the
  argv (the rank module with its launch record for a function, the user's command behind
  the tether for ``run_command``), the torchrun-style environment and the directory.
- **Starting it** (:func:`start_process`): the one place a rank's process is made, from
  (argv, env, cwd, pass_fds, capture-output flag); a warm start plugs in here.
- **Its life** (:class:`RankProcess`): waiting for its exit without reaping it, killing its
  process group, its output pumps, and the registry of this worker's running ranks (where
  stack requests go; killed when the worker process exits).

Every use of the process object (its pid, exit code, pipes, ``waitid``, ``killpg``) is in
this module: the supervisor holds a :class:`RankProcess`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from dask_ddp._launch.wire.entry_points import RANK_MODULE, SCRIPT_MODULE, TETHER_SCRIPT
from dask_ddp._launch.wire.launch_record import LaunchRecord
from dask_ddp._launch.wire.rank_spec import RankSpec, worker_host
from dask_ddp._launch.worker import at_exit, collective_dump, oom, probe, rank_env, warm

#: torch's ``@record`` writes a failing rank's traceback here (``TORCHELASTIC_ERROR_FILE``).
ERROR_FILE = "error.json"
#: The folder holding the ``dask_ddp`` package (``src/`` in a checkout): the ranks'
#: ``PYTHONPATH`` starts with it, so a rank imports the worker's dask-ddp.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

# Rank processes alive in this worker, killed if the worker process exits under us.
_LIVE: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()
# The ranks this worker supervises now, by (job id, rank): where stack requests go.
_RUNNING: dict[tuple[str, int], RankProcess] = {}
_running_lock = threading.Lock()


# ------------------------------------------------------------------- what the rank runs


def rank_command(spec: RankSpec, workdir: str, env: dict[str, str]) -> list[str]:
    """The rank's argv; for a function, writes its launch record into ``workdir``; for a
    Python script, sets in ``env`` the work directory its probe uses."""
    opts = spec.options
    if opts.command is None:
        assert opts.payload is not None  # LaunchOptions holds a payload or a command
        LaunchRecord(payload=opts.payload, init_kwargs=opts.init_kwargs,
                     backend=opts.backend, pass_local_rank=opts.pass_local_rank,
                     sys_path=tuple(sys.path), worker=spec.worker,
                     rendezvous_timeout=opts.rendezvous_timeout).write(workdir)
        return [sys.executable, "-m", RANK_MODULE, workdir]
    argv = list(opts.command)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # the worker's Python, where dask-ddp is installed
        if len(argv) > 1 and argv[1].endswith(".py") and os.path.isfile(argv[1]):
            # A script runs behind the probe (stall detection, live stacks).
            argv[1:2] = ["-m", SCRIPT_MODULE, argv[1]]
            env["DASK_DDP_WORKDIR"] = workdir
    if sys.platform.startswith("linux"):
        argv = [sys.executable, TETHER_SCRIPT, *argv]
    return argv


def rank_environment(spec: RankSpec, port: int, workdir: str,
                     has_nanny: bool) -> dict[str, str]:
    """The rank's environment: the worker's (less what its nanny added), the job's, then
    torchrun's variables and the launcher's."""
    user_path = spec.options.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    launcher = {
        "PYTHONPATH": os.pathsep.join(p for p in (PACKAGE_ROOT, user_path) if p),
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
        os.environ, rank_env.nanny_environ(has_nanny),
        rank_env.pre_spawn_defaults(), spec.options.env, launcher, spec.local_world_size)
    if spec.options.storage:
        env["DASK_DDP_STORAGE"] = spec.options.storage
    if spec.options.output_dir:
        env["DASK_DDP_OUTPUT_DIR"] = spec.options.output_dir
    collective_dump.dump_environment(workdir, env)
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


def rank_cwd(spec: RankSpec) -> str:
    """The client's directory when this worker has it (a local cluster, a shared file
    system), so relative paths in a command mean what they meant to the user."""
    cwd = spec.options.cwd
    return cwd if cwd and os.path.isdir(cwd) else os.getcwd()


# ------------------------------------------------------------------------ starting it


def start_process(argv: Sequence[str], env: Mapping[str, str], cwd: str,
                  pass_fds: Sequence[int], capture_output: bool) -> subprocess.Popen[bytes]:
    """Start a rank's process in a session of its own (its group is killed whole).

    The one place a rank's process is made. Raises :class:`OSError` when it cannot start.
    A function's rank is forked from this worker's warm template when it can be
    (:mod:`~dask_ddp._launch.worker.warm`), else started afresh.
    """
    if list(argv[1:3]) == ["-m", RANK_MODULE] and "DASK_DDP_CHANNEL_FD" in env:
        proc = warm.start_rank(env, cwd, argv[3], int(env["DASK_DDP_CHANNEL_FD"]),
                               capture_output)
        if proc is not None:
            return proc
    pipe = subprocess.PIPE if capture_output else None
    score = oom.victim_score()  # a warm rank has its template's
    cold = subprocess.Popen(list(argv), env=dict(env), pass_fds=tuple(pass_fds), stdout=pipe,
                            stderr=pipe, start_new_session=True, cwd=cwd)
    oom.prefer_as_victim(cold.pid, score)
    return cold


class RankProcess:
    """A running rank's process, registered in this worker until :meth:`stop`.

    Parameters
    ----------
    proc
        The process :func:`start_process` made.
    job_id, job_name, rank
        Whose rank it is (stack requests select by job).
    workdir
        The rank's work directory (its probe's files).
    """

    def __init__(self, proc: subprocess.Popen[bytes], job_id: str, job_name: str, rank: int,
                 workdir: str) -> None:
        self._proc = proc
        self.job_id, self.job_name, self.rank, self.workdir = job_id, job_name, rank, workdir
        self._pumps: list[threading.Thread] = []
        self._memory = oom.MemoryWatch.of(proc.pid)

    @classmethod
    def start(cls, argv: Sequence[str], env: Mapping[str, str], cwd: str,
              pass_fds: Sequence[int], capture_output: bool, *, job_id: str, job_name: str,
              rank: int, workdir: str) -> RankProcess:
        """Start the rank's process and register it (raises :class:`OSError`, or
        :class:`ValueError` for a bad ``dask-ddp.launch.oom-score-adj``)."""
        proc = start_process(argv, env, cwd, pass_fds, capture_output)
        at_exit.once(_kill_all_live)  # a worker that exits normally kills its ranks
        _LIVE.add(proc)
        self = cls(proc, job_id, job_name, rank, workdir)
        with _running_lock:
            _RUNNING[(job_id, rank)] = self
        return self

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once :meth:`stop` reaped it (negative: killed by that signal)."""
        return self._proc.returncode

    def watch_exit(self) -> threading.Event:
        """An event set once the process exited (seen at once by a thread blocked in
        ``waitid``, so the supervisor's loop need not poll fast)."""
        exited = threading.Event()

        def reap() -> None:
            _wait_exit(self._proc, None)
            exited.set()

        threading.Thread(target=reap, name=f"dask-ddp-reap-{self.rank}", daemon=True).start()
        return exited

    def oom_reason(self) -> str | None:
        """"killed by the kernel's OOM killer ..." when one was counted since the start."""
        return self._memory.oom_reason()

    def is_stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP, a debugger)."""
        return probe.is_stopped(self._proc.pid)

    def read_stacks(self, timeout: float) -> str:
        """The Python stack of every thread of the rank (blocking, up to ``timeout`` s)."""
        return probe.read_stacks(self._proc.pid, self.workdir, timeout)

    def start_pumps(self, on_line: Callable[[str, str], None]) -> None:
        """Hand each line of the rank's captured output to ``on_line(stream, line)``."""
        for stream, name in ((self._proc.stdout, "stdout"), (self._proc.stderr, "stderr")):
            if stream is None:
                continue
            t = threading.Thread(target=_pump, args=(stream, name, on_line), daemon=True,
                                 name=f"dask-ddp-{name}-{self.rank}")
            t.start()
            self._pumps.append(t)

    def kill(self, grace: float) -> None:
        """SIGTERM, then after ``grace`` seconds SIGKILL, the rank's process group."""
        _kill_group(self._proc, grace)

    def stop(self, grace: float) -> None:
        """Unregister the rank, kill its group and reap it, read the rest of its output."""
        with _running_lock:
            _RUNNING.pop((self.job_id, self.rank), None)
        _kill_group(self._proc, grace)
        for t in self._pumps:
            t.join(10)


def running_ranks() -> list[RankProcess]:
    """The ranks this worker supervises now."""
    with _running_lock:
        return list(_RUNNING.values())


def live_ranks(job_id: str) -> int:
    """On a worker: how many rank processes of ``job_id`` are still running."""
    return sum(r.job_id == job_id and r.returncode is None for r in running_ranks())


def kill_rank(job_id: str, rank: int) -> bool:
    """On a worker: SIGKILL rank ``rank`` of job ``job_id`` if it runs here."""
    for proc in running_ranks():
        if proc.job_id == job_id and proc.rank == rank:
            proc.kill(0.0)
            return True
    return False


def _pump(stream: IO[bytes], name: str, on_line: Callable[[str, str], None]) -> None:
    with stream:
        for raw in iter(stream.readline, b""):
            on_line(name, raw.decode(errors="replace").rstrip("\n"))


# ---------------------------------------------------------------------- ending it


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float | None) -> bool:
    """Wait until the rank process exited, without reaping it (``WNOWAIT``): while it is
    not reaped its pid, which is its process group's id, cannot be reused, so a later
    ``killpg`` reaches its own group and no stranger's. True once it exited."""
    if isinstance(proc, warm.WarmProcess):  # its template reports the exit, unreaped
        return proc.wait_exit(timeout)
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


def _kill_all_live() -> None:
    """Kill this process's live ranks (at its exit: a worker killed outright is covered
    by the rank process watching its parent)."""
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            os.killpg(proc.pid, signal.SIGKILL)
