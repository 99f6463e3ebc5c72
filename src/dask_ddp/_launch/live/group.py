"""Live recovery inside a rank process: the group re-forms without a lost rank (internal).

A job submitted with ``recovery="live"`` keeps its surviving rank processes when a rank
is lost. The default process group is made with ``enable_reconfigure=True`` on a store
that no rank hosts (the scheduler's, :mod:`~dask_ddp._launch.live.store`), so that
``torch.distributed._reconfigure`` can give the same group object (the one the user's
``DistributedDataParallel`` holds) a new set of peers, generation after generation.

How the library regains control without a change to the user's loop: the
:class:`~dask_ddp.Checkpointer` a training function makes calls
:func:`~dask_ddp._launch.live.attach.attach`, which hooks the DDP model, optimizer and
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
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import json
import logging
import os
import time
from datetime import timedelta
from typing import Any

from dask_ddp._launch.live.errors import LiveRecoveryError, MemberLost, is_peer_error
from dask_ddp._launch.live.keys import (
    ADMITTED_KEY,
    DEAD_KEY,
    DONE_KEY,
    GEN_KEY,
    GENERATION_ENV,
    JOIN_COUNT,
    JOIN_KEY,
    LEFT_KEY,
    PG_PREFIX,
    member_key,
)
from dask_ddp._launch.live.records import Admission, Generation

logger = logging.getLogger(__name__)

#: The exit code of a rank process that left its live group.
LEAVE_EXIT = 75
#: How often a survivor reads the store while the generation is being accounted for.
POLL_S = 0.005
#: The communicator ids of the one-rank groups a rank leaves a broken generation with.
_SOLO_UUID = 1 << 40
#: Join requests read per look, at most (the store is shared with the job's ranks).
MAX_JOINS = 1000
#: How often rank 0 looks for a waiting joiner (one store read, no collective).
JOIN_CHECK_S = 0.25


class MemberState(enum.Enum):
    """Where this rank stands in its live group (one name for it in every module)."""

    MEMBER = "member"  # in the group, stepping with it
    JOINING = "joining"  # started while the group runs; a group of itself until admitted
    LEAVING = "leaving"  # asked to leave (SIGTERM): at the next step boundary
    LEFT = "left"  # recorded gone; the process ends

    @property
    def is_terminal(self) -> bool:
        return self is MemberState.LEFT


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
        ``"gloo"`` (``"nccl"``: the same protocol with the communicator aborted and
        re-made by the backend's reconfigure).
    timeout
        Seconds a regroup may take before it gives up (:class:`LiveRecoveryError`).
    min_size
        The fewest members the group may shrink to.
    max_size
        The most members it may grow to (ranks that join); ``None``: no joins.
    """

    def __init__(self, store: Any, uid: int, world_size: int, *, backend: str = "gloo",
                 timeout: float = 60.0, min_size: int = 1,
                 max_size: int | None = None) -> None:
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
        self.attached: Any = None
        #: Rank 0's loader (epoch, batches yielded) at the last regroup.
        self.data_position = (0, 0)
        #: The members the last regroup lost.
        self.lost: list[int] = []
        self.max_size = max_size
        #: Where this rank stands in the group (joining, leaving; see :class:`MemberState`).
        self.state = MemberState.MEMBER
        #: Join requests this rank saw handled (admitted or dead), by their number.
        self._joins_done: set[int] = set()
        self._next_join_check = 0.0

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
        """Make the default process group (reconfigurable) with the first members."""
        import torch.distributed as dist
        from torch.distributed import PrefixStore

        dist.init_process_group(self.backend, store=PrefixStore(PG_PREFIX, self.store),
                                rank=self.rank, world_size=len(self.members),
                                timeout=timedelta(seconds=self.timeout),
                                enable_reconfigure=True)
        if not dist._supports_reconfigure():  # noqa: SLF001 (torch's in-place reconfigure has no public name)
            raise LiveRecoveryError(
                f"recovery='live' needs a backend that can reconfigure its group in place; "
                f"{self.backend!r} in torch {_torch_version()} cannot (use gloo, or "
                "recovery='restart')")
        self._reconfigure()
        os.environ[GENERATION_ENV] = "0"

    def _reconfigure(self) -> None:
        """Give the default group this generation's members (a collective over them)."""
        import torch.distributed as dist

        g = self.generation
        self.store.set(member_key(g, "handle", self.uid), dist._get_reconfigure_handle())  # noqa: SLF001 (torch's in-place reconfigure has no public name)
        keys = [member_key(g, "handle", u) for u in self.members]
        self._wait_keys(keys, f"generation {g}'s members to be ready")
        handles = [self.store.get(k).decode() for k in keys]
        dist._reconfigure(uuid=g + 1, handles=handles,  # noqa: SLF001 (torch's in-place reconfigure has no public name)
                          timeout=timedelta(seconds=self.timeout)).wait()
        os.environ["RANK"] = str(self.rank)
        os.environ["WORLD_SIZE"] = str(len(self.members))

    def _wait_keys(self, keys: list[str], what: str) -> None:
        """Wait until every key is set; a member found dead meanwhile raises (the caller
        starts the next generation)."""
        deadline = time.monotonic() + self.timeout
        while not self.store.check(keys):
            dead = [u for u in self.members if self.store.check([DEAD_KEY.format(uid=u)])]
            if dead:
                raise MemberLost(dead)
            if time.monotonic() > deadline:
                raise LiveRecoveryError(f"waited {self.timeout:g} s for {what}")
            time.sleep(POLL_S)

    def _account(self) -> dict[int, int]:
        """Wait until every member of this generation has reported or is dead; their
        committed steps by uid."""
        deadline = time.monotonic() + self.timeout
        g = self.generation
        while True:
            reports: dict[int, int] = {}
            pending = []
            for u in self.members:
                key = member_key(g, "report", u)
                if self.store.check([key]):
                    reports[u] = int(self.store.get(key))
                elif not self.store.check([DEAD_KEY.format(uid=u)]):
                    pending.append(u)
            if not pending:
                return reports
            if time.monotonic() > deadline:
                raise LiveRecoveryError(
                    f"generation {g}: members {pending} neither reported nor died within "
                    f"{self.timeout:g} s (frozen? the stall rule ends a frozen rank)")
            time.sleep(POLL_S)

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
            self._leave()
        for _ in range(len(old) + 2):  # each round loses at least one member
            g = self.generation
            self.store.set(member_key(g, "report", self.uid), str(self.committed))
            reports = self._account()
            proposal = sorted(reports, key=lambda u: (-reports[u], self.members.index(u)))
            if admit and len(reports) == len(self.members) and len(set(reports.values())) == 1:
                room = (self.max_size or len(proposal)) - len(proposal)
                proposal += self._waiting_joiners(room)
            decided = json.loads(self.store.compare_set(
                member_key(g, "members", 0), "", json.dumps(proposal)))
            if self.uid not in decided:
                raise LiveRecoveryError(f"generation {g + 1} was formed without this rank")
            if len(decided) < self.min_size:
                raise LiveRecoveryError(
                    f"{len(decided)} ranks survived, fewer than min_workers={self.min_size}")
            joined = [int(u) for u in decided if u not in self.members]
            for u in joined:  # every member writes it: one of them survives to
                self.store.set(ADMITTED_KEY.format(uid=u), Admission(
                    generation=g + 1, changes=self.changes + 1).to_json())
            self.members = [int(u) for u in decided]
            self.generation = g + 1
            try:
                self._reconfigure()
                step = self._sync_state(joined, [u for u in old if u not in self.members])
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
            self.store.set(member_key(g, "finished", self.uid), "1")
            deadline = time.monotonic() + wait
            while True:
                # A member lost after its last step is done: every step counted it.
                if all(self.store.check([member_key(g, "finished", u)])
                       or self.store.check([DEAD_KEY.format(uid=u)]) for u in members):
                    self.store.set(DONE_KEY, "1")  # a rank waiting to join leaves
                    return
                if any(self.store.check([member_key(g, "report", u)]) for u in members
                       if u != self.uid):
                    self.regroup("a peer failed after this rank returned")
                    break
                if time.monotonic() > deadline:
                    raise LiveRecoveryError(
                        f"the group's other ranks did not return within {wait:g} s")
                time.sleep(10 * POLL_S)

    # -- growing back ------------------------------------------------------------------
    def start_joining(self) -> None:
        """A rank started while the group runs: the default group is this rank alone
        (reconfigurable) until :meth:`join` (its Checkpointer) takes it into the group,
        so the user's DDP constructor, whose collectives the running members would not
        mirror, runs in a group of one."""
        import torch.distributed as dist
        from torch.distributed import PrefixStore

        self.members = [self.uid]
        self.generation = -1
        self.state = MemberState.JOINING
        dist.init_process_group(self.backend,
                                store=PrefixStore(PG_PREFIX, self.store),
                                rank=0, world_size=1, timeout=timedelta(seconds=self.timeout),
                                enable_reconfigure=True)
        self._leave()  # a reconfigurable group has no communicator until reconfigured

    def join(self) -> None:
        """Ask to join, wait until a step boundary admits this rank, then take the
        group's state from its rank 0 (a rank the group never admits, because the job
        ended first, leaves quietly)."""
        n = int(self.store.add(JOIN_COUNT, 1))
        self.store.set(JOIN_KEY.format(n=n), str(self.uid))
        wait = max(600.0, 10 * self.timeout)
        deadline = time.monotonic() + wait
        key = ADMITTED_KEY.format(uid=self.uid)
        while not self.store.check([key]):
            if self.store.check([DONE_KEY]):
                self._quit("the group finished before a step boundary admitted this rank")
            if self.leaving:  # its worker is closing
                self._quit("it was asked to leave before a step boundary admitted it")
            if time.monotonic() > deadline:
                self._quit(f"no step boundary admitted this rank within {wait:g} s")
            time.sleep(10 * POLL_S)
        admitted = Admission.from_json(self.store.get(key))
        g, self.changes = admitted.generation, admitted.changes
        decided = json.loads(self.store.get(member_key(g - 1, "members", 0)))
        self.members = [int(u) for u in decided]
        self.generation = g
        self.state = MemberState.MEMBER
        try:
            self._reconfigure()
            self.committed = self._sync_state([self.uid], [])
        except Exception as exc:  # a member lost while this rank joined: it leaves
            if not (isinstance(exc, MemberLost) or is_peer_error(exc)):
                raise
            self._quit(f"the group broke while this rank joined it ({exc})")
        os.environ[GENERATION_ENV] = str(self.changes)
        if self.attached is not None:  # the user's step counter, for its restore()
            self.attached.joined_step = self.attached.base_step + self.committed
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
        if not self.can_grow:
            return False
        now = time.monotonic()
        if now < self._next_join_check:
            return False
        self._next_join_check = now + JOIN_CHECK_S
        att = self.attached
        return bool(self._waiting_joiners(1)) and (att is None or att.can_redeal())

    def _waiting_joiners(self, limit: int) -> list[int]:
        """Up to ``limit`` ranks waiting to join (neither admitted nor dead), oldest first."""
        out: list[int] = []
        count = min(int(self.store.add(JOIN_COUNT, 0)), MAX_JOINS)
        for n in range(1, count + 1):
            if len(out) >= limit:
                break
            key = JOIN_KEY.format(n=n)
            if n in self._joins_done or not self.store.check([key]):
                continue
            uid = int(self.store.get(key))
            if uid in self.members or self.store.check(
                    [ADMITTED_KEY.format(uid=uid)]) or self.store.check(
                    [DEAD_KEY.format(uid=uid)]):
                self._joins_done.add(n)
                continue
            out.append(uid)
        return out

    def _quit(self, why: str) -> None:
        """A joining rank that cannot join ends its process (not a failure of the job)."""
        import sys

        mark_dead(self.store, self.uid)
        self.state = MemberState.LEFT
        logger.warning("rank %d leaves without joining: %s", self.uid, why)
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()  # noqa: SLF001 (the exit handlers must run before os._exit, which skips them)
        os._exit(LEAVE_EXIT)

    def request_leave(self) -> None:
        """Leave the group at the next step boundary (a signal handler calls this)."""
        self.state = MemberState.LEAVING

    def leave_now(self) -> None:
        """At a step boundary: record this rank as gone and end the process. The others'
        next all-reduce fails at once; they complete that step without this rank, whose
        steps so far all counted, and read its unread samples.

        Recorded first (the others then account for it without waiting), its connections
        dropped next (a peer already blocked on it wakes now, not once the exit handlers
        ran, which takes seconds on a loaded host)."""
        import sys

        self.store.set(LEFT_KEY.format(uid=self.uid), str(self.committed))
        mark_dead(self.store, self.uid)
        self.state = MemberState.LEFT
        with contextlib.suppress(Exception):  # it exits either way
            self._leave()
        logger.warning("rank %d leaves the group after step %d", self.uid, self.committed)
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()  # noqa: SLF001 (the exit handlers must run before os._exit, which skips them)
        os._exit(LEAVE_EXIT)

    def _leave(self) -> None:
        """Drop this rank's connections of the broken generation at once: a survivor
        blocked in a collective on this (live) rank wakes with an error now instead of at
        the group's timeout (a group of this rank alone replaces the communicator)."""
        import torch.distributed as dist

        dist._reconfigure(uuid=_SOLO_UUID + self.generation * 100_000 + self.uid,  # noqa: SLF001 (torch's in-place reconfigure has no public name)
                          handles=[dist._get_reconfigure_handle()],  # noqa: SLF001 (torch's in-place reconfigure has no public name)
                          timeout=timedelta(seconds=self.timeout)).wait()

    def _record(self, cause: str, old: list[int], step: int, took: float) -> None:
        gone = [u for u in old if u not in self.members]
        if gone and all(self.store.check([LEFT_KEY.format(uid=u)]) for u in gone):
            cause = "left at a step boundary (its worker is closing)"
        rec = Generation(generation=self.changes, time=time.time(), cause=cause,
                         lost=tuple(u for u in old if u not in self.members),
                         joined=tuple(u for u in self.members if u not in old),
                         world_size=len(self.members), step=step, recovery_s=took)
        self.store.compare_set(GEN_KEY.format(g=self.generation), "", rec.to_json())
        if self.rank != 0:
            return
        logger.warning("live recovery: generation %d of %d ranks (lost %s, joined %s) from "
                       "step %d in %.3f s", rec.generation, len(self.members),
                       list(rec.lost), list(rec.joined), step, took)

    def _sync_state(self, joined: list[int], lost: list[int]) -> int:
        """Rank 0's (the most advanced) committed step, parameters, buffers, optimizer
        and LR scheduler state and torch's CPU generator, on every member; with
        ``joined`` ranks, the epoch's unread samples dealt again over the new group; with
        ``lost`` ones, theirs named for the survivors."""
        import torch
        import torch.distributed as dist

        att = self.attached
        loader = att.loader if att is not None else None
        epoch, batch = 0, 0
        if loader is not None:
            # The batches read of the epoch: the own shard's, then (a Loader's) those of
            # the samples dealt to it, counted on (what a member lost now had not read).
            epoch = int(loader.epoch)
            batch = int(att.redeal.epoch_progress if att is not None and att.redeal is not None
                        else loader.state_dict()["batch"])
        base = att.base_step if att is not None else 0
        agreed_t = torch.tensor([self.committed, epoch, batch, base], dtype=torch.int64)
        dist.broadcast(agreed_t, 0)
        agreed, self.data_position = int(agreed_t[0]), (int(agreed_t[1]), int(agreed_t[2]))
        if att is not None:
            att.base_step = int(agreed_t[3])
            with torch.no_grad():
                for t in att.tensors():
                    dist.broadcast(t, 0)
            box: list[Any] = [att.shared_state(joined, lost) if self.rank == 0 else None]
            dist.broadcast_object_list(box, 0)
            att.take_shared_state(box[0], self.rank, len(self.members), joined=bool(joined),
                                  joining=self.uid in joined)
        return agreed


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


# -- this rank's objects ------------------------------------------------------------------
_GROUP: LiveGroup | None = None


def install(group: LiveGroup) -> None:
    """Make ``group`` the one :func:`attach` hooks into (the rank process, live mode)."""
    global _GROUP
    _GROUP = group


def current() -> LiveGroup | None:
    return _GROUP


def mark_dead(store: Any, uid: int) -> None:
    """Record member ``uid`` as lost (its supervisor or the scheduler; never raises)."""
    with contextlib.suppress(Exception):
        store.set(DEAD_KEY.format(uid=uid), "1")
