"""The client side of a live job: which ends of ranks the job survives (internal).

A :class:`~dask_ddp._launch.client.job.Job` whose recovery policy regroups (``recovery="live"``)
holds a :class:`LiveWatch`. Its watcher asks it whether the ranks' states so far end the job:
a rank that *left* (its process died: its supervisor returns :class:`LiveLeft`; its
worker left: the watcher cancels its task) does not, while the others go on in a smaller
group; a rank that *raised* (the training function's own error, or the survivors' failed
regroup, :class:`~dask_ddp._launch.rank.live.errors.LiveRecoveryError`) does, and the job falls back
to its ``max_restarts``. While the group has fewer ranks than ``max_workers``, a worker
new to the job (a nanny's restart, ``scale()``, ``adapt()``) gets a rank that joins the
running group at a step boundary (:meth:`LiveWatch.new_workers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from dask_ddp._dashboard import events as dashboard
from dask_ddp._launch.client.placement import GONE, choose_workers
from dask_ddp._launch.client.stall import Stall, activity
from dask_ddp._launch.wire.entry_points import LEAVE_BEFORE_CLOSE, LIVE_STORES
from dask_ddp._launch.wire.live_records import Generation, LiveLeft
from dask_ddp._launch.wire.live_store import (
    CLOSE_HANDLER,
    GENERATIONS_HANDLER,
    LEFT_HANDLER,
    OPEN_HANDLER,
)
from dask_ddp._states import RankActivity
from dask_ddp.errors import GangStartError

logger = logging.getLogger(__name__)


class LiveWatch:
    """A live job's store on the scheduler and its generations (see the module).

    Parameters
    ----------
    client
        The job's client.
    job_id
        The job.
    workers
        The worker of each rank.
    bound
        Seconds a call to the scheduler may take.
    min_size, max_size
        ``min_workers``, ``max_workers`` (``None``: the group never grows).
    kill_rank
        ``kill_rank(job_id, rank)``, run on a worker: SIGKILL that rank if it runs there
        (a frozen rank is ended so its peers go on).
    """

    def __init__(self, client: Any, job_id: str, workers: Sequence[str],
                 bound: float, min_size: int = 1, max_size: int | None = None, *,
                 kill_rank: Callable[[str, int], bool]) -> None:
        self.client = client
        #: Run on a worker: SIGKILL a rank of the job there (see ``rank_process``).
        self.kill_rank = kill_rank
        self.min_size = min_size
        self.max_size = max_size
        self.job_id = job_id
        self.address = open_store(client, job_id, list(workers), bound)
        LEAVE_BEFORE_CLOSE.install(client)  # a closing worker lets its live ranks leave first
        #: How many times a worker had left at each rank's address when the rank was
        #: placed there: a worker restarted at its address (a fixed port) is a new worker,
        #: which may host a joining rank; the one whose rank process was killed may not.
        self.rank_left: list[int] = [0] * len(workers)
        #: Ranks killed because they froze.
        self.ended: set[int] = set()
        #: The membership changes, read from the store as the job ends.
        self.generations: list[Generation] = []

    async def workers_left(self) -> dict[str, int]:
        """How many times a worker left at each of the job's addresses (the scheduler's
        count; one call per watcher poll, for :meth:`gone` and :meth:`new_workers`)."""
        return await workers_left(self.client, self.job_id)

    async def new_workers(self, workers: Sequence[str], busy: Collection[str], active: int,
                          resources: Mapping[str, float] | None,
                          left: Mapping[str, int]) -> list[str]:
        """Running workers new to the job (never hosted one of its ranks ``workers``, or
        came back at an address whose worker left since) and hosting no active rank
        (``busy``), one per rank the group may still take (``max_workers`` less the
        ``active`` ranks)."""
        if self.max_size is None or active >= self.max_size:
            return []
        placed: dict[str, int] = {}
        for w, n in zip(workers, self.rank_left, strict=True):
            placed[w] = max(placed.get(w, 0), n)
        info = dict(await self.client.scheduler.identity(n_workers=-1))
        info["workers"] = {
            a: w for a, w in info.get("workers", {}).items()
            if a not in busy and (a not in placed or left.get(a, 0) > placed[a])
            and w.get("status", "running") not in GONE}
        if not info["workers"]:
            return []
        try:
            fit = choose_workers(info, None, None, resources)
        except GangStartError:
            return []
        return fit[:self.max_size - active]

    async def joined(self, workers: Sequence[str], left: Mapping[str, int]) -> None:
        """A rank joined on ``workers[-1]``: the scheduler marks it lost with its worker."""
        self.rank_left.append(left.get(workers[-1], 0))
        await set_workers(self.client, self.job_id, list(workers))

    def gone(self, workers: Sequence[str], left: Mapping[str, int]) -> list[int]:
        """The ranks whose worker left since they were placed, also when a new worker is
        at the address again (a nanny's quick restart on a fixed port)."""
        return [r for r, w in enumerate(workers) if left.get(w, 0) > self.rank_left[r]]

    @staticmethod
    def fatal(statuses: Sequence[str], lost: Collection[int]) -> bool:
        """Whether the ranks' future states end the job: a rank erred (it raised), or was
        cancelled other than for its lost worker."""
        return any(s == "error" or (s == "cancelled" and r not in lost)
                   for r, s in enumerate(statuses))

    @staticmethod
    def finished(statuses: Sequence[str], lost: Collection[int]) -> bool:
        """Whether the job ended well: every rank finished or left with its worker, and
        at least one finished."""
        return "finished" in statuses and all(
            s == "finished" or (s == "cancelled" and r in lost) for r, s in enumerate(statuses))

    @staticmethod
    def values(values: Sequence[Any]) -> list[Any]:
        """The survivors' return values, in rank order (the ranks that left omitted)."""
        return [v for v in values if not isinstance(v, LiveLeft)]

    @staticmethod
    def frozen(found: Stall) -> list[int]:
        """The stuck ranks of a stall that are frozen (SIGSTOP, a hung host)."""
        return [r for r in found.stuck if activity(found.states[r]) is RankActivity.FROZEN]

    async def end_frozen(self, frozen: Sequence[int], workers: Sequence[str]) -> None:
        """Kill the ``frozen`` ranks (:meth:`frozen`), so their peers' collectives fail at
        once and the group re-forms without them. A rank counts as ended once its worker
        said it killed it; otherwise the next call tries again."""
        for rank in frozen:
            if rank in self.ended:
                continue
            logger.warning("live job %s: rank %d is frozen; killing it so the others go "
                           "on without it", self.job_id, rank)
            answers = await self.client.run(self.kill_rank, self.job_id, rank,
                                            workers=[workers[rank]], on_error="return")
            if answers.get(workers[rank]) is True:
                self.ended.add(rank)
            else:  # not killed: the next look at the stall tries again
                logger.warning("live job %s: killing frozen rank %d on %s did not take (%r)",
                               self.job_id, rank, workers[rank], answers.get(workers[rank]))

    async def publish(self) -> None:
        """Tell the job page about generations it has not seen (never raises)."""
        try:
            gens = await self.read()
        except Exception:
            return
        for g in gens[len(self.generations):]:
            dashboard.job_generation(self.client, self.job_id, {
                **dataclasses.asdict(g), "lost": list(g.lost), "joined": list(g.joined)})
        self.generations = gens

    async def close(self) -> None:
        """Read the generations, then stop the store (never raises)."""
        try:
            await self.publish()
        except Exception as exc:
            logger.warning("live job %s: reading its generations failed: %s", self.job_id, exc)
        await close_store(self.client, self.job_id)

    async def read(self) -> list[Generation]:
        """The generations so far (while the job runs)."""
        texts = await read_generation_texts(self.client, self.job_id)
        return [Generation.from_json(t) for t in texts]


# -- the job's store on the scheduler, through its handlers --------------------------------

def open_store(client: Any, job_id: str, workers: list[str], bound: float) -> str:
    """Job ``job_id``'s store address (a new store on the scheduler)."""
    try:
        LIVE_STORES.install(client)
        # The first job on a scheduler waits for its import of torch.
        return str(client.sync(getattr(client.scheduler, OPEN_HANDLER), job_id=job_id,
                               workers=list(workers), callback_timeout=max(bound, 120.0)))
    except Exception as exc:
        raise RuntimeError(
            "recovery='live' could not start the job's store on the scheduler "
            f"{client.scheduler.address} (it needs torch importable there): "
            f"{type(exc).__name__}: {exc}") from exc


async def set_workers(client: Any, job_id: str, workers: list[str]) -> None:
    """Tell job ``job_id``'s store the worker of every rank (one joined)."""
    await getattr(client.scheduler, OPEN_HANDLER)(job_id=job_id, workers=list(workers))


async def read_generation_texts(client: Any, job_id: str) -> list[str]:
    """Job ``job_id``'s generation records (JSON), from the scheduler; [] on failure."""
    with contextlib.suppress(Exception):
        return list(await getattr(client.scheduler, GENERATIONS_HANDLER)(job_id=job_id))
    return []


async def workers_left(client: Any, job_id: str) -> dict[str, int]:
    """How many times a worker left at each address of job ``job_id``'s ranks."""
    return dict(await getattr(client.scheduler, LEFT_HANDLER)(job_id=job_id))


async def close_store(client: Any, job_id: str) -> None:
    """Stop job ``job_id``'s store (never raises)."""
    with contextlib.suppress(Exception):
        await getattr(client.scheduler, CLOSE_HANDLER)(job_id=job_id)
