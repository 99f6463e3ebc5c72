"""What a rank process knows about itself, read from its environment."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """Where this process sits in its job (see :func:`rank_info`)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    job_name: str
    job_id: str
    restart: int


def rank_info() -> RankInfo:
    """Return this rank's place in its job, from the environment the launcher set.

    Works in any rank started by :func:`dask_ddp.submit`, :func:`dask_ddp.dispatch.run` or
    :func:`dask_ddp.run_command`, and under torchrun (job name and id are then empty).

    Raises
    ------
    RuntimeError
        Outside a rank process (``RANK`` or ``WORLD_SIZE`` is not set).

    Examples
    --------
    >>> info = dask_ddp.rank_info()  # doctest: +SKIP
    >>> info.rank, info.world_size  # doctest: +SKIP
    (0, 2)
    """
    env = os.environ
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
    if missing:
        raise RuntimeError(
            f"rank_info() called outside a rank process: {', '.join(missing)} not set "
            "(call it inside the function given to dask_ddp.submit or dispatch.run)")
    rank = int(env["RANK"])
    world = int(env["WORLD_SIZE"])
    return RankInfo(
        rank=rank,
        local_rank=int(env.get("LOCAL_RANK", rank)),
        world_size=world,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
        job_name=env.get("DASK_DDP_JOB_NAME", ""),
        job_id=env.get("DASK_DDP_JOB_ID", ""),
        restart=int(env.get("DASK_DDP_RESTART", "0")),
    )
