"""What a supervisor task gets from the client: :class:`RankSpec`, one rank's place in its
job (internal).

The client builds one per rank (:mod:`dask_ddp._launch.client.placement`) and submits it
with the rank's supervisor task; the worker starts the rank from it.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

from dask_ddp._launch.wire.options import LaunchOptions


@dataclasses.dataclass(frozen=True)
class RankSpec:
    """Everything a supervisor task needs to start one rank process: the job's options and
    this rank's place in the attempt."""

    options: LaunchOptions
    job_id: str
    run_id: str                  # TORCHELASTIC_RUN_ID: the job, or the elastic job across restarts
    restart: int                 # the attempt (TORCHELASTIC_RESTART_COUNT)
    rank: int
    local_rank: int
    local_world_size: int
    group_rank: int              # the index of this rank's host (torchrun's node rank)
    group_world_size: int        # hosts in the job
    proc_index: int              # this rank's process index on its worker
    workers: tuple[str, ...]     # every rank's worker, in rank order
    master_addr: str
    scheduler: str
    #: The address of the job's live store on the scheduler, when its policy regroups.
    live_store: str | None = None
    #: The rank joins a running live group (it was added to a running job).
    joins: bool = False

    @property
    def worker(self) -> str:
        return self.workers[self.rank]

    @property
    def world_size(self) -> int:
        return len(self.workers)

    @property
    def job_name(self) -> str:
        return self.options.name


def worker_host(address: str) -> str:
    """The host part of a Dask worker address ("tcp://10.0.0.2:4321" -> "10.0.0.2")."""
    parsed = urlsplit(address if "://" in address else f"tcp://{address}")
    if parsed.hostname is None:
        raise ValueError(f"cannot find the host in worker address {address!r}")
    return parsed.hostname
