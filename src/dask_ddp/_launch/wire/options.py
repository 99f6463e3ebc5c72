"""The options of one launch, built once from the public call and passed down (internal).

:func:`dask_ddp.submit`, :func:`dask_ddp.dispatch.run` and :func:`dask_ddp.run_command`
each build one :class:`LaunchOptions` (checking every value once); the job, the elastic
job and every rank's supervisor read the same object.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import cloudpickle

from dask_ddp import _compat
from dask_ddp._launch.wire.policy import RecoveryPolicy, policy_of

BACKENDS = ("auto", "gloo", "nccl", "mpi")
#: ``stall_timeout`` not given: read ``dask-ddp.launch.stall-timeout``.
FROM_CONFIG = "config"


@dataclasses.dataclass(frozen=True)
class LaunchWaits:
    """The launcher's waits and poll intervals, in seconds (``dask-ddp.launch.*`` keys).

    Read once in the client when a job is built and carried in its options to every
    supervisor, so a value set with ``dask.config.set`` in the client reaches the workers.
    """

    blocked_after: float = 2.0
    restart_grace: float = 10.0
    term_grace: float = 5.0
    root_wait: float = 3.0
    forward_close: float = 30.0
    reclose: float = 2.0
    abort_poll: float = 0.5
    watch_poll: float = 0.2
    worker_check: float = 1.0
    worker_poll: float = 0.25
    scheduler_call: float = 30.0
    stacks_timeout: float = 10.0
    output_eof: float = 10.0
    forget_delay: float = 5.0
    leave_grace: float = 3.0
    dashboard_sample: float = 2.0

    @classmethod
    def from_config(cls) -> LaunchWaits:
        """The values of the ``dask-ddp.launch.*`` keys now."""
        from dask_ddp import _config

        values: dict[str, float] = {}
        for f in dataclasses.fields(cls):
            key = "dask-ddp.launch." + f.name.replace("_", "-")
            value = _config.seconds(key)
            assert value is not None  # seconds() allows None only when asked to
            values[f.name] = value
        return cls(**values)


def stall_timeout_of(value: Any) -> float | None:
    """``submit``'s ``stall_timeout`` in seconds (``None``: off), the config's when not
    given."""
    from dask_ddp import _config

    if isinstance(value, str) and value == FROM_CONFIG:
        return _config.seconds("dask-ddp.launch.stall-timeout", allow_none=True)
    return _config.duration(value, "stall_timeout", allow_none=True)


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """What to run and how, the same for every rank and every attempt of a job.

    ``payload`` (a pickled ``(fn, args, kwargs)``) and ``command`` (an argv) exclude each
    other. ``init_kwargs`` is pickled once here, so a bad value fails in the caller.
    """

    name: str
    payload: bytes | None = None
    command: tuple[str, ...] | None = None
    n_workers: int | None = None
    workers: tuple[str, ...] | None = None
    nprocs_per_worker: int = 1
    resources: Mapping[str, float] | None = None
    backend: str = "auto"
    init_kwargs: bytes = dataclasses.field(default_factory=lambda: cloudpickle.dumps({}))
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pass_local_rank: bool = False
    progress: bool = True
    output_dir: str | None = None
    storage: str | None = None
    stream_output: bool = False
    rendezvous_timeout: float = 300.0
    max_restarts: int = 0
    min_workers: int | None = None
    max_workers: int | None = None
    elastic_timeout: float = 60.0
    stall_timeout: float | None = None
    #: A built-in policy's word (``"restart"``, ``"live"``) or a
    #: :class:`~dask_ddp._launch.wire.policy.RecoveryPolicy`; :attr:`policy` is the policy.
    recovery: str | RecoveryPolicy = "restart"
    #: ``(name, file, first line, last line)`` of the submitted function's code, to put
    #: the file and source lines back into a rank's traceback on the client
    #: (:func:`~dask_ddp._launch.client.payload.with_sources`).
    sources: tuple[tuple[str, str, int, int], ...] = ()
    waits: LaunchWaits = dataclasses.field(default_factory=LaunchWaits.from_config)
    cwd: str = dataclasses.field(default_factory=os.getcwd)

    def __repr__(self) -> str:
        # Shown in worker logs (a failed task's repr reaches Dask's dashboard): the storage
        # URL without credentials, the environment's names without their values.
        from dask_ddp.storage import redact_url

        what = (f"payload=<{len(self.payload)} bytes>" if self.payload is not None
                else f"command={list(self.command or ())!r}")
        storage = None if self.storage is None else redact_url(self.storage)
        return (f"LaunchOptions(name={self.name!r}, {what}, n_workers={self.n_workers}, "
                f"backend={self.backend!r}, env={sorted(self.env)}, storage={storage!r}, "
                f"output_dir={self.output_dir!r}, max_restarts={self.max_restarts})")

    @property
    def policy(self) -> RecoveryPolicy:
        """The job's recovery policy (``recovery`` is checked when built)."""
        return policy_of(self.recovery)

    def __post_init__(self) -> None:
        if (self.payload is None) == (self.command is None):
            raise ValueError("a launch runs either a function or a command")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.n_workers is not None and self.workers is not None \
                and self.n_workers != len(self.workers):
            raise ValueError(f"n_workers={self.n_workers} contradicts the "
                             f"{len(self.workers)} workers given")
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {self.max_restarts!r}")
        for arg, v in (("min_workers", self.min_workers), ("max_workers", self.max_workers)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{arg} must be an int >= 1, got {v!r}")
        if self.min_workers is not None and self.max_workers is not None \
                and self.min_workers > self.max_workers:
            raise ValueError(f"min_workers={self.min_workers} is more than "
                             f"max_workers={self.max_workers}")
        if self.elastic and (self.n_workers is not None or self.workers is not None):
            raise ValueError(
                "give either n_workers/workers or min_workers/max_workers, not both "
                f"(n_workers={self.n_workers}, workers={self.workers}, "
                f"min_workers={self.min_workers}, max_workers={self.max_workers})")
        policy = policy_of(self.recovery)  # raises naming a bad value
        if policy.regroups:
            self._check_regroups(policy.name)
        if self.elastic_timeout < 0:
            raise ValueError(f"elastic_timeout must be >= 0, got {self.elastic_timeout}")

    def _check_regroups(self, name: str) -> None:
        """A policy that regroups needs the live machinery: torch 2.14, gloo, a function
        or a Python script."""
        what = f"recovery={name!r}"
        _compat.require_torch("recovery='live'")
        if self.backend not in ("auto", "gloo"):
            # The live group rebuilds an NCCL group (live/comms.py), but a peer lost inside
            # an NCCL all-reduce is not detected: the survivors' kernels wait for it.
            why = ("a rank lost inside an NCCL all-reduce leaves the others' kernels "
                   "waiting for it, which live recovery does not detect yet"
                   if self.backend == "nccl" else
                   "torch's MPI group is MPI_COMM_WORLD, which cannot change its members")
            raise ValueError(
                f"{what} runs on gloo (CUDA tensors included), got "
                f"backend={self.backend!r}: {why}; use backend='auto' or 'gloo', or "
                "recovery='restart' for NCCL")
        if self.command is not None and not (
                self.command[0] in ("python", "python3") and len(self.command) > 1
                and self.command[1].endswith(".py")):
            raise ValueError(f"{what} needs a Python script, 'python SCRIPT.py ...' "
                             "(its init_process_group makes the live group), got "
                             f"{' '.join(self.command[:2])!r}")

    @classmethod
    def build(cls, *, workers: Sequence[str] | None = None,
              init_kwargs: Mapping[str, Any] | None = None,
              env: Mapping[str, str] | None = None,
              resources: Mapping[str, float] | None = None,
              output_dir: str | os.PathLike[str] | None = None,
              stall_timeout: Any = FROM_CONFIG, **fields: Any) -> LaunchOptions:
        """Options from the public call's arguments (normalised: tuples, plain dicts;
        ``stall_timeout`` in seconds, the config's when not given)."""
        return cls(stall_timeout=stall_timeout_of(stall_timeout),
                   workers=tuple(workers) if workers is not None else None,
                   init_kwargs=cloudpickle.dumps(dict(init_kwargs or {})),
                   env=dict(env or {}), resources=dict(resources) if resources else None,
                   output_dir=os.fspath(output_dir) if output_dir is not None else None,
                   **fields)

    @property
    def elastic(self) -> bool:
        """Each attempt takes the workers available (``min_workers``/``max_workers``)."""
        return self.min_workers is not None or self.max_workers is not None

    @property
    def restarting(self) -> bool:
        """The job is an :class:`~dask_ddp.ElasticJob` (it may start again)."""
        return self.max_restarts != 0 or self.elastic
