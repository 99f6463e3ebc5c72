"""Launching a job's ranks on Dask: seed-compatible :func:`run`, :func:`submit` and :class:`Job`.

Each rank runs in its own process, started and watched by a supervisor task pinned to its
worker (:mod:`dask_ddp._supervisor`). The client side here places the ranks (raising at
once when they cannot all be placed), submits the supervisor tasks, and runs a watcher on
the client's event loop that notices failed ranks and lost workers, so a job ends with one
error naming the failing rank instead of hanging.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from . import _channel, results
from ._errors import (
    GangStartError,
    JobError,
    RankAbortedError,
    RankFailedError,
    WorkerLostError,
)
from ._plan import RankSpec, choose_workers, rank_layout, worker_host
from ._supervisor import (
    KIND_ORDER,
    abort_event_name,
    failure_topic,
    master_variable_name,
    output_topic,
    run_rank,
)

logger = logging.getLogger(__name__)

__all__ = ["ElasticJob", "Job", "Restart", "job_of", "run", "run_command", "submit",
           "GangStartError", "JobError", "RankAbortedError", "RankFailedError",
           "WorkerLostError"]

WATCH_POLL_S = 0.2
WORKER_CHECK_S = 1.0
_BACKENDS = ("auto", "gloo", "nccl", "mpi")


# Recent jobs by future key, so the Job behind dispatch.run's plain list of futures can be
# found (dask's gather only treats exact lists as collections, so no list subclass).
_RECENT_JOBS: collections.OrderedDict[str, Job] = collections.OrderedDict()
_RECENT_LIMIT = 256


def job_of(futures: Any) -> Job | None:
    """The :class:`Job` a future (or a list of futures) from :func:`run` belongs to.

    Returns ``None`` for futures of no recent dask-ddp job.
    """
    items = futures if isinstance(futures, (list, tuple)) else [futures]
    for fut in items:
        job = _RECENT_JOBS.get(getattr(fut, "key", None))  # type: ignore[arg-type]
        if job is not None:
            return job
    return None


def _remember(job: Job) -> None:
    for fut in job.futures:
        _RECENT_JOBS[fut.key] = job
    while len(_RECENT_JOBS) > _RECENT_LIMIT:
        _RECENT_JOBS.popitem(last=False)


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
        One per rank, in rank order.
    world_size : int
    workers : list of str
        The worker address of every rank, in rank order.
    storage : str or None
        The job's storage URL (checkpoints, results), when given.
    output_dir : pathlib.Path or None
        Where the client writes the job's results, when given.
    """

    def __init__(self, client: Any, job_id: str, name: str, futures: list[Any],
                 workers: list[str], storage: str | None, output_dir: Path | None,
                 stream_output: bool) -> None:
        self.client = client
        self.id = job_id
        self.name = name
        self.futures = futures
        self.workers = workers
        self.world_size = len(futures)
        self.storage = storage
        self.output_dir = output_dir
        self._monitor: Any = None
        self._lost: dict[int, WorkerLostError] = {}
        self._cancelled = False
        self._done = threading.Event()
        self._stream_output = stream_output
        self._eof: set[int] = set()
        self._eof_cond = threading.Condition()
        #: Failed attempts: always empty here (see :class:`ElasticJob`).
        self.restarts: list[Restart] = []

    def __repr__(self) -> str:
        state = "done" if self._done.is_set() else "running"
        return f"<Job {self.name!r} id={self.id[:8]} world_size={self.world_size} {state}>"

    # -- public API ---------------------------------------------------------------------
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
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.name!r} still running after {timeout} s")
        monitor_timeout = 30.0 if timeout is None else max(timeout, 1.0)
        try:
            self._wait_output_eof(10.0)
            error = self._root_error()
            if error is not None:
                raise error
            if self._cancelled:
                raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
            values = list(self.client.gather(self.futures))
        except BaseException:
            # The job's own error wins over a failure to collect its metrics.
            try:
                self._stop_monitor(monitor_timeout)
            except Exception:
                logger.exception("collecting the metrics of failed job %r failed", self.name)
            raise
        self._stop_monitor(monitor_timeout)
        return values

    def _stop_monitor(self, timeout: float) -> None:
        # The monitor stays attached: metrics() reads its records after the job.
        if self._monitor is not None:
            self._monitor.stop(timeout=timeout)

    def cancel(self) -> None:
        """Stop every rank of the job (their processes are killed) and cancel its futures."""
        self._cancelled = True
        self.client.sync(self._set_abort)
        self.client.cancel(self.futures, reason="dask-ddp job cancelled",
                           msg=f"job {self.name!r} was cancelled")

    def metrics(self) -> Iterator[dict[str, Any]]:
        """The job's metric records as they arrive (see :mod:`dask_ddp.results`)."""
        return results.iter_job_metrics(self)

    # -- failure analysis ---------------------------------------------------------------
    def _root_error(self) -> BaseException | None:
        errors: list[BaseException] = []
        for rank, fut in enumerate(self.futures):
            if rank in self._lost:
                errors.append(self._lost[rank])
            elif fut.status == "error":
                errors.append(fut.exception())
        if not errors:
            return None

        def order(e: BaseException) -> tuple[int, int]:
            if isinstance(e, JobError):
                return (KIND_ORDER.get(e.kind, 3), e.rank)
            return (3, len(self.futures))

        return min(errors, key=order)

    # -- the watcher (runs on the client's event loop) -----------------------------------
    async def _set_abort(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.scheduler.event_set(name=abort_event_name(self.id))

    async def _watch(self) -> None:
        aborted = False
        next_worker_check = 0.0
        try:
            while True:
                statuses = [f.status for f in self.futures]
                if all(s in ("finished", "error", "cancelled", "lost") for s in statuses):
                    break
                if not aborted and any(s in ("error", "cancelled") for s in statuses):
                    await self._set_abort()
                    aborted = True
                if time.monotonic() >= next_worker_check:
                    next_worker_check = time.monotonic() + WORKER_CHECK_S
                    if await self._check_workers(statuses):
                        if not aborted:
                            await self._set_abort()
                            aborted = True
                await asyncio.sleep(WATCH_POLL_S)
        except Exception as exc:  # the client went away: nothing left to watch
            logger.debug("watcher of job %s stopped: %s", self.name, exc)
        finally:
            await self._cleanup()
            self._done.set()

    async def _check_workers(self, statuses: list[str]) -> bool:
        """Detect ranks whose worker left; cancel their futures (else they stay pending)."""
        present = await self.client.scheduler.ncores(workers=sorted(set(self.workers)))
        lost = [r for r, w in enumerate(self.workers)
                if w not in present and statuses[r] == "pending" and r not in self._lost]
        for r in lost:
            w = self.workers[r]
            self._lost[r] = WorkerLostError(
                f"rank {r} of job {self.name!r}: its worker {w} left the cluster while the "
                "rank ran (the worker process died or was killed)", r, w, kind="lost")
        for r in lost:
            # Tell the other ranks' supervisors the root cause: a rank that failed because
            # its peer vanished then reports it at once instead of waiting for one.
            with contextlib.suppress(Exception):
                await self.client.scheduler.log_event(
                    topic=failure_topic(self.id),
                    msg={"rank": r, "kind": "lost", "message": str(self._lost[r])})
        if lost:
            await self.client.cancel([self.futures[r] for r in lost], asynchronous=True,
                                     reason="dask-ddp worker lost",
                                     msg="; ".join(str(self._lost[r]) for r in lost))
        return bool(lost)

    async def _cleanup(self) -> None:
        from distributed import Variable

        with contextlib.suppress(Exception):
            Variable(master_variable_name(self.id), client=self.client).delete()
        for event in (abort_event_name(self.id), master_variable_name(self.id)):
            with contextlib.suppress(Exception):
                await self.client.scheduler.event_clear(name=event)

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
        if not self._stream_output:
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
        Rank processes per worker; ``CUDA_VISIBLE_DEVICES`` is rotated per process.
    resources : mapping, optional
        Dask worker resources each worker must have, e.g. ``{"GPU": 1}``.
    backend : {"auto", "gloo", "nccl", "mpi"}
        "auto" is nccl when every rank sees CUDA, else gloo.
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

    Returns
    -------
    Job or ElasticJob
        An :class:`ElasticJob` (same API, plus ``restarts``) when ``max_restarts``,
        ``min_workers`` or ``max_workers`` is given.

    Raises
    ------
    GangStartError
        At once, when the ranks cannot all be placed (too few workers, missing resources).

    Examples
    --------
    >>> job = dask_ddp.submit(client, train, epochs=2, n_workers=2)  # doctest: +SKIP
    >>> job.result()  # doctest: +SKIP
    """
    payload = cloudpickle.dumps((fn, args, kwargs))
    job_name = name or getattr(fn, "__name__", None) or "dask-ddp"
    if max_restarts != 0 or min_workers is not None or max_workers is not None:
        return ElasticJob(
            client, max_restarts=max_restarts, min_workers=min_workers,
            max_workers=max_workers, elastic_timeout=elastic_timeout, n_workers=n_workers,
            workers=workers, resources=resources, launch=dict(
                payload=payload, command=None, name=job_name,
                nprocs_per_worker=nprocs_per_worker, resources=resources, backend=backend,
                init_kwargs=init_kwargs, env=env, pass_local_rank=pass_local_rank,
                progress=progress, output_dir=output_dir, storage=storage,
                stream_output=stream_output, rendezvous_timeout=rendezvous_timeout))
    return _launch(client, payload=payload, command=None, name=job_name, n_workers=n_workers,
                   workers=workers, nprocs_per_worker=nprocs_per_worker, resources=resources,
                   backend=backend, init_kwargs=init_kwargs, env=env,
                   pass_local_rank=pass_local_rank, progress=progress, output_dir=output_dir,
                   storage=storage, stream_output=stream_output,
                   rendezvous_timeout=rendezvous_timeout)


def run(client: Any, pytorch_function: Callable[..., Any], *args: Any, backend: str = "auto",
        pass_local_rank: bool = False, **kwargs: Any) -> list[Any]:
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
        "auto": nccl when every rank sees CUDA, else gloo. "nccl" without CUDA raises.
    pass_local_rank : bool
        Pass ``local_rank=`` to the function.
    """
    # Every keyword goes to the function, as in the seed, even one named like a submit()
    # option.
    job = _launch(client, payload=cloudpickle.dumps((pytorch_function, args, kwargs)),
                  command=None, name=getattr(pytorch_function, "__name__", None) or "dask-ddp",
                  n_workers=None, workers=None, nprocs_per_worker=1, resources=None,
                  backend=backend, init_kwargs=None, env=None,
                  pass_local_rank=pass_local_rank, progress=True, output_dir=None,
                  storage=None, stream_output=False, rendezvous_timeout=300.0)
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
) -> list[int]:
    """Run a torchrun-style command on the cluster, one process per rank ("torchrun over Dask").

    Each rank runs ``command`` with the torchrun environment; the script calls
    ``init_process_group()`` itself. A leading ``python``/``python3``, or a leading
    ``*.py`` script, runs with the worker's Python. Each rank's stdout and stderr reach
    this process prefixed with ``[rank N]`` as they come.

    Returns
    -------
    list of int
        Every rank's exit code (all 0; a non-zero exit raises :class:`RankFailedError`).
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
    job = _launch(client, payload=None, command=tuple(argv), name=job_name,
                  n_workers=n_workers, workers=workers, nprocs_per_worker=nprocs_per_worker,
                  resources=resources, backend="auto", init_kwargs=None, env=env,
                  pass_local_rank=False, progress=False, output_dir=None, storage=None,
                  stream_output=stream_output, rendezvous_timeout=rendezvous_timeout)
    try:
        return [int(x) for x in job.result(timeout=timeout)]
    except TimeoutError:
        job.cancel()
        raise


def _launch(client: Any, *, payload: bytes | None, command: tuple[str, ...] | None,
            name: str, n_workers: int | None, workers: Sequence[str] | None,
            nprocs_per_worker: int, resources: Mapping[str, float] | None, backend: str,
            init_kwargs: Mapping[str, Any] | None, env: Mapping[str, str] | None,
            pass_local_rank: bool, progress: bool, output_dir: str | os.PathLike[str] | None,
            storage: str | None, stream_output: bool, rendezvous_timeout: float,
            restart: int = 0, run_id: str | None = None, max_restarts: int = 0) -> Job:
    if client.asynchronous:
        raise TypeError("dask-ddp needs a synchronous distributed.Client "
                        "(got one created with asynchronous=True)")
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if n_workers is not None and workers is not None and n_workers != len(workers):
        raise ValueError(f"n_workers={n_workers} contradicts the {len(workers)} workers given")
    chosen = choose_workers(client.scheduler_info(n_workers=-1), n_workers, workers, resources)
    layout = rank_layout(chosen, nprocs_per_worker)
    job_id = uuid.uuid4().hex
    master_addr = worker_host(layout[0]["worker"])
    init_blob = cloudpickle.dumps(dict(init_kwargs or {}))
    out_dir = Path(output_dir) if output_dir is not None else None
    _channel.prepare(client, job_id)
    holder: dict[str, Job] = {}
    if stream_output:
        # Subscribe before submitting, so no early line is missed.
        client.subscribe_topic(output_topic(job_id), lambda ev: holder["job"]._on_output(ev))
    futures = []
    for item in layout:
        spec = RankSpec(
            job_id=job_id, job_name=name, rank=item["rank"], local_rank=item["local_rank"],
            world_size=len(layout), local_world_size=item["local_world_size"],
            worker=item["worker"], proc_index=item["proc_index"],
            nprocs_per_worker=nprocs_per_worker, master_addr=master_addr, backend=backend,
            init_kwargs=init_blob, env=dict(env or {}), payload=payload, command=command,
            pass_local_rank=pass_local_rank, stream_output=stream_output,
            scheduler=client.scheduler.address, storage=storage,
            output_dir=str(out_dir) if out_dir is not None else None,
            rendezvous_timeout=rendezvous_timeout, cwd=os.getcwd(), restart=restart,
            group_rank=item["group_rank"], group_world_size=item["group_world_size"],
            run_id=run_id or job_id, max_restarts=max_restarts)
        # Pinned, never moved, never retried: a rank belongs to its worker; if that worker
        # goes, the job fails (the watcher notices) instead of the task waiting forever.
        futures.append(client.submit(
            run_rank, spec, key=f"{name}-{job_id}-{item['rank']}", workers=[item["worker"]],
            allow_other_workers=False, pure=False, retries=0,
            resources=dict(resources) if resources and item["proc_index"] == 0 else None))
    job = Job(client, job_id, name, futures, [i["worker"] for i in layout], storage, out_dir,
              stream_output)
    holder["job"] = job
    _remember(job)
    client.loop.add_callback(job._watch)
    job._monitor = results.start_job_monitor(job, progress=progress)
    logger.info("job %r (%s): %d ranks on %s", name, job_id, len(layout), ", ".join(chosen))
    return job


# -- restarts and elastic jobs -----------------------------------------------------------

#: After a failure, seconds a new attempt waits for as many workers as the last one had
#: (a nanny brings a killed worker back under a new address within a few seconds) before
#: it goes on with fewer (elastic jobs only: fixed-size jobs wait ``elastic_timeout``).
RESTART_GRACE_S = 10.0
_WAIT_POLL_S = 0.25
_GONE = ("closing", "closing_gracefully", "closed", "failed")


@dataclasses.dataclass(frozen=True)
class Restart:
    """One failed attempt of an :class:`ElasticJob`.

    Attributes
    ----------
    attempt : int
        The attempt that failed (0 is the first).
    time : float
        When its failure was seen (``time.time()``).
    rank : int
        The rank the failure is about (-1 when no rank is known).
    worker : str
        That rank's worker ("" when unknown).
    kind : str
        The failure's kind (see :class:`JobError`), or the exception's class name.
    reason : str
        The error message.
    """

    attempt: int
    time: float
    rank: int
    worker: str
    kind: str
    reason: str

    def __str__(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.time))
        return f"attempt {self.attempt} at {stamp}: {self.reason}"


def _available_workers(client: Any, resources: Mapping[str, float] | None,
                       preferred: Sequence[str]) -> list[str]:
    info = dict(client.scheduler_info(n_workers=-1))
    info["workers"] = {a: w for a, w in info.get("workers", {}).items()
                       if w.get("status", "running") not in _GONE}
    try:
        fit = choose_workers(info, None, None, resources)
    except GangStartError:
        return []
    first = [w for w in preferred if w in fit]
    return first + [w for w in fit if w not in first]


class ElasticJob:
    """A job that starts again when a rank fails or its worker leaves (see :func:`submit`).

    It has the API of :class:`Job`; ``futures``, ``workers``, ``world_size`` and ``id``
    are the current attempt's. Each attempt is a :class:`Job` of its own (fresh rank
    processes and rendezvous); :meth:`result` returns the last attempt's results.

    Attributes
    ----------
    restarts : list of Restart
        The failed attempts so far, oldest first.
    attempts : list of Job
        Every attempt started so far; the last is the current one.
    max_restarts : int
    run_id : str
        The ranks' ``TORCHELASTIC_RUN_ID``, the same in every attempt (as under torchrun);
        ``id`` is the current attempt's.
    """

    def __init__(self, client: Any, *, max_restarts: int, min_workers: int | None,
                 max_workers: int | None, elastic_timeout: float, n_workers: int | None,
                 workers: Sequence[str] | None, resources: Mapping[str, float] | None,
                 launch: dict[str, Any]) -> None:
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        for arg, v in (("min_workers", min_workers), ("max_workers", max_workers)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{arg} must be an int >= 1, got {v!r}")
        if min_workers is not None and max_workers is not None and min_workers > max_workers:
            raise ValueError(f"min_workers={min_workers} is more than max_workers={max_workers}")
        elastic = min_workers is not None or max_workers is not None
        if elastic and (n_workers is not None or workers is not None):
            raise ValueError("give either n_workers/workers or min_workers/max_workers, "
                             f"not both (n_workers={n_workers}, workers={workers}, "
                             f"min_workers={min_workers}, max_workers={max_workers})")
        if elastic_timeout < 0:
            raise ValueError(f"elastic_timeout must be >= 0, got {elastic_timeout}")
        if client.asynchronous:
            raise TypeError("dask-ddp needs a synchronous distributed.Client "
                            "(got one created with asynchronous=True)")
        self.client = client
        self.name: str = launch["name"]
        self.storage: str | None = launch["storage"]
        out = launch["output_dir"]
        self.output_dir = Path(out) if out is not None else None
        self.max_restarts = max_restarts
        # One run id across restarts, as torchrun's TORCHELASTIC_RUN_ID.
        self.run_id = uuid.uuid4().hex
        self.restarts: list[Restart] = []
        self.attempts: list[Job] = []
        self._launch_args = launch
        self._resources = resources
        self._elastic = elastic
        self._min = min_workers if elastic else None
        self._max = max_workers
        self._timeout = float(elastic_timeout)
        self._preferred = list(workers or [])
        self._cancelled = False
        self._done = threading.Event()
        self._changed = threading.Condition()
        self._values: list[Any] | None = None
        self._error: BaseException | None = None
        if elastic:
            chosen = self._wait_for_workers(minimum=min_workers or 1,
                                            target=max_workers, grace=0.0)
            first = self._start(chosen)
        else:
            first = self._start(workers, n_workers)
        self._size = len(set(first.workers))
        self._driver = threading.Thread(target=self._drive, daemon=True,
                                        name=f"dask-ddp-elastic-{self.name}")
        self._driver.start()

    def __repr__(self) -> str:
        state = "done" if self._done.is_set() else "running"
        return (f"<ElasticJob {self.name!r} attempt={len(self.attempts) - 1} "
                f"world_size={self.world_size} restarts={len(self.restarts)} {state}>")

    # -- the current attempt ----------------------------------------------------------
    @property
    def current(self) -> Job:
        """The attempt running now (or the last one)."""
        return self.attempts[-1]

    @property
    def futures(self) -> list[Any]:
        return self.current.futures

    @property
    def workers(self) -> list[str]:
        return self.current.workers

    @property
    def world_size(self) -> int:
        return self.current.world_size

    @property
    def id(self) -> str:
        return self.current.id

    # -- public API ---------------------------------------------------------------------
    def done(self) -> bool:
        """True once the job finished, failed for good or was cancelled."""
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> list[Any]:
        """Wait for the job; each rank's return value of the last attempt, in rank order.

        Raises
        ------
        JobError
            The last attempt's root cause once the restarts ran out; ``err.attempts``
            lists every attempt's failure (:class:`Restart`), and the message tells them.
        GangStartError
            A new attempt found too few workers within ``elastic_timeout``.
        concurrent.futures.CancelledError
            The job was cancelled.
        TimeoutError
            ``timeout`` passed first; the job keeps running.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.name!r} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        if self._cancelled or self._values is None:
            raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
        return list(self._values)

    def cancel(self) -> None:
        """Stop the current attempt's ranks and start no other."""
        with self._changed:
            self._cancelled = True
            current = self.current
        current.cancel()

    def metrics(self) -> Iterator[dict[str, Any]]:
        """Every attempt's metric records, attempt after attempt, live until the job ends."""
        i = 0
        while True:
            with self._changed:
                while i >= len(self.attempts) and not self._done.is_set():
                    self._changed.wait(1.0)
                if i >= len(self.attempts):
                    return
                attempt = self.attempts[i]
            # With an output folder the attempts append to one metrics.jsonl: stop at the
            # records this attempt's monitor wrote (the next attempt starts only after it
            # finished, so a record read before then is this attempt's).
            monitor, n = attempt._monitor, 0
            for record in attempt.metrics():
                if monitor is not None and monitor.finished and n >= monitor.count:
                    break
                yield record
                n += 1
            i += 1

    # -- attempts ---------------------------------------------------------------------
    def _start(self, workers: Sequence[str] | None, n_workers: int | None = None) -> Job:
        job = _launch(self.client, n_workers=n_workers, workers=workers,
                      restart=len(self.attempts), run_id=self.run_id,
                      max_restarts=self.max_restarts, **self._launch_args)
        with self._changed:
            self.attempts.append(job)
            self._changed.notify_all()
        return job

    def _wait_for_workers(self, minimum: int, target: int | None, grace: float) -> list[str]:
        """Workers for an attempt: ``target`` of them if they come within ``grace`` seconds,
        else at least ``minimum`` within ``elastic_timeout``, else GangStartError."""
        t0 = time.monotonic()
        while True:
            fit = _available_workers(self.client, self._resources, self._preferred)
            waited = time.monotonic() - t0
            if target is not None and len(fit) >= target:
                return fit[:target]
            if len(fit) >= minimum and (target is None or waited >= grace):
                return fit
            if self._cancelled:
                raise concurrent.futures.CancelledError(f"job {self.name!r} was cancelled")
            if waited >= self._timeout:
                raise GangStartError(
                    f"job {self.name!r} needs at least {minimum} workers"
                    + (f" with resources {dict(self._resources)}" if self._resources else "")
                    + f"; {len(fit)} were available after waiting {self._timeout:g} s")
            time.sleep(_WAIT_POLL_S)

    def _record(self, attempt: int, err: BaseException) -> Restart:
        if isinstance(err, JobError):
            return Restart(attempt, time.time(), err.rank, err.worker, err.kind, str(err))
        return Restart(attempt, time.time(), -1, "", type(err).__name__, str(err))

    def _history(self) -> str:
        return "\n".join(f"  {r}" for r in self.restarts)

    def _drive(self) -> None:
        try:
            while True:
                attempt = self.current
                try:
                    self._values = attempt.result()
                    return
                except concurrent.futures.CancelledError:
                    self._cancelled = True
                    return
                except JobError as err:
                    record = self._record(len(self.attempts) - 1, err)
                    if self._cancelled:  # ranks stopped by cancel(): result() says so
                        return
                    if len(self.restarts) >= self.max_restarts:
                        self._fail(err, record)
                        return
                    self.restarts.append(record)
                    logger.warning("job %r: attempt %d failed (%s); restarting (%d of %d)",
                                   self.name, record.attempt, err, len(self.restarts),
                                   self.max_restarts)
                try:
                    if self._elastic:
                        target = self._max if self._max is not None else self._size
                        minimum = self._min or 1
                    else:
                        target = minimum = self._size
                    chosen = self._wait_for_workers(minimum, target, RESTART_GRACE_S)
                    with self._changed:
                        if self._cancelled:
                            return
                    self._start(chosen)
                    self._size = len(chosen)
                except concurrent.futures.CancelledError:
                    return
                except GangStartError as exc:
                    exc.attempts = list(self.restarts)  # type: ignore[attr-defined]
                    exc.args = (f"{exc}\nearlier attempts of job {self.name!r}:\n"
                                f"{self._history()}",)
                    self._error = exc
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            logger.exception("restarting job %r failed", self.name)
            self._error = exc
        finally:
            with self._changed:
                self._done.set()
                self._changed.notify_all()

    def _fail(self, err: JobError, record: Restart) -> None:
        if self.restarts:
            err.args = (f"{err}\n(attempt {record.attempt}, after {len(self.restarts)} "
                        f"restart(s); earlier attempts of job {self.name!r}:\n"
                        f"{self._history()})",)
        err.attempts = [*self.restarts, record]
        self._error = err
