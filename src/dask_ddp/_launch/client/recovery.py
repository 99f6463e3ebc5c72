"""The machinery a job's recovery policy needs on the client: :class:`Restart` or
:class:`Live` (internal).

What an event leads to is the job's policy's to say (:mod:`dask_ddp._launch.wire.policy`);
this is what carries a ``REGROUP`` out. A job whose policy regroups gets :class:`Live`
(its store on the scheduler, its generations, new workers joining), any other
:class:`Restart` (nothing to keep: an attempt ends or goes on whole); :func:`for_job`
chooses once, when the job starts. The watcher (:mod:`dask_ddp._launch.client.watcher`) then
calls it at fixed points of its loop, the same for both:

- ``live_store``: the live store's address the ranks' specs carry (at the start);
- ``fatal``: whether the ranks' task states so far end the job (each poll);
- ``left``, ``gone``: the ranks whose worker left, beyond those the scheduler no longer
  knows (each worker check);
- ``grow``, ``publish``: after each worker check (a live group takes new workers, and the
  job page hears of its membership changes);
- ``frozen``, ``end_frozen``: the frozen ranks of a stall, and ending them (a ``REGROUP``);
- ``finished``, ``values``: whether the ended ranks make a success, and its values;
- ``close``: the job ended (cleanup).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from dask_ddp._launch.client.live_watch import LiveWatch
from dask_ddp._launch.client.stall import Stall
from dask_ddp._launch.wire.entry_points import KILL_RANK
from dask_ddp._launch.wire.live_records import Generation
from dask_ddp._launch.wire.options import LaunchOptions
from dask_ddp._launch.wire.rank_spec import RankSpec

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

    @property
    def live_store(self) -> str | None:
        """The job's live store on the scheduler (``None``: the job does not regroup)."""
        ...

    def fatal(self, statuses: Sequence[str], lost: Collection[int]) -> bool: ...
    def finished(self, statuses: Sequence[str], lost: Collection[int]) -> bool: ...
    def values(self, values: Sequence[Any]) -> list[Any]: ...
    async def left(self) -> dict[str, int]: ...
    def gone(self, workers: Sequence[str], left: Mapping[str, int]) -> list[int]: ...
    async def publish(self) -> None: ...
    async def grow(self, statuses: Sequence[str], left: Mapping[str, int],
                   ranks: Ranks) -> None: ...
    def frozen(self, found: Stall) -> list[int]: ...
    async def end_frozen(self, frozen: Sequence[int], workers: Sequence[str]) -> None: ...
    async def close(self) -> None: ...
    async def read_generations(self) -> list[Generation]: ...
    @property
    def generations(self) -> list[Generation]: ...


class Restart:
    """A policy that never regroups: a rank that raised or died ends the attempt (its
    peers are aborted); an :class:`~dask_ddp.ElasticJob` may start another."""

    @property
    def live_store(self) -> str | None:
        return None

    #: A rank erred, or was cancelled other than for its lost worker (the policy answers
    #: a lost worker: the watcher aborts the others unless it continues).
    fatal = staticmethod(LiveWatch.fatal)

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

    def frozen(self, found: Stall) -> list[int]:
        return []  # nothing ends a frozen rank: the stall is the job's

    async def end_frozen(self, frozen: Sequence[int], workers: Sequence[str]) -> None:
        return None

    async def close(self) -> None:
        return None

    async def read_generations(self) -> list[Generation]:
        return []

    @property
    def generations(self) -> list[Generation]:
        return []


class Live:
    """A policy that regroups: a rank its policy regroups without (its process died, its
    worker left, it froze) does not end the job, its peers go on in a smaller group; a
    worker new to the job gets a rank that joins it (below ``max_workers``). A rank that
    *raised* still ends it. The store and generations are
    :class:`~dask_ddp._launch.client.live_watch.LiveWatch`'s.
    """

    def __init__(self, watch: LiveWatch, options: LaunchOptions, name: str) -> None:
        self.watch = watch
        self.options = options
        self.name = name

    @property
    def live_store(self) -> str:
        return self.watch.address

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
        running group at a step boundary (see :mod:`dask_ddp._launch.client.live_watch`)."""
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
                local_rank=0, local_world_size=1, proc_index=0, workers=workers, joins=True))
            await self.watch.joined(ranks.workers, left)
            logger.warning("job %r: rank %d starts on %s to join the group", self.name, rank,
                           worker)

    def frozen(self, found: Stall) -> list[int]:
        return self.watch.frozen(found)

    async def end_frozen(self, frozen: Sequence[int], workers: Sequence[str]) -> None:
        # The frozen ranks are killed: the others re-form without them.
        await self.watch.end_frozen(frozen, workers)

    async def close(self) -> None:
        await self.watch.close()

    async def read_generations(self) -> list[Generation]:
        return await self.watch.read()

    @property
    def generations(self) -> list[Generation]:
        return list(self.watch.generations)


def for_job(client: Any, options: LaunchOptions, job_id: str, name: str,
            workers: Sequence[str]) -> Restart | Live:
    """The recovery machinery of a job starting on ``workers``, chosen once from its
    policy (the store of a job whose policy regroups opens on the scheduler here)."""
    if options.policy.regroups:
        return Live(LiveWatch(client, job_id, workers, options.waits.scheduler_call,
                              min_size=options.min_workers or 1,
                              max_size=options.max_workers, kill_rank=KILL_RANK),
                    options, name)
    return Restart()
