"""A live rank's model, optimizer and loader, hooked into its group (internal).

The :class:`~dask_ddp.Checkpointer` a training function makes calls :func:`attach`
(see :mod:`dask_ddp._launch.live.group` for the group's protocol), which registers a DDP
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
  step; one at the agreed step all-reduces that step's saved gradients again in the new
  group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dask_ddp._launch.live.errors import LiveRecoveryError, is_peer_error
from dask_ddp._launch.live.group import LiveGroup, current
from dask_ddp.data.redeal import Redealable, redealable

logger = logging.getLogger(__name__)


class Attached:
    """The model, optimizer and loader of a live rank, and the current step's buckets."""

    def __init__(self, group: LiveGroup, ddp: Any, optimizer: Any, loader: Any,
                 scheduler: Any = None) -> None:
        self.group = group
        self.ddp = ddp
        self.optimizer = optimizer
        self.loader = loader
        #: The loader as live recovery's Loader (a dask-ddp Loader), or None: a loader of
        #: another kind (a torch DataLoader) is checkpointed but its samples not redealt.
        self.redeal: Redealable | None = redealable(loader)
        self.scheduler = scheduler
        self.failed: str | None = None
        self.skip_step = False
        self.queued = False
        #: This step's buckets: (index, local gradients, parameters), in hook order.
        self.saved: list[tuple[int, Any, list[Any]]] = []
        #: The last step's all-reduce carried rank 0's word: admit the waiting ranks at
        #: the next step's top (:meth:`boundary`).
        self.admit = False
        #: The first step after a join: the members' buckets (rebuilt by DDP after their
        #: first step) and the joiner's (its first step's) differ, so that step's
        #: gradients are all-reduced at once in parameter order (see ``_reduce_in_order``).
        self.in_order = False
        self._held: list[tuple[Any, list[Any], Any]] = []
        #: This step's all-reduces (their futures), and whether a bucket's local values
        #: must be copied before its all-reduce (DDP's gradient_as_bucket_view).
        self._works: list[Any] = []
        self.copy_local = bool(getattr(ddp, "gradient_as_bucket_view", True))
        #: The step the Checkpointer restored (the user's counter at committed step 0).
        self.base_step = 0
        #: A joined rank: the user's step to go on from (its Checkpointer's restore()).
        self.joined_step: int | None = None
        #: Each member's rank in the layout the loader reads the current epoch with (a
        #: joining rank's own shard is no part of it), and the next epochs' layout once
        #: the group changed (see ``_layout``).
        self.layout: dict[int, int] = {} if self.redeal is None or group.joining else {
            u: u for u in range(int(self.redeal.world_size))}
        self._next_layout: dict[int, int] | None = None
        #: The lost members' unread samples as rank 0 named them at the last regroup
        #: (epoch, samples), dealt once the regroup is done (see ``_deal_unread``).
        self._lost_deal: tuple[int, Any] | None = None
        #: This rank regroups from inside a step (a failed ``backward()``): the step's
        #: batch is taken and not counted. At a step's top (an admission) or after the
        #: loop (the finish barrier), every batch taken was counted.
        self.in_step = False

    def tensors(self) -> list[Any]:
        module = self.ddp.module
        return [p.data for p in module.parameters()] + list(module.buffers())

    # -- the DDP hook ---------------------------------------------------------------------
    def hook(self, _state: Any, bucket: Any) -> Any:
        import torch
        import torch.distributed as dist

        buf = bucket.buffer()
        first = not self.queued
        if first:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_finalize)  # noqa: SLF001 (torch autograd's only way to run a callback at the end of backward())
        # The bucket's local gradients, for a redo of the step in a re-formed group: a
        # copy only where DDP reduces the parameters' own .grad in place (else .grad keeps
        # them until DDP's final callback, and a failed step takes them from there).
        self.saved.append((bucket.index(), buf.clone() if self.copy_local else None,
                           list(bucket.parameters())))
        if self.in_order and self.failed is None:
            held: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            self._held.append((buf, list(bucket.parameters()), held))
            return held
        if self.failed is not None:
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            fut.set_result(buf)
            return fut
        world = dist.get_world_size()
        # While the group can grow, the step's first bucket carries one element more:
        # rank 0's word that a rank waits to join (every member reads the same sum after
        # the same step, and agrees on whether the group can grow).
        worded = first and self.group.can_grow
        sent = buf
        if worded:
            word = 1.0 if self.group.rank == 0 and self.group.join_wanted() else 0.0
            sent = torch.cat([buf, buf.new_full((1,), word)])
        try:
            work = dist.all_reduce(sent, async_op=True)
        except Exception as exc:
            self.failed = f"{type(exc).__name__}: {exc}"
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(buf)
            return done

        def finish(fut: Any) -> Any:
            try:
                out = fut.value()[0]
                if not worded:
                    return out.div_(world)
                self.admit = bool(out[-1].item() > 0.5)
                return out[:-1].div_(world)  # DDP copies it into .grad; buf stays local
            except Exception as exc:  # a peer is gone: the step ends at end_of_backward
                if self.failed is None:
                    self.failed = f"{type(exc).__name__}: {str(exc)[:300]}"
                return buf

        chained = work.get_future().then(finish)
        self._works.append(chained)
        return chained

    def _after_finalize(self) -> None:
        # DDP queues its own final callback (waiting for the buckets' futures and copying
        # them into .grad) when the last bucket is ready, after this one: queued from here,
        # end_of_backward runs after it.
        import torch

        if self._held:
            self._reduce_in_order()
        works, self._works = self._works, []
        if not self.copy_local:
            for fut in works:  # what DDP's final callback waits for next, anyway
                fut.wait()
            if self.failed is not None:
                self._keep_local()
        torch.autograd.Variable._execution_engine.queue_callback(self.end_of_backward)  # noqa: SLF001 (torch autograd's only way to run a callback at the end of backward())

    def _keep_local(self) -> None:
        """A failed step: each bucket's local gradients, from the parameters' .grad (DDP
        has not copied the buckets' results there yet), for the redo."""
        import torch

        kept = []
        for index, local, params in self.saved:
            if local is None:
                local = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                                   .reshape(-1) for p in params])
            kept.append((index, local, params))
        self.saved = kept

    def _reduce_in_order(self) -> None:
        """The first step after a join: every bucket's gradients all-reduced as one
        tensor in the model's parameter order (the ranks' buckets differ for this one
        step; DDP rebuilds them alike, from rank 0's order, at the next step)."""
        import torch
        import torch.distributed as dist

        held, self._held = self._held, []
        self.in_order = False
        order = {id(p): i for i, p in enumerate(self.ddp.module.parameters())}
        parts = []
        for buf, params, _ in held:
            offset = 0
            for p in params:
                parts.append((order[id(p)], buf, offset, p.numel()))
                offset += p.numel()
        parts.sort(key=lambda part: part[0])
        flat = torch.cat([buf[o:o + n] for _, buf, o, n in parts])
        try:
            dist.all_reduce(flat)
            flat.div_(dist.get_world_size())
            at = 0
            for _, buf, o, n in parts:
                buf[o:o + n].copy_(flat[at:at + n])
                at += n
        except Exception as exc:  # the buckets keep their local values: end_of_backward
            self.failed = f"{type(exc).__name__}: {str(exc)[:300]}"
        for buf, _, fut in held:
            fut.set_result(buf)

    def end_of_backward(self) -> None:
        """After DDP copied the buckets into the gradients: a failed step re-forms the
        group and completes the step there."""
        self.queued = False
        saved, self.saved = self.saved, []
        if self.failed is None:
            return
        cause, self.failed = self.failed, None
        self.admit = False  # a failed step admits nobody: the regroup decides
        group = self.group
        while True:
            mine = group.committed
            self.in_step = True
            try:
                agreed = group.regroup(cause)
            finally:
                self.in_step = False
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
                if not is_peer_error(exc):
                    raise
                cause = f"{type(exc).__name__}: {str(exc)[:300]}"

    def _lost_samples(self, lost: list[int]) -> tuple[int, Any] | None:
        """Rank 0: the ``lost`` members' unread samples of the epoch, (epoch, samples).
        The group's state counts the batches rank 0 (the most advanced) had taken, less
        the one of a step being completed when it regroups from inside that step (a
        failed ``backward()``); at a step's top (an admission that lost a member who left
        at that boundary) or after its loop, it counts every one. Named by rank 0 alone
        and handed to every member: a member that joined this epoch counts its batches
        otherwise."""
        loader, group = self.redeal, self.group
        if loader is None or not lost:
            return None
        epoch, taken = group.data_position
        batch = max(taken - 1, 0) if self.in_step else taken
        layout = self._layout()
        try:
            # Their own shards by their ranks in the epoch's layout, the samples dealt
            # to them this epoch by their ids.
            return epoch, loader.lost_samples(epoch, batch,
                                              [layout[u] for u in lost if u in layout],
                                              uids=lost)
        except (NotImplementedError, AttributeError, TypeError) as exc:
            logger.warning("live recovery: the unread samples of lost ranks %s are not "
                           "read this epoch: %s", lost, exc)
            return None

    def _deal_unread(self) -> None:
        """The lost members' unread samples of the epoch go to the survivors, after their
        own, dealt over the group's members (by id, so that a member lost later has its
        share dealt again)."""
        deal, self._lost_deal = self._lost_deal, None
        if deal is None or self.redeal is None:
            return
        epoch, samples = deal
        group = self.group
        try:
            self.redeal.deal_unread(epoch, samples, group.rank, len(group.members),
                                    members=list(group.members))
        except (NotImplementedError, AttributeError, TypeError) as exc:
            logger.warning("live recovery: the unread samples of lost ranks %s are not "
                           "read this epoch: %s", group.lost, exc)

    def _reduce_again(self, saved: list[tuple[int, Any, list[Any]]]) -> None:
        """All-reduce this step's local gradients in the new group, into ``.grad``."""
        import torch
        import torch.distributed as dist

        world = dist.get_world_size()
        worded = self.group.can_grow
        for i, (_, saved_local, params) in enumerate(saved):
            # A copy (kept intact for a redo broken by another loss); the first bucket
            # with the element the others' next step carries (rank 0's join word).
            local = torch.cat([saved_local, saved_local.new_zeros(1)]) if i == 0 and worded \
                else saved_local.clone()
            dist.all_reduce(local)
            if i == 0 and worded:
                self.admit = bool(local[-1].item() > 0.5)
                local = local[:-1]
            local.div_(world)
            offset = 0
            with torch.no_grad():
                for p in params:
                    n = p.numel()
                    if p.grad is not None:
                        p.grad.copy_(local[offset:offset + n].view_as(p.grad))
                    offset += n

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
        if self.admit:
            self.admit = False
            self._admit()

    def forward_boundary(self, *_: Any) -> None:
        import torch

        if self.loader is None and torch.is_grad_enabled():
            self.boundary()

    def _admit(self) -> None:
        """The group re-forms with the waiting ranks (a loss meanwhile: without them)."""
        group = self.group
        mine = group.committed
        agreed = group.regroup("a rank joined", admit=True)
        self._deal_unread()
        if agreed != mine:
            raise LiveRecoveryError(
                f"rank {group.uid} at step {mine} cannot continue from step {agreed}")

    # -- the state a regroup or a join hands on ------------------------------------------
    def can_redeal(self) -> bool:
        """Rank 0: whether the epoch's unread samples can be dealt again over a bigger
        group now (the loader names every member's unread samples, its own shard's and
        those dealt to it, and can stop reading them)."""
        return self.loader is None or self.redeal is not None

    def _layout(self) -> dict[int, int]:
        """Each member's rank in the layout its loader reads the current epoch with."""
        if (self._next_layout is not None and self.redeal is not None
                and not self.redeal.layout_pending):
            self.layout, self._next_layout = self._next_layout, None  # the loader took it
        return self.layout

    def _relayout(self, rank: int, world: int) -> None:
        """After a regroup: the loader reads the next epochs as rank ``rank`` of the new
        group (each member's shard), not with the layout of the job's start."""
        loader = self.redeal
        if loader is None:
            return
        self._layout()
        try:
            loader.reshard(rank, world)
        except NotImplementedError:
            return
        self._next_layout = {u: r for r, u in enumerate(self.group.members)}

    def shared_state(self, joined: list[int], lost: list[int]) -> dict[str, Any]:
        """Rank 0: what every member takes besides the tensors (pickled over the group):
        with ``joined`` ranks the epoch's unread samples, with ``lost`` ones theirs."""
        import torch

        state: dict[str, Any] = {
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "rng": torch.get_rng_state(), "deal": None, "lost_deal": None}
        loader = self.redeal
        if joined and loader is not None:
            layout = self._layout()
            old = [u for u in self.group.members if u not in joined]
            epoch, batch = self.group.data_position  # the batches read of the epoch
            state["deal"] = (epoch, loader.lost_samples(
                epoch, batch, [layout[u] for u in old if u in layout], uids=old))
        elif lost:
            state["lost_deal"] = self._lost_samples(lost)
        return state

    def take_shared_state(self, state: dict[str, Any], rank: int, world: int, *,
                          joined: bool, joining: bool) -> None:
        import torch

        if rank != 0:
            if self.optimizer is not None and state["optimizer"] is not None:
                self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None and state["scheduler"] is not None:
                self.scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"])
        self._lost_deal = state["lost_deal"]
        if joined:
            self._after_join(state["deal"], rank, world, joining)
        self._relayout(rank, world)

    def _after_join(self, deal: tuple[int, list[int]] | None, rank: int, world: int,
                    joining: bool) -> None:
        """Every member and the joiner: the next step's gradients go in parameter order
        and DDP rebuilds its buckets alike; the epoch's unread samples are dealt again."""
        import torch.distributed as dist

        self.in_order = True
        self.ddp._update_process_group(dist.group.WORLD)  # noqa: SLF001 (DDP's only way to take a reconfigured group in place)
        loader = self.redeal
        if deal is None or loader is None:
            return
        epoch, positions = deal
        if joining:  # its own shard (a group of one's: the whole epoch) is not read
            loader.load_state_dict({**loader.state_dict(), "epoch": epoch,
                                    "batch": len(loader)})
        else:
            loader.end_reads()
        loader.deal_unread(epoch, positions, rank, world, members=list(self.group.members))

    def wrap_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
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
    model.register_comm_hook(None, lambda state, bucket: att.hook(state, bucket))
    model.register_forward_pre_hook(att.forward_boundary)
    if att.redeal is not None:
        att.redeal.before_batch = att.boundary
    if optimizer is not None:
        optimizer.step = att.wrap_step(optimizer.step)
    group.attached = att
    if group.joining:
        group.join()
    return att
