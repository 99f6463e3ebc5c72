"""The environment a rank process starts with (internal).

The rule (docs/user-guide/launching.md, "The rank's environment"): a rank gets the
environment its worker had *before* Dask's nanny added settings meant for the worker
process itself, then the job's ``env``, then the torchrun variables.

Why: the nanny sets ``distributed.nanny.pre-spawn-environ`` (``MALLOC_TRIM_THRESHOLD_=65536``,
``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1``, ``OPENBLAS_NUM_THREADS=1``) and
``PYTHONHASHSEED`` in the worker's environment before spawning it. They suit a worker
holding many small Dask results, not a training process: with ``MALLOC_TRIM_THRESHOLD_``
glibc returns the heap to the kernel on nearly every large free, and a CPU DDP step of a
small CNN took 2.0x as long as under torchrun. The nanny cannot be asked what it added, so
the worker's environment is compared with the nanny process's own environment as it was
when that process started (``/proc/<pid>/environ``, which later ``os.environ`` changes do
not touch): a pre-spawn variable is dropped only when it holds the value Dask's
configuration gives it and the nanny's process did not already have it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
from collections.abc import Iterator, Mapping

from dask_ddp._launch.wire.collective_env import collective_defaults

logger = logging.getLogger(__name__)

# What the nanny adds when the configuration leaves PYTHONHASHSEED unset or "0"
# (distributed.nanny.Nanny.__init__, dask/distributed#8400).
_NANNY_HASHSEED = "6640"

# The variables torchrun's agent sets in every rank (torch/distributed/run.py and
# torch/distributed/elastic/agent/server/local_elastic_agent.py), plus dask-ddp's own.
TORCHRUN_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCHELASTIC_ENABLE_FILE_TIMER", "TORCHELASTIC_TIMER_FILE", "TORCH_ELASTIC_WORKER_IDENTIFIER",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
})

def pre_spawn_defaults() -> dict[str, str]:
    """The values Dask's nanny puts in a worker's environment before spawning it.

    Read from this process's Dask configuration (a worker runs with its nanny's).
    """
    import dask

    cfg = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    values = {str(k): str(v) for k, v in cfg.items() if v is not None}
    if values.get("PYTHONHASHSEED") in (None, "0"):
        values["PYTHONHASHSEED"] = _NANNY_HASHSEED
    return values


def nanny_injected(worker_env: Mapping[str, str], nanny_env: Mapping[str, str] | None,
                   defaults: Mapping[str, str]) -> set[str]:
    """Names of the variables the nanny added to ``worker_env`` for the worker's own sake.

    Parameters
    ----------
    worker_env
        The worker process's environment now.
    nanny_env
        The nanny process's environment when it started, or ``None`` when it cannot be
        read (then every pre-spawn variable holding Dask's value counts as added).
    defaults
        :func:`pre_spawn_defaults`.
    """
    added = set()
    for key, value in defaults.items():
        if worker_env.get(key) != value:
            continue  # absent, or the user's own value (Nanny(env=...), a shell export)
        if nanny_env is not None and key in nanny_env:
            continue  # the worker's launcher had it already: the user's choice
        added.add(key)
    return added


def start_environ(pid: int) -> dict[str, str] | None:
    """The environment process ``pid`` was started with, or ``None`` if unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _nanny_pid() -> int:
    """The nanny's pid: this worker's parent, past a multiprocessing fork server."""
    pid = os.getppid()
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"multiprocessing.forkserver" in f.read():
                with open(f"/proc/{pid}/stat", "rb") as st:
                    # "pid (comm) state ppid ...": comm may hold spaces, split after ")".
                    pid = int(st.read().rsplit(b")", 1)[1].split()[1])
    return pid


def nanny_environ(has_nanny: bool) -> dict[str, str] | None:
    """The environment to compare this worker's with (see :func:`nanny_injected`).

    The nanny process's environment at its start, ``None`` if that cannot be read; this
    worker's own when it has no nanny (then nothing was added).
    """
    if not has_nanny:
        return dict(os.environ)
    env = start_environ(_nanny_pid())
    if env is None:
        logger.debug("cannot read the nanny's environment (no /proc); dropping every "
                     "pre-spawn variable that holds Dask's default value")
    return env


def rank_environment(worker_env: Mapping[str, str], nanny_env: Mapping[str, str] | None,
                     defaults: Mapping[str, str], job_env: Mapping[str, str],
                     launcher: Mapping[str, str], local_world_size: int) -> dict[str, str]:
    """The environment of one rank process.

    Parameters
    ----------
    worker_env, nanny_env, defaults
        As for :func:`nanny_injected`: the variables it names are left out.
    job_env
        The job's ``env=`` (the user's explicit choice: always wins over the worker's).
    launcher
        The torchrun and dask-ddp variables (win over everything).
    local_world_size
        Ranks on this host: with more than one, ``OMP_NUM_THREADS`` is 1 unless set, as
        torchrun does (each rank's intra-op threads would otherwise take every core).

    The collectives' settings
    (:data:`~dask_ddp._launch.wire.collective_env.COLLECTIVE_DEFAULTS`) fill in what is left
    unset.
    """
    dropped = nanny_injected(worker_env, nanny_env, defaults)
    env = {k: v for k, v in worker_env.items() if k not in dropped}
    env.update(job_env)
    if local_world_size > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = "1"
    env.update(collective_defaults(env))
    env.update(slurm_as_one_job(env, job_env))
    env.update(launcher)
    return env


def slurm_as_one_job(env: Mapping[str, str], job_env: Mapping[str, str]) -> dict[str, str]:
    """What makes Lightning 2.0 on a SLURM-started worker see one job, not one per rank.

    The worker's SLURM variables describe its own allocation (dask-jobqueue's job), not
    the DDP job. Lightning 2.0.x checks SLURM before torchrun's variables and then trains
    one job of world size 1 per rank; it skips SLURM for a job named ``interactive``
    (Lightning 2.1 and later check torchrun's variables first). The worker's job name is
    kept in ``DASK_DDP_SLURM_JOB_NAME``; a name the job's ``env=`` sets is left alone.
    """
    if "SLURM_NTASKS" not in env or "SLURM_JOB_NAME" in job_env \
            or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return {}
    return {"DASK_DDP_SLURM_JOB_NAME": env.get("SLURM_JOB_NAME", ""),
            "SLURM_JOB_NAME": "interactive"}


def rotated_devices(visible: str | None, proc_index: int, nprocs: int) -> str | None:
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


def interface_of(host: str) -> str | None:
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
