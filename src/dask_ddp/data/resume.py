"""Where a Loader resumes from its ``state_dict`` (internal): the options every Loader
checks against a saved state, and the position of a Loader over tar shards, on the same
world size or another (see :class:`~dask_ddp.data.TarShards`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dask_ddp.data.shards import TarShards

__all__ = ["check_batch", "check_saved", "shard_resume"]

logger = logging.getLogger(__name__)

#: (shard, begin, end) runs of samples.
Segments = list[tuple[int, int, int]]


def check_saved(state: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """Check that ``state`` was saved with this Loader's options ``mine`` (a key the state
    lacks passes).

    Raises
    ------
    ValueError
        An option differs, naming both values.
    """
    for key, value in mine.items():
        if key in state and state[key] != value:
            raise ValueError(
                f"state_dict was saved with {key}={state[key]!r} but this loader has {value!r}")


def check_batch(batch: int, batches: int) -> int:
    """``batch``, a saved position in an epoch of ``batches`` batches.

    Raises
    ------
    ValueError
        It is outside ``[0, batches]``.
    """
    if not 0 <= batch <= batches:
        raise ValueError(f"state_dict batch {batch} is outside [0, {batches}]")
    return batch


def saved_segments(state: Mapping[str, Any], shards: TarShards, *,
                   skip_errors: bool) -> Segments | None:
    """The epoch's (shard, begin, end) runs saved in a state dict (None: every shard
    whole); a state saved with a list of whole shards (``epoch_shards``) reads as runs."""
    if state.get("epoch_segments") is not None:
        return [(int(s), int(b), int(e)) for s, b, e in state["epoch_segments"]]
    if state.get("epoch_shards") is not None:
        counts = shards.shard_counts(skip_errors)
        return [(int(s), 0, counts[int(s)]) for s in state["epoch_shards"]]
    return None


def shard_resume(state: Mapping[str, Any], shards: TarShards, *, world_size: int,
                 batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                 skip_errors: bool) -> tuple[int, Segments | None]:
    """The batch of the saved epoch a Loader over ``shards`` resumes at, and the epoch's
    sample runs (None: every shard whole). On the saved world size, the saved position;
    on another, batch 0 of the samples no rank had yielded, dealt over ``world_size``."""
    epoch, batch = int(state["epoch"]), int(state["batch"])
    segments = saved_segments(state, shards, skip_errors=skip_errors)
    if int(state["world_size"]) == world_size:
        return batch, segments
    segments = shards.unread_segments(
        epoch,
        min(batch * batch_size, 1 << 62),
        world_size=int(state["world_size"]),
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        epoch_segments=segments,
        skip_errors=skip_errors,
    )
    logger.info("resuming epoch %d on %d ranks (saved on %d): %d samples left to read",
                epoch, world_size, state["world_size"], sum(e - b for _, b, e in segments))
    return 0, segments
