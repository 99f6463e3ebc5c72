"""Counts of the samples ``on_error="skip"`` left out, kept where they were skipped.

Each worker process keeps, per ``predict`` call, the count of each partition it computed
(a partition computed again after a lost worker replaces its count, never adds to it);
:func:`skipped` sums them over the cluster's workers. Each skip is also logged on its
worker with the first key skipped.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["call_name", "record_skipped", "remember_call", "skipped"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_counts: dict[str, dict[int, int]] = {}
#: Client side: the name of each ``predict`` result (its graph's output name) to its call.
_calls: dict[str, str] = {}


def record_skipped(call: str, partition: int, n: int, first_key: Any) -> None:
    """Note that ``partition`` of ``call`` left out ``n`` samples (logged as a warning)."""
    logger.warning("predict: skipped %d bad samples in partition %d (the first: %r)", n,
                   partition, first_key)
    with _lock:
        _counts.setdefault(call, {})[partition] = n


def _local_counts(call: str) -> dict[int, int]:
    with _lock:
        return dict(_counts.get(call, {}))


def _name_of(collection: Any) -> str:
    name = getattr(collection, "_name", None) or getattr(collection, "name", None)
    return str(name)


def remember_call(collection: Any, call: str) -> None:
    """Note ``collection`` (a ``predict`` result) as the output of ``call``."""
    _calls[_name_of(collection)] = call


def call_name(collection: Any) -> str:
    """The call a ``predict`` result (or its persisted copy) belongs to."""
    call = _calls.get(_name_of(collection))
    if call is None:
        raise ValueError("skipped(): pass the collection dask_ddp.predict returned (or its "
                         "persisted copy), not one derived from it")
    return call


def skipped(result: Any, client: Any = None) -> int:
    """How many samples ``on_error="skip"`` left out of ``result`` (after it was computed).

    Parameters
    ----------
    result
        The collection :func:`dask_ddp.predict` returned (computed or persisted since).
    client
        The Dask client (default: the current one).

    Returns
    -------
    int
        The samples skipped, summed over the partitions computed so far (a partition
        computed on a worker that was lost since is counted when computed again).
    """
    from distributed import default_client

    call = call_name(result)
    client = client or default_client()
    per_worker = client.run(_local_counts, call)
    merged: dict[int, int] = {}
    for counts in per_worker.values():
        merged.update(counts)
    return sum(merged.values())
