"""Where a live rank stands in its group, and the ways in and out (internal).

A rank is a member, joining (started while the group runs: a group of itself until a
step boundary admits it), leaving (asked to, by SIGTERM: at the next step boundary) or
left (:class:`MemberState`). The way in is the join queue on the job's store
(:class:`JoinQueue`: a joining rank asks and waits for its admission; rank 0 looks for
waiting ranks, the members take them in); the way out ends the rank's process with
:data:`LEAVE_EXIT` (:func:`end_process`), not a failure of the job.
"""

from __future__ import annotations

import atexit
import enum
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from dask_ddp._launch.wire.live_keys import ADMITTED_KEY, DEAD_KEY, DONE_KEY, JOIN_COUNT, JOIN_KEY
from dask_ddp._launch.wire.live_records import Admission

#: The exit code of a rank process that left its live group.
LEAVE_EXIT = 75
#: Join requests read per look, at most (the store is shared with the job's ranks).
MAX_JOINS = 1000
#: How often rank 0 looks for a waiting joiner (one store read, no collective).
JOIN_CHECK_S = 0.25
#: How often a joining rank looks whether it was admitted.
ADMIT_POLL_S = 0.05


class MemberState(enum.Enum):
    """Where this rank stands in its live group (one name for it in every module)."""

    MEMBER = "member"  # in the group, stepping with it
    JOINING = "joining"  # started while the group runs; a group of itself until admitted
    LEAVING = "leaving"  # asked to leave (SIGTERM): at the next step boundary
    LEFT = "left"  # recorded gone; the process ends

    @property
    def is_terminal(self) -> bool:
        return self is MemberState.LEFT


class NotAdmitted(Exception):
    """A joining rank will not be admitted (the job ended, its worker closes, no step
    boundary took it in time): it leaves quietly."""


class JoinQueue:
    """The join requests on the job's store, seen by one rank.

    A joining rank asks and waits (:meth:`ask_and_wait`); rank 0 asks whether one waits
    (:meth:`due`, then :meth:`waiting`) and the members of an admission take the waiting
    ones in (:meth:`waiting`).
    """

    def __init__(self, store: Any, uid: int) -> None:
        self.store = store
        self.uid = uid
        #: Join requests this rank saw handled (admitted or dead), by their number.
        self._done: set[int] = set()
        self._next_check = 0.0

    def ask_and_wait(self, leaving: Callable[[], bool], wait: float) -> Admission:
        """Ask to join; this rank's admission once a step boundary took it in. Raises
        :class:`NotAdmitted` when the group finished first, ``leaving()`` says its worker
        is closing, or ``wait`` seconds passed."""
        n = int(self.store.add(JOIN_COUNT, 1))
        self.store.set(JOIN_KEY.format(n=n), str(self.uid))
        deadline = time.monotonic() + wait
        key = ADMITTED_KEY.format(uid=self.uid)
        while not self.store.check([key]):
            if self.store.check([DONE_KEY]):
                raise NotAdmitted(
                    "the group finished before a step boundary admitted this rank")
            if leaving():  # its worker is closing
                raise NotAdmitted("it was asked to leave before a step boundary admitted it")
            if time.monotonic() > deadline:
                raise NotAdmitted(f"no step boundary admitted this rank within {wait:g} s")
            time.sleep(ADMIT_POLL_S)
        return Admission.from_json(self.store.get(key))

    def due(self) -> bool:
        """Whether it is time to look at the store again (at most every
        :data:`JOIN_CHECK_S`)."""
        now = time.monotonic()
        if now < self._next_check:
            return False
        self._next_check = now + JOIN_CHECK_S
        return True

    def waiting(self, members: list[int], limit: int) -> list[int]:
        """Up to ``limit`` ranks waiting to join (neither admitted nor dead, nor among
        ``members``), oldest first."""
        out: list[int] = []
        count = min(int(self.store.add(JOIN_COUNT, 0)), MAX_JOINS)
        for n in range(1, count + 1):
            if len(out) >= limit:
                break
            key = JOIN_KEY.format(n=n)
            if n in self._done or not self.store.check([key]):
                continue
            uid = int(self.store.get(key))
            if uid in members or self.store.check(
                    [ADMITTED_KEY.format(uid=uid)]) or self.store.check(
                    [DEAD_KEY.format(uid=uid)]):
                self._done.add(n)
                continue
            out.append(uid)
        return out


def end_process() -> NoReturn:
    """End a rank that left its group (or never joined it): its exit handlers run (the
    results channel flushes there), then the process exits with :data:`LEAVE_EXIT`."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # noqa: SLF001 (the exit handlers must run before os._exit, which skips them)
    os._exit(LEAVE_EXIT)
