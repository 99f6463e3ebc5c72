"""Launching a job's ranks on Dask: seed-compatible :func:`run`, :func:`submit` and
:func:`run_command` (the public functions; the job lives in :mod:`dask_ddp._launch.client.job`).

Each rank runs in its own process, started and watched by a supervisor task pinned to its
worker. A job ends with one error naming the failing rank instead of hanging.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from dask_ddp._launch.client import payload, registry
from dask_ddp._launch.client.job import ElasticJob, Job
from dask_ddp._launch.wire.options import FROM_CONFIG, LaunchOptions
from dask_ddp._launch.wire.policy import RecoveryPolicy
from dask_ddp.errors import (
    GangStartError,
    JobError,
    RankAbortedError,
    RankFailedError,
    Restart,
    StallError,
    WorkerLostError,
)

__all__ = ["ElasticJob", "Job", "Restart", "job_of", "run", "run_command", "submit",
           "GangStartError", "JobError", "RankAbortedError", "RankFailedError",
           "StallError", "WorkerLostError"]

#: ``stall_timeout`` not given: ``dask-ddp.launch.stall-timeout`` (60 s).
_FROM_CONFIG: Any = FROM_CONFIG


def job_of(futures: Any) -> Job | None:
    """The :class:`Job` a future (or a list of futures) from :func:`run` belongs to.

    Returns ``None`` for futures of no dask-ddp job. The job stays known as long as its
    futures are held; dask-ddp keeps no finished job alive by itself.
    """
    job: Job | None = registry.job_of(futures)
    return job


def _tables(client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
            ) -> tuple[tuple[Any, ...], dict[str, Any], list[Any]]:
    """The call's arguments with each top-level Dask DataFrame or Array replaced by a
    :class:`dask_ddp.data.Table` (described from metadata; its data stays on the workers),
    and the collections replaced, which the job keeps alive while it runs."""
    # A Loader made on the client over a Dask collection holds it for the job too.
    loaders = [k for v in (*args, *kwargs.values())
               if (k := getattr(v, "__dict__", {}).get("_dask_ddp_keep_alive")) is not None]
    if not any(type(v).__module__.startswith(("dask.", "dask_expr"))
               for v in (*args, *kwargs.values())):
        return args, kwargs, loaders
    from dask_ddp.data.table import replace_collections

    args, kwargs, kept = replace_collections(client, args, kwargs)
    return args, kwargs, kept + loaders


def submit(
    client: Any,
    fn: Callable[..., Any],
    *args: Any,
    n_workers: int | None = None,
    workers: Sequence[str] | None = None,
    nprocs_per_worker: int = 1,
    resources: Mapping[str, float] | None = None,
    backend: str = "auto",
    init_kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    pass_local_rank: bool = False,
    progress: bool = True,
    output_dir: str | os.PathLike[str] | None = None,
    storage: str | None = None,
    rendezvous_timeout: float = 300.0,
    stream_output: bool = False,
    max_restarts: int = 0,
    min_workers: int | None = None,
    max_workers: int | None = None,
    elastic_timeout: float = 60.0,
    stall_timeout: float | str | timedelta | None = _FROM_CONFIG,
    recovery: str | RecoveryPolicy = "restart",
    **kwargs: Any,
) -> Job | ElasticJob:
    """Run ``fn(*args, **kwargs)`` as a DDP job: one process per rank, on Dask workers.

    Each rank's process has the torchrun environment (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and an
    initialised default process group when ``fn`` starts.

    Parameters
    ----------
    client : distributed.Client
    fn : callable
        The training function; its return value on each rank is that rank's result.
    *args, **kwargs
        Passed to ``fn`` (keywords other than the ones below).
    n_workers : int, optional
        Use this many workers; default all workers (with ``resources``).
    workers : sequence of str, optional
        Use exactly these workers, in rank order.
    nprocs_per_worker : int
        Rank processes per worker; ``CUDA_VISIBLE_DEVICES`` is rotated per process, and
        the ranks of a host get distinct GPUs where it has enough (across workers).
    resources : mapping, optional
        Dask worker resources each worker must have, e.g. ``{"GPU": 1}``.
    backend : {"auto", "gloo", "nccl", "mpi"}
        "auto" is ``"cpu:gloo,cuda:nccl"`` when every rank has a GPU of its own, else
        gloo (with a warning when ranks would share a GPU). "nccl" raises where a rank
        has no GPU or two ranks would share one, naming them.
    init_kwargs : mapping, optional
        Passed to ``torch.distributed.init_process_group`` (e.g. ``timeout``).
    env : mapping, optional
        Extra environment variables for the rank processes.
    name : str, optional
        Job name, shown on the dashboard; default ``fn.__name__``.
    pass_local_rank : bool
        Pass ``local_rank=`` to ``fn``, as the seed's ``dispatch.run`` does.
    progress : bool
        Show a progress bar of the job's metrics (see :mod:`dask_ddp.results`).
    output_dir : path, optional
        Where the client writes the job's results.
    storage : str, optional
        The job's storage URL for checkpoints and results (``file://``, ``s3://``).
    rendezvous_timeout : float
        Seconds ranks wait for rank 0's rendezvous address.
    stream_output : bool
        Print each rank's stdout and stderr here, prefixed with ``[rank N]``, as they
        come (default: they go to the worker's own stdout and stderr).
    max_restarts : int
        How many times the job starts again when a rank fails or its worker leaves: every
        rank is stopped, and ``fn`` is called again in fresh rank processes (new
        rendezvous) on the workers available then; :func:`dask_ddp.rank_info` ``.restart``
        is the attempt number. ``fn`` resumes from its last checkpoint (see
        :class:`dask_ddp.Checkpointer`).
    min_workers, max_workers : int, optional
        Elastic bounds: each attempt uses as many qualifying workers as are available,
        at most ``max_workers``, waiting up to ``elastic_timeout`` seconds for
        ``min_workers``. Without them an attempt needs as many workers as the first one.
    elastic_timeout : float
        Seconds an attempt waits for enough workers before failing with
        :class:`GangStartError`.
    stall_timeout : float, str, timedelta or None
        End the job with a :class:`StallError` (naming the stuck ranks, the collective and
        every rank's Python stack) when ranks are blocked in a collective that can no
        longer complete (every other rank blocked too, returned from ``fn`` or frozen) for
        this long. ``None`` turns it off; default ``dask-ddp.launch.stall-timeout`` (60 s).
        A rank that computes (rank 0's long evaluation) never counts as a stall.
    recovery : {"restart", "live"} or RecoveryPolicy
        What a lost rank (process killed, worker lost) costs. ``"restart"``: the whole
        group starts again from the last checkpoint (``max_restarts``). ``"live"``: the
        surviving ranks keep their processes, model, optimizer and data; the group
        re-forms without the lost rank and goes on from the most advanced survivor's
        step (no checkpoint read); each change is a generation record on
        ``job.generations``. Needs a ``DistributedDataParallel`` model registered with
        :class:`dask_ddp.Checkpointer`; falls back to ``max_restarts`` restarts when
        fewer than ``min_workers`` survive or the group cannot re-form. Needs torch 2.14
        or newer (refused at once on an older one). A
        :class:`~dask_ddp.recovery.RecoveryPolicy` of one's own (one function in a
        :class:`~dask_ddp.recovery.Policy`) decides each event instead: see
        :mod:`dask_ddp.recovery`.

    Returns
    -------
    Job or ElasticJob
        An :class:`ElasticJob` (same API, plus ``restarts``) when ``max_restarts``,
        ``min_workers`` or ``max_workers`` is given.

    Raises
    ------
    GangStartError
        At once, when the ranks cannot all be placed (too few workers, missing resources).
    RuntimeError
        At once, when a feature asked for needs a newer torch than the installed one
        (``recovery="live"`` needs torch 2.14): the message names both versions.

    Examples
    --------
    >>> job = dask_ddp.submit(client, train, epochs=2, n_workers=2)  # doctest: +SKIP
    >>> job.result()  # doctest: +SKIP
    """
    # The call is checked before anything starts: each rank would fail on it seconds later.
    payload.check_call(fn, args, kwargs, _SUBMIT_OPTIONS, pass_local_rank=pass_local_rank)
    args, kwargs, tables = _tables(client, args, kwargs)
    options = LaunchOptions.build(
        name=name or getattr(fn, "__name__", None) or "dask-ddp",
        payload=payload.dumps_payload(fn, args, kwargs), sources=payload.code_ranges(fn),
        n_workers=n_workers, workers=workers,
        nprocs_per_worker=nprocs_per_worker, resources=resources, backend=backend,
        init_kwargs=init_kwargs, env=env, pass_local_rank=pass_local_rank, progress=progress,
        output_dir=output_dir, storage=storage, stream_output=stream_output,
        rendezvous_timeout=rendezvous_timeout, max_restarts=max_restarts,
        min_workers=min_workers, max_workers=max_workers, elastic_timeout=elastic_timeout,
        stall_timeout=stall_timeout, recovery=recovery)
    if options.restarting:
        return ElasticJob(client, options, keep_alive=tables)
    return Job(client, options, keep_alive=tables)


#: submit()'s own keywords: a function's keyword close to one of them is likely a typo.
_SUBMIT_OPTIONS = tuple(inspect.signature(submit).parameters)[3:-1]


def run(client: Any, pytorch_function: Callable[..., Any], *args: Any, backend: str = "auto",
        pass_local_rank: bool = False,
        stall_timeout: float | str | timedelta | None = _FROM_CONFIG,
        **kwargs: Any) -> list[Any]:
    """Run ``pytorch_function`` on every worker of the cluster, one rank per worker.

    The seed's ``dask_pytorch_ddp.dispatch.run``: same call, same result (a list of
    futures, one per rank, in rank order; each resolves to that rank's return value). The
    :class:`Job` behind them is ``job_of(futures)``.

    Parameters
    ----------
    client : distributed.Client
    pytorch_function : callable
    *args, **kwargs
        Passed to ``pytorch_function``.
    backend : {"auto", "gloo", "nccl", "mpi"}
        "auto": ``"cpu:gloo,cuda:nccl"`` when every rank has a GPU of its own, else gloo.
        "nccl" raises where a rank has no GPU or two ranks would share one.
    pass_local_rank : bool
        Pass ``local_rank=`` to the function.
    stall_timeout : float, str, timedelta or None
        As for :func:`submit` (default ``dask-ddp.launch.stall-timeout``).
    """
    # Every other keyword goes to the function, as in the seed, even one named like a
    # submit() option.
    args, kwargs, tables = _tables(client, args, kwargs)
    job = Job(client, LaunchOptions.build(
        name=getattr(pytorch_function, "__name__", None) or "dask-ddp",
        payload=payload.dumps_payload(pytorch_function, args, kwargs),
        sources=payload.code_ranges(pytorch_function), backend=backend,
        pass_local_rank=pass_local_rank, stall_timeout=stall_timeout), keep_values=False,
        keep_alive=tables)
    return list(job.futures)


def run_command(
    client: Any,
    command: Sequence[str],
    *,
    n_workers: int | None = None,
    workers: Sequence[str] | None = None,
    nprocs_per_worker: int = 1,
    resources: Mapping[str, float] | None = None,
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    stream_output: bool = True,
    timeout: float | None = None,
    rendezvous_timeout: float = 300.0,
    stall_timeout: float | str | timedelta | None = _FROM_CONFIG,
    recovery: str | RecoveryPolicy = "restart",
) -> list[int]:
    """Run a torchrun-style command on the cluster, one process per rank ("torchrun over Dask").

    Each rank runs ``command`` with the torchrun environment; the script calls
    ``init_process_group()`` itself. A leading ``python``/``python3``, or a leading
    ``*.py`` script, runs with the worker's Python. Each rank's stdout and stderr reach
    this process prefixed with ``[rank N]`` as they come.

    ``stall_timeout`` is :func:`submit`'s: a Python script's ranks are watched as a
    function's are.

    ``recovery="live"`` (a Python script): the script's ``init_process_group`` makes
    :func:`submit`'s live group, so a lost rank costs the others one step; the script
    registers its model, optimizer and loader with :class:`~dask_ddp.Checkpointer` as a
    function does. ``"restart"`` (the default): a lost rank ends the job.

    Returns
    -------
    list of int
        Every rank's exit code (all 0; a non-zero exit raises :class:`RankFailedError`);
        with ``recovery="live"``, those of the ranks that finished.
    """
    argv = [str(a) for a in command]
    if not argv:
        raise ValueError("run_command needs a command, got an empty one")
    if argv[0].endswith(".py"):
        argv.insert(0, "python")
    if argv[0] in ("python", "python3") and len(argv) > 1 and os.path.isfile(argv[1]):
        argv[1] = os.path.abspath(argv[1])
    job_name = name or Path(argv[1] if argv[0] in ("python", "python3") and len(argv) > 1
                            else argv[0]).stem or "command"
    job = Job(client, LaunchOptions.build(
        name=job_name, command=tuple(argv), n_workers=n_workers, workers=workers,
        nprocs_per_worker=nprocs_per_worker, resources=resources, env=env, progress=False,
        stream_output=stream_output, rendezvous_timeout=rendezvous_timeout,
        stall_timeout=stall_timeout, recovery=recovery))
    try:
        return [int(x) for x in job.result(timeout=timeout)]
    except TimeoutError:
        job.cancel()
        raise
