"""Live recovery inside a rank process: the group re-forms without a lost rank (internal).

A job submitted with ``recovery="live"`` keeps its surviving rank processes when a rank
is lost. Its members are agreed on a store that no rank hosts (the scheduler's,
:mod:`~dask_ddp._launch.scheduler.live_stores`); on gloo the default process group is made with
``enable_reconfigure=True`` there, so that ``torch.distributed._reconfigure`` gives the
same group object (the one the user's ``DistributedDataParallel`` holds) a new set of
peers, generation after generation; a backend that cannot reconfigure (NCCL) gets new
groups every generation, the gradients' beside a gloo control group (:mod:`.comms`).

How the library regains control without a change to the user's loop: the
:class:`~dask_ddp.Checkpointer` a training function makes calls
:func:`~dask_ddp._launch.rank.live.attach.attach`, which hooks the DDP model, optimizer and
loader into this rank's :class:`LiveGroup`. The group's protocol, here:

- a failed step re-forms the group (:meth:`LiveGroup.regroup`): every survivor reports
  its committed step (the optimizer steps it applied) on the store, waits until each
  member of the generation has reported or is known dead, and the first complete
  proposal (``compare_set``) fixes the members, the most advanced survivor first; the
  group is reconfigured, and rank 0 broadcasts its step, parameters, buffers, optimizer
  and LR scheduler state and torch's generator;
- a rank started on a worker that came while the group was below ``max_workers`` makes
  a group of itself (its DDP constructor's collectives stay its own), asks to join on the
  store and waits in its Checkpointer; rank 0 reads the store at most every
  ``JOIN_CHECK_S`` and says so in a step's all-reduce; at the top of the next step every
  member re-forms the group with it (joiners last, :meth:`LiveGroup.regroup` with
  ``admit``), it takes the state as above, and the epoch's unread samples are dealt
  again over the bigger group.

Its collaborators: :mod:`.generations` (the protocol's keys on the store),
:mod:`.comms` (the groups, reconfigured in place or rebuilt, and a rank alone),
:mod:`.membership` (the member's state, the join queue, the way out) and
:mod:`.handoff` (rank 0's state on every member, through the
:class:`~.handoff.Participant` the Checkpointer attached).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, NoReturn

from dask_ddp._launch.rank.live import comms
from dask_ddp._launch.rank.live.errors import LiveRecoveryError, MemberLost, is_peer_error
from dask_ddp._launch.rank.live.generations import GenerationStore
from dask_ddp._launch.rank.live.handoff import Participant, hand_on
from dask_ddp._launch.rank.live.membership import (
    JoinQueue,
    MemberState,
    NotAdmitted,
    end_process,
)
from dask_ddp._launch.wire.live_keys import GENERATION_ENV
from dask_ddp._launch.wire.live_records import Admission

logger = logging.getLogger(__name__)

#: How often a member that returned looks whether the others did.
FINISH_POLL_S = 0.05


class LiveGroup:
    """This rank's membership of a live job's group.

    Parameters
    ----------
    store
        The job's store, hosted outside the ranks (a ``TCPStore`` client).
    uid
        This member's lasting id (its rank in the job's first group).
    world_size
        The first group's size.
    backend
        The gradients' backend: ``"gloo"`` (one group, reconfigured in place) or
        ``"nccl"`` (rebuilt every generation, beside a gloo control group; see
        :mod:`.comms`).
    timeout
        Seconds a regroup may take before it gives up (:class:`LiveRecoveryError`).
    min_size
        The fewest members the group may shrink to.
    max_size
        The most members it may grow to (ranks that join); ``None``: no joins.
    rebuild
        Give every generation new groups, the gradients' beside a gloo control group
        (:class:`~.comms.Rebuilt`); ``None``: only for a backend whose group cannot be
        reconfigured in place (``True`` with gloo: the NCCL path, gloo standing in).
    """

    def __init__(self, store: Any, uid: int, world_size: int, *, backend: str = "gloo",
                 timeout: float = 60.0, min_size: int = 1,
                 max_size: int | None = None, rebuild: bool | None = None) -> None:
        self.store = store
        self.uid = uid
        self.members: list[int] = list(range(world_size))
        self.generation = 0
        #: Membership changes so far (``rank_info().generation``, the records' number).
        self.changes = 0
        self.backend = backend
        self.timeout = timeout
        self.min_size = min_size
        #: Optimizer steps applied (the same on every member after each regroup).
        self.committed = 0
        #: The model, optimizer and loader hooked in (``live.attach.Attached``).
        self.attached: Participant | None = None
        #: Rank 0's loader (epoch, batches yielded) at the last regroup.
        self.data_position = (0, 0)
        #: The members the last regroup lost.
        self.lost: list[int] = []
        self.max_size = max_size
        #: Where this rank stands in the group (joining, leaving; see :class:`MemberState`).
        self.state = MemberState.MEMBER
        #: The protocol's keys on the store, and the join requests there.
        self.gens = GenerationStore(store, uid, timeout)
        self.joins = JoinQueue(store, uid)
        #: The process groups and how they follow a change (see :mod:`.comms`).
        self.comms = comms.for_backend(backend, store, timeout, rebuild)

    # -- the group ----------------------------------------------------------------------
    @property
    def joining(self) -> bool:
        """Started to join a running group (see :meth:`start_joining`), not yet admitted."""
        return self.state is MemberState.JOINING

    @property
    def leaving(self) -> bool:
        """Asked to leave (SIGTERM): at the next step boundary."""
        return self.state is MemberState.LEAVING

    @property
    def rank(self) -> int:
        return self.members.index(self.uid)

    def start(self) -> None:
        """Make the groups with the first members (see :mod:`.comms`)."""
        self.comms.start(self.rank, len(self.members))
        self._reconfigure()
        os.environ[GENERATION_ENV] = "0"

    def _reconfigure(self) -> None:
        """Give this generation's members their groups (a collective over them):
        reconfigured in place, or rebuilt (DDP takes the new default group at its next
        forward)."""
        g = self.generation
        handles = self.gens.exchange_handles(g, self.members, self.comms.handle())
        self.comms.form(g + 1, handles, self.rank)
        if self.comms.rebuilds and self.attached is not None:
            self.attached.group_rebuilt()
        os.environ["RANK"] = str(self.rank)
        os.environ["WORLD_SIZE"] = str(len(self.members))

    def regroup(self, cause: str, *, admit: bool = False) -> int:
        """Re-form the group without the lost members and agree on the state; returns
        the agreed committed step. Raises :class:`LiveRecoveryError`.

        ``admit``: at a step boundary every member agreed on (the step's all-reduce
        carried rank 0's word that a rank waits to join), the waiting ranks are taken in,
        last in rank order, if every member reported the same step (a loss in between
        makes it an ordinary regroup; the joiners wait for the next admission)."""
        t0 = time.monotonic()
        old = list(self.members)
        if not admit:
            self._go_solo()
        for _ in range(len(old) + 2):  # each round loses at least one member
            g = self.generation
            self.gens.report(g, self.committed)
            reports = self.gens.account(g, self.members)
            proposal = sorted(reports, key=lambda u: (-reports[u], self.members.index(u)))
            if admit and len(reports) == len(self.members) and len(set(reports.values())) == 1:
                room = (self.max_size or len(proposal)) - len(proposal)
                proposal += self.joins.waiting(self.members, room)
            decided = self.gens.decide(g, proposal)
            if self.uid not in decided:
                raise LiveRecoveryError(f"generation {g + 1} was formed without this rank")
            if len(decided) < self.min_size:
                gone = [u for u in old if u not in decided]
                raise LiveRecoveryError(
                    f"{len(decided)} of {len(old)} ranks survived (ranks {gone} of "
                    f"generation {g} lost), fewer than min_workers={self.min_size}")
            joined = [u for u in decided if u not in self.members]
            self.gens.admit(joined, Admission(generation=g + 1, changes=self.changes + 1))
            self.members = decided
            self.generation = g + 1
            try:
                self._reconfigure()
                step = self._hand_on(joined, [u for u in old if u not in self.members])
            except MemberLost:
                continue
            except Exception as exc:  # a collective of the new group broke: next round
                if not is_peer_error(exc):
                    raise
                logger.warning("generation %d broke while forming (%s); again",
                               self.generation, exc)
                continue
            self.lost = [u for u in old if u not in self.members]
            if self.members != old:
                self.changes += 1
                self._record(cause, old, step, time.monotonic() - t0)
            os.environ[GENERATION_ENV] = str(self.changes)
            return step
        raise LiveRecoveryError(f"the group did not re-form after {len(old) + 1} rounds")

    def finish_barrier(self) -> None:
        """Wait until every member's function returned. A member that fails meanwhile
        (its last step broke where this rank's completed) reports for a regroup: this
        rank takes part (it is the most advanced: the others take its state) and waits
        again in the new generation."""
        wait = max(self.timeout, 300.0)
        while True:
            g, members = self.generation, list(self.members)
            self.gens.mark_finished(g)
            deadline = time.monotonic() + wait
            while True:
                if self.gens.all_finished(g, members):
                    self.gens.mark_done()  # a rank waiting to join leaves
                    return
                if self.gens.peer_reported(g, members):
                    self.regroup("a peer failed after this rank returned")
                    break
                if time.monotonic() > deadline:
                    raise LiveRecoveryError(
                        f"the group's other ranks did not return within {wait:g} s")
                time.sleep(FINISH_POLL_S)

    def _hand_on(self, joined: list[int], lost: list[int]) -> int:
        """Rank 0's step and state on every member (see :func:`~.handoff.hand_on`)."""
        agreed, self.data_position = hand_on(
            self.attached, self.committed, self.rank, len(self.members), joined=joined,
            lost=lost, joining=self.uid in joined, control=self.comms.control)
        return agreed

    def _record(self, cause: str, old: list[int], step: int, took: float) -> None:
        rec = self.gens.record(self.changes, self.generation, cause, old, self.members,
                               step, took)
        if self.rank != 0:
            return
        logger.warning("live recovery: generation %d of %d ranks (lost %s, joined %s) from "
                       "step %d in %.3f s", rec.generation, len(self.members),
                       list(rec.lost), list(rec.joined), step, took)

    # -- growing back ------------------------------------------------------------------
    def start_joining(self) -> None:
        """A rank started while the group runs: the default group is this rank alone
        (reconfigurable) until :meth:`join` (its Checkpointer) takes it into the group,
        so the user's DDP constructor, whose collectives the running members would not
        mirror, runs in a group of one."""
        self.members = [self.uid]
        self.generation = -1
        self.state = MemberState.JOINING
        self.comms.solo(self.uid)

    def join(self) -> None:
        """Ask to join, wait until a step boundary admits this rank, then take the
        group's state from its rank 0 (a rank the group never admits, because the job
        ended first, leaves quietly)."""
        try:
            admitted = self.joins.ask_and_wait(lambda: self.leaving,
                                               max(600.0, 10 * self.timeout))
        except NotAdmitted as exc:
            self._quit(str(exc))
        g, self.changes = admitted.generation, admitted.changes
        self.members = self.gens.decided(g - 1)
        self.generation = g
        self.state = MemberState.MEMBER
        try:
            self._reconfigure()
            self.committed = self._hand_on([self.uid], [])
        except Exception as exc:  # a member lost while this rank joined: it leaves
            if not (isinstance(exc, MemberLost) or is_peer_error(exc)):
                raise
            self._quit(f"the group broke while this rank joined it ({exc})")
        os.environ[GENERATION_ENV] = str(self.changes)
        if self.attached is not None:  # the user's step counter, for its restore()
            self.attached.joined(self.committed)
        logger.warning("rank %d joined the group as rank %d of %d at step %d", self.uid,
                       self.rank, len(self.members), self.committed)

    @property
    def can_grow(self) -> bool:
        """Whether a rank may join (the group is below the job's ``max_workers``): the
        same answer on every member at the same step."""
        return self.max_size is not None and len(self.members) < self.max_size

    def join_wanted(self) -> bool:
        """Rank 0, at a step's first all-reduce: whether a rank waits to join and the
        group can take it now (the store is read at most every ``JOIN_CHECK_S``)."""
        if not self.can_grow or not self.joins.due():
            return False
        att = self.attached
        return bool(self.joins.waiting(self.members, 1)) and (att is None or att.can_redeal())

    # -- leaving -------------------------------------------------------------------------
    def _quit(self, why: str) -> NoReturn:
        """A joining rank that cannot join ends its process (not a failure of the job)."""
        self.gens.mark_dead()
        self.state = MemberState.LEFT
        logger.warning("rank %d leaves without joining: %s", self.uid, why)
        end_process()

    def request_leave(self) -> None:
        """Leave the group at the next step boundary (a signal handler calls this)."""
        self.state = MemberState.LEAVING

    def leave_now(self) -> NoReturn:
        """At a step boundary: record this rank as gone and end the process. The others'
        next all-reduce fails at once; they complete that step without this rank, whose
        steps so far all counted, and read its unread samples.

        Recorded first (the others then account for it without waiting), its connections
        dropped next (a peer already blocked on it wakes now, not once the exit handlers
        ran, which takes seconds on a loaded host)."""
        self.gens.mark_left(self.committed)
        self.gens.mark_dead()
        self.state = MemberState.LEFT
        with contextlib.suppress(Exception):  # it exits either way
            self._go_solo()
        logger.warning("rank %d leaves the group after step %d", self.uid, self.committed)
        end_process()

    def _go_solo(self) -> None:
        """Drop this rank's connections of the broken generation at once (a group of
        this rank alone, or the groups aborted: see :meth:`~.comms.Comms.drop`)."""
        self.comms.drop(self.generation, self.uid)
        if self.comms.rebuilds and self.attached is not None:
            self.attached.drop_group()  # DDP lets the old group go: it closes its connections


# -- this rank's objects ------------------------------------------------------------------
_GROUP: LiveGroup | None = None


def install(group: LiveGroup) -> None:
    """Make ``group`` the one :func:`attach` hooks into (the rank process, live mode)."""
    global _GROUP
    _GROUP = group


def current() -> LiveGroup | None:
    return _GROUP
