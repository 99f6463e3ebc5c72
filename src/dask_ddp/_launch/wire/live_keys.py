"""Every name live recovery shares between processes (internal).

The keys of a live job's store (on the scheduler, :mod:`~dask_ddp._launch.scheduler.live_stores`),
which the ranks, their supervisors and the scheduler read and write, and the environment
variable the group sets for ``rank_info``: one place, so a reader and a writer of a name
cannot drift apart.
"""

from __future__ import annotations

# -- environment variables ----------------------------------------------------------------
# A rank learns that its job regroups, its store, sizes and whether it joins from its
# ``LiveStart`` record (:mod:`~dask_ddp._launch.wire.live_records`), never from a variable.
#: The rank's membership changes so far, for ``rank_info().generation`` (set by the group).
GENERATION_ENV = "DASK_DDP_GENERATION"

# -- the store's keys ---------------------------------------------------------------------
#: The store's key prefix of the process group itself (its reconfigure rendezvous).
PG_PREFIX = "dask_ddp/live/pg"
#: A member's loss, set by its supervisor or the scheduler: ``dead/<uid>``.
DEAD_KEY = "dask_ddp/live/dead/{uid}"
#: A member that left at a step boundary (not lost): ``left/<uid>``, its last step.
LEFT_KEY = "dask_ddp/live/left/{uid}"
#: The record of the group formed as generation ``g``
#: (:class:`~dask_ddp._launch.wire.live_records.Generation`), JSON: ``gen/<g>``. Every member
#: of the new group writes it (the first write stays), so that a member lost just after
#: the change (two ranks dying 0.1 s apart) does not take the record with it.
GEN_KEY = "dask_ddp/live/gen/{g}"
#: A rank waiting to join the group: ``join/<n>`` holds its uid (``joins`` counts them).
JOIN_COUNT = "dask_ddp/live/joins"
JOIN_KEY = "dask_ddp/live/join/{n}"
#: The generation a joining rank was admitted to, and the group's count of membership
#: changes with its admission (:class:`~dask_ddp._launch.wire.live_records.Admission`), JSON:
#: ``admitted/<uid>``.
ADMITTED_KEY = "dask_ddp/live/admitted/{uid}"
#: Set once every member returned: a rank still waiting to join leaves.
DONE_KEY = "dask_ddp/live/done"


def member_key(gen: int, what: str, uid: int) -> str:
    """A member's key in generation ``gen``: its ``handle``, ``report``, ``finished``, or
    the generation's ``members`` (uid 0)."""
    return f"dask_ddp/live/g{gen}/{what}/{uid}"
