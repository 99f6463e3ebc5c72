"""The store's side of a live group's regroup protocol (internal).

Every generation of a live group is agreed on the job's store (the scheduler's,
:mod:`~dask_ddp._launch.scheduler.live_stores`), which no rank hosts: its members exchange their
reconfigure handles, each survivor reports its committed step, the first complete
proposal (``compare_set``) fixes the members, the members admit the ranks that join and
record the change (:class:`~dask_ddp._launch.wire.live_records.Generation`), and at the end
each says it finished. :class:`GenerationStore` reads and writes those keys for one
member (:class:`~dask_ddp._launch.rank.live.group.LiveGroup` runs the protocol); the records
are read back, and a loss recorded, by :mod:`dask_ddp._launch.wire.live_store` (the
scheduler, a supervisor).
"""

from __future__ import annotations

import json
import time
from typing import Any

from dask_ddp._launch.rank.live.errors import LiveRecoveryError, MemberLost
from dask_ddp._launch.wire.live_keys import (
    ADMITTED_KEY,
    DEAD_KEY,
    DONE_KEY,
    GEN_KEY,
    LEFT_KEY,
    member_key,
)
from dask_ddp._launch.wire.live_records import Admission, Generation
from dask_ddp._launch.wire.live_store import mark_dead

#: How often a survivor reads the store while the generation is being accounted for.
POLL_S = 0.005


class GenerationStore:
    """One member's reads and writes of the regroup protocol's keys (see the module).

    Parameters
    ----------
    store
        The job's store (a ``TCPStore`` client).
    uid
        The member's lasting id.
    timeout
        Seconds a wait on the other members may take (:class:`LiveRecoveryError`).
    """

    def __init__(self, store: Any, uid: int, timeout: float) -> None:
        self.store = store
        self.uid = uid
        self.timeout = timeout

    def dead(self, uid: int) -> bool:
        return bool(self.store.check([DEAD_KEY.format(uid=uid)]))

    def mark_dead(self) -> None:
        """Record this member as gone (never raises)."""
        mark_dead(self.store, self.uid)

    def mark_left(self, committed: int) -> None:
        """Record this member as left at a step boundary after step ``committed``."""
        self.store.set(LEFT_KEY.format(uid=self.uid), str(committed))

    # -- forming a generation -------------------------------------------------------------
    def exchange_handles(self, generation: int, members: list[int], handle: str) -> list[str]:
        """Post this member's reconfigure handle for ``generation``; every member's, in
        ``members`` order, once all are there."""
        self.store.set(member_key(generation, "handle", self.uid), handle)
        keys = [member_key(generation, "handle", u) for u in members]
        self._wait_keys(keys, members, f"generation {generation}'s members to be ready")
        return [self.store.get(k).decode() for k in keys]

    def _wait_keys(self, keys: list[str], members: list[int], what: str) -> None:
        """Wait until every key is set; a member found dead meanwhile raises (the caller
        starts the next generation)."""
        deadline = time.monotonic() + self.timeout
        while not self.store.check(keys):
            dead = [u for u in members if self.dead(u)]
            if dead:
                raise MemberLost(dead)
            if time.monotonic() > deadline:
                raise LiveRecoveryError(f"waited {self.timeout:g} s for {what}")
            time.sleep(POLL_S)

    def report(self, generation: int, committed: int) -> None:
        """This member's committed step, for the next generation's proposal."""
        self.store.set(member_key(generation, "report", self.uid), str(committed))

    def account(self, generation: int, members: list[int]) -> dict[int, int]:
        """Wait until every member of ``generation`` has reported or is dead; their
        committed steps by uid."""
        deadline = time.monotonic() + self.timeout
        g = generation
        while True:
            reports: dict[int, int] = {}
            pending = []
            for u in members:
                key = member_key(g, "report", u)
                if self.store.check([key]):
                    reports[u] = int(self.store.get(key))
                elif not self.dead(u):
                    pending.append(u)
            if not pending:
                return reports
            if time.monotonic() > deadline:
                raise LiveRecoveryError(
                    f"generation {g}: members {pending} neither reported nor died within "
                    f"{self.timeout:g} s (frozen? the stall rule ends a frozen rank)")
            time.sleep(POLL_S)

    def decide(self, generation: int, proposal: list[int]) -> list[int]:
        """The next generation's members: the first proposal made for it (``compare_set``:
        this one if none was before)."""
        decided = json.loads(self.store.compare_set(
            member_key(generation, "members", 0), "", json.dumps(proposal)))
        return [int(u) for u in decided]

    def decided(self, generation: int) -> list[int]:
        """The members decided after ``generation`` (a joining rank reads its group)."""
        return [int(u) for u in json.loads(self.store.get(member_key(generation, "members", 0)))]

    def admit(self, uids: list[int], admission: Admission) -> None:
        """Tell joining ranks ``uids`` where they were taken in (every member writes it:
        one of them survives to)."""
        for u in uids:
            self.store.set(ADMITTED_KEY.format(uid=u), admission.to_json())

    def record(self, changes: int, generation: int, cause: str, old: list[int],
               members: list[int], step: int, took: float) -> Generation:
        """Record the change that made ``generation`` of ``members`` from ``old``, the
        group's change number ``changes`` (the first write stays: every member of the
        new group writes it, so that one lost just after does not take it along)."""
        gone = [u for u in old if u not in members]
        if gone and all(self.store.check([LEFT_KEY.format(uid=u)]) for u in gone):
            cause = "left at a step boundary (its worker is closing)"
        rec = Generation(generation=changes, time=time.time(), cause=cause,
                         lost=tuple(u for u in old if u not in members),
                         joined=tuple(u for u in members if u not in old),
                         world_size=len(members), step=step, recovery_s=took)
        self.store.compare_set(GEN_KEY.format(g=generation), "", rec.to_json())
        return rec

    # -- the end ---------------------------------------------------------------------------
    def mark_finished(self, generation: int) -> None:
        self.store.set(member_key(generation, "finished", self.uid), "1")

    def all_finished(self, generation: int, members: list[int]) -> bool:
        """Whether every member of ``generation`` returned or is dead (a member lost
        after its last step is done: every step counted it)."""
        return all(self.store.check([member_key(generation, "finished", u)]) or self.dead(u)
                   for u in members)

    def peer_reported(self, generation: int, members: list[int]) -> bool:
        """Whether another member reported for a regroup (its last step broke)."""
        return any(self.store.check([member_key(generation, "report", u)]) for u in members
                   if u != self.uid)

    def mark_done(self) -> None:
        """Every member returned: a rank waiting to join leaves."""
        self.store.set(DONE_KEY, "1")
