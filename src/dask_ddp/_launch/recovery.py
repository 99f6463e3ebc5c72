"""What a job does when a rank ends: :class:`Restart` or :class:`Live` (internal).

The job's :class:`~dask_ddp._launch.options.RecoveryMode` picks one of them once, when the
job starts (:func:`for_job`); the watcher (:mod:`dask_ddp._launch.watcher`) then calls it at
fixed points of its loop, the same for both, instead of branching on the mode:

- ``env``: the ranks' environment entries it needs (at the start);
- ``fatal``: whether the ranks' task states so far end the job (each poll);
- ``left``, ``gone``: the ranks whose worker left, beyond those the scheduler no longer
  knows (each worker check);
- ``grow``, ``publish``: after each worker check (a live group takes new workers, and the
  job page hears of its membership changes);
- ``aborts_on_loss``: whether a lost worker's rank aborts its peers;
- ``stalled``: a stall found; whether the mode dealt with it (else it ends the job);
- ``finished``, ``values``: whether the ended ranks make a success, and its values;
- ``close``: the job ended (cleanup).

:class:`Restart` is the seed's behaviour: any rank that fails ends the attempt, and
:func:`dask_ddp._launch.policy.decide` (pure) says whether another attempt starts.
:class:`Live` keeps the survivors going (see :mod:`dask_ddp._launch.live.watch`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from dask_ddp._launch.live.keys import JOIN_ENV
from dask_ddp._launch.live.records import Generation
from dask_ddp._launch.live.watch import LiveWatch
from dask_ddp._launch.options import LaunchOptions, RecoveryMode
from dask_ddp._launch.placement import RankSpec
from dask_ddp._launch.rank_process import kill_rank
from dask_ddp._launch.stall import Stall

logger = logging.getLogger(__name__)


class Ranks(Protocol):
    """What a recovery object sees of a job's ranks, and how it adds one (the watcher)."""

    @property
    def workers(self) -> list[str]: ...
    @property
    def specs(self) -> list[RankSpec]: ...
    @property
    def lost(self) -> Mapping[int, Any]: ...

    def add_rank(self, spec: RankSpec) -> None:
        """Submit one more rank (``spec.rank`` is the next one, on ``spec.worker``)."""
        ...


class Recovery(Protocol):
    """The fixed points at which the watcher asks the job's recovery (see the module)."""

    mode: RecoveryMode
    #: Whether a lost worker's rank aborts the other ranks.
    aborts_on_loss: bool

    def env(self) -> dict[str, str]: ...
    def fatal(self, statuses: Sequence[str], lost: Collection[int]) -> bool: ...
    def finished(self, statuses: Sequence[str], lost: Collection[int]) -> bool: ...
    def values(self, values: Sequence[Any]) -> list[Any]: ...
    async def left(self) -> dict[str, int]: ...
    def gone(self, workers: Sequence[str], left: Mapping[str, int]) -> list[int]: ...
    async def publish(self) -> None: ...
    async def grow(self, statuses: Sequence[str], left: Mapping[str, int],
                   ranks: Ranks) -> None: ...
    async def stalled(self, found: Stall, workers: Sequence[str]) -> bool: ...
    async def close(self) -> None: ...
    async def read_generations(self) -> list[Generation]: ...
    @property
    def generations(self) -> list[Generation]: ...


class Restart:
    """``recovery="restart"``: a rank that raised, died or lost its worker ends the attempt
    (its peers are aborted); an :class:`~dask_ddp.ElasticJob` may start another."""

    mode = RecoveryMode.RESTART
    aborts_on_loss = True

    def env(self) -> dict[str, str]:
        return {}

    @staticmethod
    def fatal(statuses: Sequence[str], lost: Collection[int]) -> bool:
        """A rank erred or was cancelled (also for its lost worker)."""
        return any(s in ("error", "cancelled") for s in statuses)

    @staticmethod
    def finished(statuses: Sequence[str], lost: Collection[int]) -> bool:
        """Every rank finished."""
        return all(s == "finished" for s in statuses)

    @staticmethod
    def values(values: Sequence[Any]) -> list[Any]:
        return list(values)

    async def left(self) -> dict[str, int]:
        return {}

    def gone(self, workers: Sequence[str], left: Mapping[str, int]) -> list[int]:
        return []  # the scheduler's own view of its workers says which left

    async def publish(self) -> None:
        return None

    async def grow(self, statuses: Sequence[str], left: Mapping[str, int],
                   ranks: Ranks) -> None:
        return None  # an attempt keeps its ranks

    async def stalled(self, found: Stall, workers: Sequence[str]) -> bool:
        return False  # the stall ends the job

    async def close(self) -> None:
        return None

    async def read_generations(self) -> list[Generation]:
        return []

    @property
    def generations(self) -> list[Generation]:
        return []


class Live:
    """``recovery="live"``: a rank that left (its process died, its worker left) does not
    end the job, its peers go on in a smaller group; a worker new to the job gets a rank
    that joins it (below ``max_workers``); a frozen rank is killed rather than stalling the
    job. A rank that *raised* still ends it. The store and generations are
    :class:`~dask_ddp._launch.live.watch.LiveWatch`'s.
    """

    mode = RecoveryMode.LIVE
    aborts_on_loss = False

    def __init__(self, watch: LiveWatch, options: LaunchOptions, name: str) -> None:
        self.watch = watch
        self.options = options
        self.name = name

    def env(self) -> dict[str, str]:
        return self.watch.env()

    def fatal(self, statuses: Sequence[str], lost: Collection[int]) -> bool:
        return self.watch.fatal(statuses, lost)

    def finished(self, statuses: Sequence[str], lost: Collection[int]) -> bool:
        return self.watch.finished(statuses, lost)

    def values(self, values: Sequence[Any]) -> list[Any]:
        return self.watch.values(values)

    async def left(self) -> dict[str, int]:
        return await self.watch.workers_left()

    def gone(self, workers: Sequence[str], left: Mapping[str, int]) -> list[int]:
        # A live job also knows the workers that left and came back at their address.
        return self.watch.gone(workers, left)

    async def publish(self) -> None:
        await self.watch.publish()

    async def grow(self, statuses: Sequence[str], left: Mapping[str, int],
                   ranks: Ranks) -> None:
        """Below ``max_workers``: a rank on each worker new to the job, which joins the
        running group at a step boundary (see :mod:`dask_ddp._launch.live.watch`)."""
        if self.options.nprocs_per_worker != 1:
            return
        busy = [ranks.workers[r] for r, s in enumerate(statuses)
                if s == "pending" and r not in ranks.lost]
        for worker in await self.watch.new_workers(ranks.workers, busy, len(busy),
                                                   self.options.resources, left):
            template = ranks.specs[0]
            workers = (*ranks.workers, worker)
            rank = len(workers) - 1
            ranks.add_rank(dataclasses.replace(
                template, rank=rank, group_rank=rank, group_world_size=len(workers),
                local_rank=0, local_world_size=1, proc_index=0, workers=workers,
                options=dataclasses.replace(template.options,
                                            env={**template.options.env, JOIN_ENV: "1"})))
            await self.watch.joined(ranks.workers, left)
            logger.warning("job %r: rank %d starts on %s to join the group", self.name, rank,
                           worker)

    async def stalled(self, found: Stall, workers: Sequence[str]) -> bool:
        # The frozen ranks are killed: the others re-form without them.
        return await self.watch.end_frozen(found, workers)

    async def close(self) -> None:
        await self.watch.close()

    async def read_generations(self) -> list[Generation]:
        return await self.watch.read()

    @property
    def generations(self) -> list[Generation]:
        return list(self.watch.generations)


def for_job(client: Any, options: LaunchOptions, job_id: str, name: str,
            workers: Sequence[str]) -> Restart | Live:
    """The recovery of a job starting on ``workers``, chosen once from its options (a live
    job's store opens on the scheduler here)."""
    if options.recovery_mode is RecoveryMode.LIVE:
        return Live(LiveWatch(client, job_id, workers, options.waits.scheduler_call,
                              min_size=options.min_workers or 1,
                              max_size=options.max_workers, kill_rank=kill_rank),
                    options, name)
    return Restart()
