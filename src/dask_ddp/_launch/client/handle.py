"""What every job of the launcher answers: :class:`JobHandle` (internal).

:class:`~dask_ddp.Job` (one attempt) and :class:`~dask_ddp.ElasticJob` (attempts that
restart) both satisfy it, so code that only follows, waits for or stops a job (``dispatch``,
the command line) types against it. It extends the metrics monitor's own view of a job
(:class:`~dask_ddp._channel.monitor.MonitoredJob`), which lives below the launcher.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from dask_ddp._channel.monitor import MonitoredJob
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp.errors import Restart, StallError


class JobHandle(MonitoredJob, Protocol):
    """A job launched on Dask: its ranks, its outcome, and the means to stop it.

    For an :class:`~dask_ddp.ElasticJob` the rank attributes (``id``, ``futures``,
    ``workers``, ``world_size``) are the current attempt's.
    """

    @property
    def options(self) -> LaunchOptions: ...
    @property
    def workers(self) -> list[str]: ...
    @property
    def world_size(self) -> int: ...
    @property
    def storage(self) -> str | None: ...
    @property
    def restarts(self) -> list[Restart]: ...
    @property
    def stalled(self) -> StallError | None: ...

    def done(self) -> bool:
        """True once the job ended (finished, failed for good or cancelled)."""
        ...

    def result(self, timeout: float | None = None) -> list[Any]:
        """Each rank's return value, in rank order, once the job ended; raises its error."""
        ...

    def cancel(self) -> None:
        """Stop the job's ranks (a job that ended is left as it is)."""
        ...

    def metrics(self) -> Iterator[dict[str, Any]]:
        """The job's metric records from the first, live, until the job ends."""
        ...

    def stacks(self, timeout: float | None = None) -> dict[int, str]:
        """The live Python stacks of the running ranks, ``{rank: text}``."""
        ...

    def rank_states(self) -> dict[int, dict[str, Any]]:
        """Each rank's last recorded activity (stall detection's view)."""
        ...


if TYPE_CHECKING:
    from dask_ddp._launch.client.elastic_job import ElasticJob
    from dask_ddp._launch.client.job import Job

    def _both_are_handles(job: Job | ElasticJob) -> JobHandle:
        """The type checker's proof that both kinds of job satisfy the protocol."""
        return job
