"""A live job's store as every process reaches it (internal).

The store is hosted by the scheduler (:mod:`dask_ddp._launch.scheduler.live_stores`); the
client opens and closes it through the scheduler handlers named here; a rank and its
supervisor connect to it (:func:`connect`); a loss is recorded by a supervisor or the
scheduler (:func:`mark_dead`); the generation records are read back by the scheduler and
tests (:func:`generation_texts`). The group's own protocol on it is the rank's
(:mod:`dask_ddp._launch.rank.live.generations`).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

from dask_ddp._launch.wire.live_keys import DEAD_KEY, GEN_KEY, member_key
from dask_ddp._launch.wire.live_records import Generation

OPEN_HANDLER = "dask_ddp_live_open"
CLOSE_HANDLER = "dask_ddp_live_close"
GENERATIONS_HANDLER = "dask_ddp_live_generations"
LEFT_HANDLER = "dask_ddp_live_left"
#: Generation records read back per call, at most (a store answers what ranks wrote).
MAX_GENERATIONS = 10_000


def connect(address: str, timeout: float = 60.0) -> Any:
    """A client of the live store at ``host:port``."""
    from torch.distributed import TCPStore

    host, port = address.rsplit(":", 1)
    return TCPStore(host, int(port), None, False, timedelta(seconds=timeout))


def mark_dead(store: Any, uid: int) -> None:
    """Record member ``uid`` as lost (its supervisor or the scheduler; never raises)."""
    with contextlib.suppress(Exception):
        store.set(DEAD_KEY.format(uid=uid), "1")


def generation_texts(store: Any, limit: int = 10_000) -> list[str]:
    """The generation records on ``store`` (JSON), oldest first.

    Generation ``g + 1`` was tried once generation ``g``'s members were decided (its
    ``members`` key): the group's own generations, some of which broke while forming or
    changed nobody (no record), are read up to the first never tried; at most ``limit``
    records and ``4 * limit`` generations.
    """
    out: list[str] = []
    for g in range(4 * limit):
        if len(out) >= limit or not store.check([member_key(g, "members", 0)]):
            break
        key = GEN_KEY.format(g=g + 1)
        if store.check([key]):
            out.append(store.get(key).decode())
    return out


def read_generations(store: Any, limit: int = 10_000) -> list[Generation]:
    """The generation records on ``store``, oldest first (bounded by ``limit``)."""
    return [Generation.from_json(t) for t in generation_texts(store, limit)]
