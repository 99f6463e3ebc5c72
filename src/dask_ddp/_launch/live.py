"""Live recovery inside a rank process: the group re-forms without a lost rank (internal).

A job submitted with ``recovery="live"`` keeps its surviving rank processes when a rank
is lost. The default process group is made with ``enable_reconfigure=True`` on a store
that no rank hosts (the scheduler's, :mod:`~dask_ddp._launch.live_store`), so that
``torch.distributed._reconfigure`` can give the same group object (the one the user's
``DistributedDataParallel`` holds) a new set of peers, generation after generation.

How the library regains control without a change to the user's loop: the
:class:`~dask_ddp.Checkpointer` a training function makes calls :func:`attach`, which
registers a DDP communication hook and wraps ``optimizer.step``:

- the hook all-reduces each gradient bucket as DDP's default does, keeping a copy of the
  bucket's local gradients until the step's end; a failed all-reduce is caught (the
  bucket keeps its local values, so ``backward()`` does not raise) and marks the step
  failed;
- at the end of ``backward()`` (an autograd final callback), a failed step re-forms the
  group (:meth:`LiveGroup.regroup`): every survivor reports its committed step (the
  optimizer steps it applied) on the store, waits until each member of the generation
  has reported or is known dead, and the first complete proposal (``compare_set``) fixes
  the members, the most advanced survivor first; the group is reconfigured, and rank 0
  broadcasts its parameters, buffers, optimizer state and step count;
- a survivor one step behind (its step failed where the most advanced one's completed)
  took the state after that step: its ``optimizer.step()`` for the failed step is
  skipped. A survivor at the agreed step (its next step failed) all-reduces the saved
  gradients of that step again in the new group, where the others join with their next
  step's buckets: every survivor's loop stays at the same iteration, with the same
  state.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

logger = logging.getLogger(__name__)

#: The store's key prefix of the process group itself (its reconfigure rendezvous).
PG_PREFIX = "dask_ddp/live/pg"
#: A member's loss, set by its supervisor or the scheduler: ``dead/<uid>``.
DEAD_KEY = "dask_ddp/live/dead/{uid}"
#: A member that left at a step boundary (not lost): ``left/<uid>``, its last step.
LEFT_KEY = "dask_ddp/live/left/{uid}"
#: The exit code of a rank process that left its live group.
LEAVE_EXIT = 75
#: One generation's record, JSON (see :class:`Generation`): ``gen/<n>``.
GEN_KEY = "dask_ddp/live/gen/{n}"
GEN_COUNT = "dask_ddp/live/generations"
#: How often a survivor reads the store while the generation is being accounted for.
POLL_S = 0.005
#: The communicator ids of the one-rank groups a rank leaves a broken generation with.
_SOLO_UUID = 1 << 40


class LiveRecoveryError(RuntimeError):
    """The group could not re-form (too few survivors, no agreement in time): the job
    falls back to a whole-group restart."""


@dataclasses.dataclass(frozen=True)
class Generation:
    """One membership change of a live job.

    Attributes
    ----------
    generation : int
        1 for the first change; the group of the job's start is generation 0.
    time : float
        When the change was decided (Unix time).
    cause : str
    lost, joined : tuple of int
        The members (original ranks) that left or came.
    world_size : int
        The new group's size.
    step : int
        The committed step the new group continued from.
    recovery_s : float
        From the first survivor noticing the loss to the state agreed on rank 0.
    """

    generation: int
    time: float
    cause: str
    lost: tuple[int, ...]
    joined: tuple[int, ...]
    world_size: int
    step: int
    recovery_s: float

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Generation:
        """Checked: the store is shared with the job's ranks."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"a generation record must be a JSON object, got {text!r:.80}")
        return cls(generation=int(raw["generation"]), time=float(raw["time"]),
                   cause=str(raw["cause"])[:500], lost=tuple(int(x) for x in raw["lost"]),
                   joined=tuple(int(x) for x in raw["joined"]),
                   world_size=int(raw["world_size"]), step=int(raw["step"]),
                   recovery_s=float(raw["recovery_s"]))


def read_generations(store: Any, limit: int = 10_000) -> list[Generation]:
    """The generation records on ``store``, oldest first (bounded by ``limit``)."""
    n = min(int(store.add(GEN_COUNT, 0)), limit)
    out = []
    for i in range(1, n + 1):
        key = GEN_KEY.format(n=i)
        if store.check([key]):
            out.append(Generation.from_json(store.get(key)))
    return out


def _key(gen: int, what: str, uid: int) -> str:
    return f"dask_ddp/live/g{gen}/{what}/{uid}"


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
    """

    def __init__(self, store: Any, uid: int, world_size: int, *, backend: str = "gloo",
                 timeout: float = 60.0, min_size: int = 1) -> None:
        self.store = store
        self.uid = uid
        self.members: list[int] = list(range(world_size))
        self.generation = 0
        self.backend = backend
        self.timeout = timeout
        self.min_size = min_size
        #: Optimizer steps applied (the same on every member after each regroup).
        self.committed = 0
        self.attached: _Attached | None = None
        #: Rank 0's loader (epoch, batches yielded) at the last regroup.
        self.data_position = (0, 0)
        #: The members the last regroup lost.
        self.lost: list[int] = []
        #: Asked to leave (SIGTERM): at the next step boundary.
        self.leaving = False

    # -- the group ----------------------------------------------------------------------
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
        if not dist._supports_reconfigure():
            raise LiveRecoveryError(
                f"recovery='live' needs a backend that can reconfigure its group in place; "
                f"{self.backend!r} in torch {_torch_version()} cannot (use gloo, or "
                "recovery='restart')")
        self._reconfigure()

    def _reconfigure(self) -> None:
        """Give the default group this generation's members (a collective over them)."""
        import torch.distributed as dist

        g = self.generation
        self.store.set(_key(g, "handle", self.uid), dist._get_reconfigure_handle())
        keys = [_key(g, "handle", u) for u in self.members]
        self._wait_keys(keys, f"generation {g}'s members to be ready")
        handles = [self.store.get(k).decode() for k in keys]
        dist._reconfigure(uuid=g + 1, handles=handles,
                          timeout=timedelta(seconds=self.timeout)).wait()
        os.environ["RANK"] = str(self.rank)
        os.environ["WORLD_SIZE"] = str(len(self.members))
        os.environ["DASK_DDP_GENERATION"] = str(g)

    def _wait_keys(self, keys: list[str], what: str) -> None:
        """Wait until every key is set; a member found dead meanwhile raises (the caller
        starts the next generation)."""
        deadline = time.monotonic() + self.timeout
        while not self.store.check(keys):
            dead = [u for u in self.members if self.store.check([DEAD_KEY.format(uid=u)])]
            if dead:
                raise _MemberLost(dead)
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
                key = _key(g, "report", u)
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

    def regroup(self, cause: str) -> int:
        """Re-form the group without the lost members and agree on the state; returns
        the agreed committed step. Raises :class:`LiveRecoveryError`."""
        t0 = time.monotonic()
        old = list(self.members)
        self._leave()
        for _ in range(len(old) + 1):  # each round loses at least one member
            g = self.generation
            self.store.set(_key(g, "report", self.uid), str(self.committed))
            reports = self._account()
            proposal = sorted(reports, key=lambda u: (-reports[u], self.members.index(u)))
            decided = json.loads(self.store.compare_set(
                _key(g, "members", 0), "", json.dumps(proposal)))
            if self.uid not in decided:
                raise LiveRecoveryError(f"generation {g + 1} was formed without this rank")
            if len(decided) < self.min_size:
                raise LiveRecoveryError(
                    f"{len(decided)} ranks survived, fewer than min_workers={self.min_size}")
            self.members = [int(u) for u in decided]
            self.generation = g + 1
            try:
                self._reconfigure()
                step = self._sync_state()
            except _MemberLost:
                continue
            except Exception as exc:  # a collective of the new group broke: next round
                if not _is_peer_error(exc):
                    raise
                logger.warning("generation %d broke while forming (%s); again",
                               self.generation, exc)
                continue
            self.lost = [u for u in old if u not in self.members]
            if self.rank == 0:
                self._record(cause, old, step, time.monotonic() - t0)
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
            self.store.set(_key(g, "finished", self.uid), "1")
            deadline = time.monotonic() + wait
            while True:
                # A member lost after its last step is done: every step counted it.
                if all(self.store.check([_key(g, "finished", u)])
                       or self.store.check([DEAD_KEY.format(uid=u)]) for u in members):
                    return
                if any(self.store.check([_key(g, "report", u)]) for u in members
                       if u != self.uid):
                    self.regroup("a peer failed after this rank returned")
                    break
                if time.monotonic() > deadline:
                    raise LiveRecoveryError(
                        f"the group's other ranks did not return within {wait:g} s")
                time.sleep(10 * POLL_S)

    def request_leave(self) -> None:
        """Leave the group at the next step boundary (a signal handler calls this)."""
        self.leaving = True

    def leave_now(self) -> None:
        """At a step boundary: record this rank as gone and end the process. The others'
        next all-reduce fails at once; they complete that step without this rank, whose
        steps so far all counted, and read its unread samples."""
        import sys

        self.store.set(LEFT_KEY.format(uid=self.uid), str(self.committed))
        mark_dead(self.store, self.uid)
        logger.warning("rank %d leaves the group after step %d", self.uid, self.committed)
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(LEAVE_EXIT)

    def _leave(self) -> None:
        """Drop this rank's connections of the broken generation at once: a survivor
        blocked in a collective on this (live) rank wakes with an error now instead of at
        the group's timeout (a group of this rank alone replaces the communicator)."""
        import torch.distributed as dist

        dist._reconfigure(uuid=_SOLO_UUID + self.generation * 100_000 + self.uid,
                          handles=[dist._get_reconfigure_handle()],
                          timeout=timedelta(seconds=self.timeout)).wait()

    def _record(self, cause: str, old: list[int], step: int, took: float) -> None:
        gone = [u for u in old if u not in self.members]
        if gone and all(self.store.check([LEFT_KEY.format(uid=u)]) for u in gone):
            cause = "left at a step boundary (its worker is closing)"
        n = int(self.store.add(GEN_COUNT, 1))
        rec = Generation(generation=n, time=time.time(), cause=cause,
                         lost=tuple(u for u in old if u not in self.members),
                         joined=tuple(u for u in self.members if u not in old),
                         world_size=len(self.members), step=step, recovery_s=took)
        self.store.set(GEN_KEY.format(n=n), rec.to_json())
        logger.warning("live recovery: generation %d of %d ranks (lost %s) from step %d in "
                       "%.3f s", self.generation, len(self.members), list(rec.lost), step,
                       took)

    def _sync_state(self) -> int:
        """Rank 0's (the most advanced) committed step, parameters, buffers and optimizer
        state, on every member."""
        import torch
        import torch.distributed as dist

        att = self.attached
        loader = att.loader if att is not None else None
        epoch, batch = (int(loader.epoch), int(loader.state_dict()["batch"])) \
            if loader is not None else (0, 0)
        if loader is not None and getattr(loader, "reading_unread", False):
            # Its own shard is done, so is every member's: none of it is left to deal.
            batch = len(loader) + 1
        agreed_t = torch.tensor([self.committed, epoch, batch], dtype=torch.int64)
        dist.broadcast(agreed_t, 0)
        agreed, self.data_position = int(agreed_t[0]), (int(agreed_t[1]), int(agreed_t[2]))
        if att is not None:
            with torch.no_grad():
                for t in att.tensors():
                    dist.broadcast(t, 0)
            if att.optimizer is not None:
                box = [att.optimizer.state_dict() if self.rank == 0 else None]
                dist.broadcast_object_list(box, 0)
                if self.rank != 0:
                    att.optimizer.load_state_dict(box[0])
        return agreed


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


class _MemberLost(Exception):
    def __init__(self, uids: list[int]) -> None:
        super().__init__(f"members {uids} were lost")


def _is_peer_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(s in text for s in ("connection", "closed", "reset", "timed out", "timeout",
                                   "broken pipe", "peer", "gloo"))


# -- this rank's objects ------------------------------------------------------------------
_GROUP: LiveGroup | None = None


def install(group: LiveGroup) -> None:
    """Make ``group`` the one :func:`attach` hooks into (the rank process, live mode)."""
    global _GROUP
    _GROUP = group


def current() -> LiveGroup | None:
    return _GROUP


class _Attached:
    """The model, optimizer and loader of a live rank, and the current step's buckets."""

    def __init__(self, group: LiveGroup, ddp: Any, optimizer: Any, loader: Any) -> None:
        self.group = group
        self.ddp = ddp
        self.optimizer = optimizer
        self.loader = loader
        self.failed: str | None = None
        self.skip_step = False
        self.queued = False
        #: This step's buckets: (index, local gradients, parameters), in hook order.
        self.saved: list[tuple[int, Any, list[Any]]] = []

    def tensors(self) -> list[Any]:
        module = self.ddp.module
        return [p.data for p in module.parameters()] + list(module.buffers())

    # -- the DDP hook ---------------------------------------------------------------------
    def hook(self, _state: Any, bucket: Any) -> Any:
        import torch
        import torch.distributed as dist

        buf = bucket.buffer()
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_finalize)
        self.saved.append((bucket.index(), buf.clone(), list(bucket.parameters())))
        if self.failed is not None:
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            fut.set_result(buf)
            return fut
        world = dist.get_world_size()
        try:
            work = dist.all_reduce(buf, async_op=True)
        except Exception as exc:
            self.failed = f"{type(exc).__name__}: {exc}"
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(buf)
            return done

        def finish(fut: Any) -> Any:
            try:
                return fut.value()[0].div_(world)
            except Exception as exc:  # a peer is gone: the step ends at end_of_backward
                if self.failed is None:
                    self.failed = f"{type(exc).__name__}: {str(exc)[:300]}"
                return buf

        return work.get_future().then(finish)

    def _after_finalize(self) -> None:
        # DDP queues its own final callback (waiting for the buckets' futures and copying
        # them into .grad) when the last bucket is ready, after this one: queued from here,
        # end_of_backward runs after it.
        import torch

        torch.autograd.Variable._execution_engine.queue_callback(self.end_of_backward)

    def end_of_backward(self) -> None:
        """After DDP copied the buckets into the gradients: a failed step re-forms the
        group and completes the step there."""
        self.queued = False
        saved, self.saved = self.saved, []
        if self.failed is None:
            return
        cause, self.failed = self.failed, None
        group = self.group
        while True:
            mine = group.committed
            agreed = group.regroup(cause)
            self._deal_unread()
            if agreed == mine + 1:
                # The failed step completed on the most advanced survivor: its state is
                # the state after that step; this rank's optimizer.step() for it is skipped.
                group.committed = agreed
                self.skip_step = True
                return
            if agreed != mine:
                raise LiveRecoveryError(
                    f"rank {group.uid} at step {mine} cannot continue from step {agreed}")
            try:
                self._reduce_again(saved)
                return
            except Exception as exc:  # another member lost during the redo: again
                if not _is_peer_error(exc):
                    raise
                cause = f"{type(exc).__name__}: {str(exc)[:300]}"

    def _deal_unread(self) -> None:
        """The lost members' unread samples of the epoch go to the survivors, after their
        own: rank 0 (the most advanced) had yielded the batch of the step being completed,
        so the lost ones trained on one batch fewer."""
        loader, group = self.loader, self.group
        if loader is None or not group.lost or not hasattr(loader, "lost_samples"):
            return
        epoch, batch = group.data_position
        try:
            positions = loader.lost_samples(epoch, max(batch - 1, 0), group.lost)
            loader.deal_unread(epoch, positions, group.rank, len(group.members))
        except (NotImplementedError, AttributeError, TypeError) as exc:
            logger.warning("live recovery: the unread samples of lost ranks %s are not "
                           "read this epoch: %s", group.lost, exc)

    def _reduce_again(self, saved: list[tuple[int, Any, list[Any]]]) -> None:
        """All-reduce this step's local gradients in the new group, into ``.grad``."""
        import torch
        import torch.distributed as dist

        world = dist.get_world_size()
        for _, saved_local, params in saved:
            local = saved_local.clone()  # kept intact for a redo broken by another loss
            dist.all_reduce(local)
            local.div_(world)
            offset = 0
            with torch.no_grad():
                for p in params:
                    n = p.numel()
                    if p.grad is not None:
                        p.grad.copy_(local[offset:offset + n].view_as(p.grad))
                    offset += n

    def wrap_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def live_step(*args: Any, **kwargs: Any) -> Any:
            if self.skip_step:
                self.skip_step = False
                return None
            out = step(*args, **kwargs)
            self.group.committed += 1
            if self.group.leaving:
                self.group.leave_now()
            return out

        live_step.__wrapped__ = step  # type: ignore[attr-defined]
        return live_step


def attach(model: Any, optimizer: Any = None, scheduler: Any = None,
           loader: Any = None) -> None:
    """Hook a rank's DDP model and optimizer into its live group (a no-op outside a live
    job). Called by :class:`~dask_ddp.Checkpointer`."""
    del scheduler  # stepped by the user's loop; not part of a step's all-reduce
    group = _GROUP
    if group is None:
        return
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise TypeError("recovery='live' needs the Checkpointer's model to be a "
                        f"DistributedDataParallel, got {type(model).__name__}")
    if group.attached is not None:
        raise RuntimeError("recovery='live' supports one Checkpointer per rank")
    att = _Attached(group, model, optimizer, loader)
    # DDP checks a hook's annotations against its own types: a lambda has none.
    model.register_comm_hook(None, lambda state, bucket: att.hook(state, bucket))
    if optimizer is not None:
        optimizer.step = att.wrap_step(optimizer.step)
    group.attached = att


def mark_dead(store: Any, uid: int) -> None:
    """Record member ``uid`` as lost (its supervisor or the scheduler; never raises)."""
    with contextlib.suppress(Exception):
        store.set(DEAD_KEY.format(uid=uid), "1")
