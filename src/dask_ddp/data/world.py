"""This process's place among the ranks, for the loaders (internal)."""

from __future__ import annotations

from dask_ddp._identity import process_group

__all__ = ["rank_and_world"]


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from the initialised ``torch.distributed``
    process group, else ``(0, 1)``; ``DistributedSampler``'s arguments.

    Raises
    ------
    ValueError
        When only one of them is given outside a process group, or the rank is out of range.
    """
    group = process_group()
    if rank is None or world_size is None:
        if group is not None:
            rank = group[0] if rank is None else rank
            world_size = group[1] if world_size is None else world_size
        elif rank is None and world_size is None:
            rank, world_size = 0, 1
        else:
            raise ValueError(
                "give both rank and world_size, or neither (then they come from the "
                f"torch.distributed process group); got rank={rank}, world_size={world_size}"
            )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    return int(rank), int(world_size)
