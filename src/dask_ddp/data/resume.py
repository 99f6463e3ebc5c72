"""Where a Loader resumes from its ``state_dict`` (internal): the options every Loader
checks against a saved state, and the batch it resumes at (each Source decides the rest:
tar shards resume on another world size, see :class:`~dask_ddp.data.sources.ShardSource`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Segments", "check_batch", "check_saved"]

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
