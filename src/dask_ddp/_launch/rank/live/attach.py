"""A live rank's model, optimizer and loader, hooked into its group (internal).

The :class:`~dask_ddp.Checkpointer` a training function makes calls :func:`attach`
(see :mod:`dask_ddp._launch.rank.live.group` for the group's protocol), which registers a DDP
communication hook, wraps ``optimizer.step`` and marks the top of each step:

- the hook all-reduces each gradient bucket as DDP's default does; a failed all-reduce
  is caught (``backward()`` does not raise) and marks the step failed, which re-forms
  the group at the end of ``backward()``; the step's local gradients are kept for a redo
  only when it failed (taken from the parameters' ``.grad`` before DDP copies the
  results there; a copy per bucket when DDP reduces ``.grad`` in place); while the group
  can grow, the step's first bucket carries one element more, rank 0's word that a
  rank waits to join;
- after a step that carried the word, the top of the next step (the registered loader's
  next batch, else the model's forward) re-forms the group with the joining ranks, which
  take the group's state there (their own ``attach`` waits until then);
- a survivor one step behind after a loss skips its ``optimizer.step()`` for the failed
  step and keeps what its loop reads after that call (the LR scheduler, the optimizer's
  hyperparameters), which the survivor it took the rest from had already stepped; one
  at the agreed step all-reduces that step's saved gradients again in the new group.

:class:`Attached` holds the rank's side of it together: the backward-hook machinery is
:class:`~dask_ddp._launch.rank.live.hooks.GradientHook`, the loader's deals at a regroup
:class:`~dask_ddp._launch.rank.live.deal.LoaderDeal`; to its group it is a
:class:`~dask_ddp._launch.rank.live.handoff.Participant`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dask_ddp._launch.rank.live.deal import LoaderDeal
from dask_ddp._launch.rank.live.errors import LiveRecoveryError, is_peer_error
from dask_ddp._launch.rank.live.group import LiveGroup, current
from dask_ddp._launch.rank.live.handoff import SharedState
from dask_ddp._launch.rank.live.hooks import GradientHook
from dask_ddp.data.loader import Loader

if TYPE_CHECKING:
    import torch


class Attached:
    """The model, optimizer and loader of a live rank (a :class:`~.handoff.Participant`
    of its group): the step boundaries, the regroup of a failed step, the optimizer's
    step counted, and the state a regroup hands on."""

    def __init__(self, group: LiveGroup, ddp: Any, optimizer: Any, loader: Any,
                 scheduler: Any = None) -> None:
        self.group = group
        self.ddp = ddp
        self.optimizer = optimizer
        self.loader = loader
        #: The loader as live recovery's Loader (every dask-ddp Loader is one, whatever its
        #: Source: picked by the class, never by probing attributes), or None: a loader of
        #: another kind (a torch DataLoader) is checkpointed but its samples not redealt.
        self.redeal: Loader | None = loader if isinstance(loader, Loader) else None
        self.scheduler = scheduler
        #: The DDP comm hook and the current step's buckets.
        self.grads = GradientHook(group, ddp, self.end_of_backward)
        #: The loader's deals at a regroup.
        self.deals = LoaderDeal(self.redeal, group.joining)
        self.skip_step = False
        #: The step the Checkpointer restored (the user's counter at committed step 0).
        self.base_step = 0
        #: A joined rank: the user's step to go on from (its Checkpointer's restore()).
        self.joined_step: int | None = None
        #: This rank regroups from inside a step (a failed ``backward()``): the step's
        #: batch is taken and not counted. At a step's top (an admission) or after the
        #: loop (the finish barrier), every batch taken was counted.
        self.in_step = False

    # -- a failed step -------------------------------------------------------------------
    def end_of_backward(self) -> None:
        """After DDP copied the buckets into the gradients: a failed step re-forms the
        group and completes the step there."""
        cause, saved = self.grads.end_step()
        if cause is None:
            return
        group = self.group
        while True:
            mine = group.committed
            own = self._after_step_state()
            self.in_step = True
            try:
                agreed = group.regroup(cause)
            finally:
                self.in_step = False
            self._deal_unread()
            if agreed == mine + 1:
                # The failed step completed on the most advanced survivor: its parameters
                # and optimizer state are the state after that step; this rank's
                # optimizer.step() for it is skipped. What the loop reads after the
                # optimizer's step is this rank's own (the group's at the step's start):
                # the survivor had already run that part of its loop (an LR scheduler's
                # step), which runs here next.
                self._take_after_step_state(own)
                group.committed = agreed
                self.skip_step = True
                return
            if agreed != mine:
                raise LiveRecoveryError(
                    f"rank {group.uid} at step {mine} cannot continue from step {agreed}")
            try:
                self.grads.reduce_again(saved)
                return
            except Exception as exc:  # another member lost during the redo: again
                if not is_peer_error(exc):
                    raise
                cause = f"{type(exc).__name__}: {str(exc)[:300]}"

    def _after_step_state(self) -> dict[str, Any]:
        """What the loop's code after ``optimizer.step()`` reads and the most advanced
        survivor's handoff brings already stepped: the LR scheduler's state and the
        optimizer's hyperparameters (a chainable scheduler scales the current ``lr``).

        Torch's generator is rank 0's, as every member's after a regroup: the survivor
        had drawn its next step's forward from it, so a forward that draws (dropout)
        draws on from there here."""
        import copy

        return {
            "scheduler": (copy.deepcopy(self.scheduler.state_dict())
                          if self.scheduler is not None else None),
            "hyper": ([copy.deepcopy({k: v for k, v in g.items() if k != "params"})
                       for g in self.optimizer.param_groups]
                      if self.optimizer is not None else None)}

    def _take_after_step_state(self, own: dict[str, Any]) -> None:
        if own["scheduler"] is not None:
            self.scheduler.load_state_dict(own["scheduler"])
        if own["hyper"] is not None:
            for g, hyper in zip(self.optimizer.param_groups, own["hyper"], strict=True):
                g.update(hyper)

    def wrap_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """``optimizer.step``, counted as the group's committed step (skipped once for a
        failed step the group completed without it)."""
        def live_step(*args: Any, **kwargs: Any) -> Any:
            if self.skip_step:
                self.skip_step = False
                return None
            out = step(*args, **kwargs)
            self.group.committed += 1
            return out

        live_step.__wrapped__ = step  # type: ignore[attr-defined]
        if getattr(step, "_wrapped_by_lr_sched", False):
            # An LR scheduler made before checks that its own wrapper is still there.
            live_step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]  # noqa: SLF001 (torch's LR scheduler checks its own mark on optimizer.step)
        return live_step

    # -- the top of a step -----------------------------------------------------------------
    def boundary(self) -> None:
        """The top of a training step (the registered loader's next batch; without one,
        the model's forward with gradients): after a step whose all-reduce carried rank
        0's join word, the group re-forms here with the waiting ranks, after what the
        loop did since the optimizer's step (an LR scheduler's step, a checkpoint): a
        joining rank, which runs the loop from its top, finds the state its loop expects.

        A rank asked to leave leaves here, not inside ``optimizer.step()``: its loop has
        finished the last step the group counts (what it does after the optimizer's step,
        a collective among them, ran with the others) and it has taken no batch of the
        next one, so its unread samples start right after that step."""
        if self.group.leaving:
            self.group.leave_now()
        if self.grads.admit:
            self.grads.admit = False
            self._admit()

    def forward_boundary(self, *_: Any) -> None:
        import torch

        if self.loader is None and torch.is_grad_enabled():
            self.boundary()
        if self.grads.stale_group:  # DDP's forward broadcasts buffers over its group
            self.grads.take_group()

    def _admit(self) -> None:
        """The group re-forms with the waiting ranks (a loss meanwhile: without them)."""
        group = self.group
        mine = group.committed
        agreed = group.regroup("a rank joined", admit=True)
        self._deal_unread()
        if agreed != mine:
            raise LiveRecoveryError(
                f"rank {group.uid} at step {mine} cannot continue from step {agreed}")

    def _deal_unread(self) -> None:
        group = self.group
        self.deals.deal_unread(group.rank, list(group.members), group.lost)

    # -- the state a regroup or a join hands on (the group's Participant) ---------------
    def position(self) -> tuple[int, int]:
        """The loader's (epoch, batches read of it): the own shard's, then (a Loader's)
        those of the samples dealt to it."""
        loader = self.loader
        if loader is None:
            return 0, 0
        epoch = int(loader.epoch)
        batch = int(self.redeal.epoch_progress if self.redeal is not None
                    else loader.state_dict()["batch"])
        return epoch, batch

    def tensors(self) -> list[torch.Tensor]:
        module = self.ddp.module
        return [p.data for p in module.parameters()] + list(module.buffers())

    def can_redeal(self) -> bool:
        """Rank 0: whether the epoch's unread samples can be dealt again over a bigger
        group now (the loader names every member's unread samples, its own shard's and
        those dealt to it, and can stop reading them)."""
        return self.loader is None or self.redeal is not None

    def joined(self, committed: int) -> None:
        """This rank joined at the group's ``committed`` step: its Checkpointer's
        ``restore()`` goes on from the user's step there."""
        self.joined_step = self.base_step + committed

    def group_rebuilt(self) -> None:
        """The default group is a new object: DDP takes it before its next forward (every
        member at the same step; a joiner's first step takes it with ``after_join``)."""
        self.grads.stale_group = True

    def drop_group(self) -> None:
        """The groups were dropped for a group of this rank alone: DDP takes it now (a
        regroup from inside ``backward()`` runs after DDP's final callback, and
        ``_update_process_group`` resets the reducer for a step that did not succeed), so
        that nothing holds the old group, which then closes its connections."""
        self.grads.take_group()

    def shared_state(self, joined: list[int], lost: list[int],
                     position: tuple[int, int]) -> SharedState:
        """Rank 0: what every member takes besides the tensors (pickled over the group):
        with ``joined`` ranks the epoch's unread samples, with ``lost`` ones theirs, at
        the group's ``position`` (epoch, batches read)."""
        import torch

        state: SharedState = {
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "rng": torch.get_rng_state(), "deal": None, "lost_deal": None}
        if joined and self.redeal is not None:
            old = [u for u in self.group.members if u not in joined]
            state["deal"] = self.deals.unread(old, position)
        elif lost:
            state["lost_deal"] = self.deals.lost_samples(lost, position, self.in_step)
        return state

    def take_shared_state(self, state: SharedState, rank: int, world: int, *,
                          joined: bool, joining: bool) -> None:
        import torch

        if rank != 0:
            if self.optimizer is not None and state["optimizer"] is not None:
                self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None and state["scheduler"] is not None:
                self.scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"])
        self.deals.hold(state["lost_deal"])
        members = list(self.group.members)
        if joined:
            # The next step's gradients go in parameter order and DDP rebuilds its
            # buckets alike; the epoch's unread samples are dealt again.
            self.grads.after_join()
            self.deals.after_join(state["deal"], rank, world, joining, members)
        self.deals.relayout(rank, world, members)


def attach(model: Any, optimizer: Any = None, scheduler: Any = None,
           loader: Any = None) -> Attached | None:
    """Hook a rank's DDP model and optimizer into its live group (a no-op outside a live
    job; returns the hook's state). Called by :class:`~dask_ddp.Checkpointer`; a rank
    that joins a running group is taken into it here (see :meth:`LiveGroup.join`)."""
    group = current()
    if group is None:
        return None
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise TypeError("recovery='live' needs the Checkpointer's model to be a "
                        f"DistributedDataParallel, got {type(model).__name__}")
    if group.attached is not None:
        raise RuntimeError("recovery='live' supports one Checkpointer per rank")
    att = Attached(group, model, optimizer, loader, scheduler)
    # DDP checks a hook's annotations against its own types: a lambda has none.
    model.register_comm_hook(None, lambda state, bucket: att.grads(state, bucket))
    model.register_forward_pre_hook(att.forward_boundary)
    if att.redeal is not None:
        att.redeal.before_batch = att.boundary
    if optimizer is not None:
        optimizer.step = att.wrap_step(optimizer.step)
    group.attached = att
    if group.joining:
        group.join()
    return att
