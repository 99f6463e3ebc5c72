"""A live rank's backward-hook machinery: each step's all-reduces, caught (internal).

:class:`GradientHook` is the DDP communication hook that
:func:`~dask_ddp._launch.rank.live.attach.attach` registers:

- it all-reduces each gradient bucket as DDP's default does; a failed all-reduce is
  caught (``backward()`` does not raise) and marks the step failed, which re-forms the
  group at the end of ``backward()`` (the callback it was made with); the step's local
  gradients are kept for a redo only when it failed (taken from the parameters'
  ``.grad`` before DDP copies the results there; a copy per bucket when DDP reduces
  ``.grad`` in place), and :meth:`GradientHook.reduce_again` all-reduces them in the new
  group;
- while the group can grow, the step's first bucket carries one element more, rank 0's
  word that a rank waits to join (:attr:`GradientHook.admit` after the step), read at the
  next step's top, not inside ``backward()``: a CUDA bucket's word is copied to pinned host
  memory without blocking and an event recorded after the copy (:class:`HostScalar`, as
  ``report()`` reads a CUDA metric), so the hook never makes the host wait for the GPU;
- the first step after a join all-reduces every bucket as one tensor in parameter order
  (:meth:`GradientHook.after_join`);
- a change that rebuilt the default group (:mod:`.comms`) gives DDP the new one before its
  next forward (:meth:`GradientHook.take_group`); the hook's own all-reduces always use
  the current default group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from dask_ddp._launch.rank.live.group import LiveGroup

#: A bucket of the step: (index, local gradients, parameters).
Bucket = tuple[int, Any, list[Any]]


class HostScalar:
    """A one-element tensor's value, read on the host without making it wait for the GPU.

    A CPU tensor's value is read at once. A CUDA tensor's is copied into pinned host
    memory without blocking, on the current stream (ordered after the tensor's producer:
    a future's callback runs on streams made to wait for its value's kernels), and an
    event is recorded on that stream after the copy; :meth:`value` waits for that event,
    the copy alone, before it reads the host copy, which this object keeps alive until
    then (torch's CUDA semantics: a non-blocking copy to pinned memory is complete once
    an event recorded after it on its stream has completed).

    Parameters
    ----------
    tensor
        A tensor of one element.
    """

    __slots__ = ("_event", "_host", "_value")

    def __init__(self, tensor: torch.Tensor) -> None:
        import torch

        self._value: float | None = None
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        if tensor.device.type != "cuda":
            self._value = float(tensor.item())
            return
        host = torch.empty((), dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor.detach().reshape(()), non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(tensor.device))
        self._host, self._event = host, event

    def value(self) -> float:
        """The tensor's value (waits for the copy, if it has not completed yet)."""
        if self._value is None:
            assert self._event is not None and self._host is not None
            self._event.synchronize()
            self._value = float(self._host.item())  # host memory the copy has filled
            self._host = self._event = None
        return self._value


class GradientHook:
    """The DDP comm hook of a live rank and the current step's buckets (see the module).

    Parameters
    ----------
    group
        The rank's live group (whether it can grow, rank 0's join word).
    ddp
        The user's ``DistributedDataParallel`` model.
    end_of_backward
        Called at the end of each ``backward()``, after DDP copied the buckets into the
        gradients (:meth:`end_step` then says whether the step failed).
    """

    def __init__(self, group: LiveGroup, ddp: Any, end_of_backward: Callable[[], None]) -> None:
        self.group = group
        self.ddp = ddp
        self._end_of_backward = end_of_backward
        self.failed: str | None = None
        self.queued = False
        #: This step's buckets: (index, local gradients, parameters), in hook order.
        self.saved: list[Bucket] = []
        #: Rank 0's word in the last step's all-reduce (see :attr:`admit`).
        self._word: HostScalar | float = 0.0
        #: The first step after a join: the members' buckets (rebuilt by DDP after their
        #: first step) and the joiner's (its first step's) differ, so that step's
        #: gradients are all-reduced at once in parameter order (see ``_reduce_in_order``).
        self.in_order = False
        self._held: list[tuple[Any, list[Any], Any]] = []
        #: This step's all-reduces (their futures), and whether a bucket's local values
        #: must be copied before its all-reduce (DDP's gradient_as_bucket_view).
        self._works: list[Any] = []
        self.copy_local = bool(getattr(ddp, "gradient_as_bucket_view", True))
        #: The default group was rebuilt by a change: DDP takes it before its next forward
        #: (:meth:`take_group`).
        self.stale_group = False

    def __call__(self, _state: Any, bucket: Any) -> Any:
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

        chained = work.get_future().then(
            lambda fut: self.reduced(fut, buf, world, worded))
        self._works.append(chained)
        return chained

    def reduced(self, fut: Any, buf: torch.Tensor, world: int, worded: bool) -> torch.Tensor:
        """A bucket's all-reduce ended (``fut``, a callback of its future): the mean of
        the bucket, or ``buf``'s local values when it failed. ``worded``: its last element
        is rank 0's word, kept to read at the next step's top."""
        try:
            out = fut.value()[0]
            if not worded:
                return out.div_(world)
            self._word = HostScalar(out[-1])  # no .item() here: a GPU sync every step
            return out[:-1].div_(world)  # DDP copies it into .grad; buf stays local
        except Exception as exc:  # a peer is gone: the step ends at end_of_backward
            if self.failed is None:
                self.failed = f"{type(exc).__name__}: {str(exc)[:300]}"
            return buf

    @property
    def admit(self) -> bool:
        """Whether the last step's all-reduce carried rank 0's word that the waiting ranks
        join: they are admitted at the next step's top (``Attached.boundary``), which
        reads it (a CUDA word's copy has long completed by then)."""
        word = self._word
        return (word if isinstance(word, float) else word.value()) > 0.5

    @admit.setter
    def admit(self, value: bool) -> None:
        self._word = 1.0 if value else 0.0

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
        torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)  # noqa: SLF001 (torch autograd's only way to run a callback at the end of backward())

    def end_step(self) -> tuple[str | None, list[Bucket]]:
        """At the end of ``backward()``: why the step failed (None: it did not) and its
        buckets, with their local gradients for a redo."""
        self.queued = False
        saved, self.saved = self.saved, []
        if self.failed is None:
            return None, saved
        cause, self.failed = self.failed, None
        self.admit = False  # a failed step admits nobody: the regroup decides
        return cause, saved

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

    def reduce_again(self, saved: list[Bucket]) -> None:
        """All-reduce a failed step's local gradients in the new group, into ``.grad``."""
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
                self._word = HostScalar(local[-1])
                local = local[:-1]
            local.div_(world)
            offset = 0
            with torch.no_grad():
                for p in params:
                    n = p.numel()
                    if p.grad is not None:
                        p.grad.copy_(local[offset:offset + n].view_as(p.grad))
                    offset += n

    def after_join(self) -> None:
        """Every member and the joiner: the next step's gradients go in parameter order,
        and DDP takes the reconfigured group (it rebuilds its buckets alike, from rank
        0's order, at the step after)."""
        self.in_order = True
        self.take_group()

    def take_group(self) -> None:
        """DDP takes the default group (a rebuilt one's new object, or a reconfigured
        one's new peers); every member does so at the same step, and DDP rebuilds its
        buckets alike, from rank 0's order, after the next step. Its reducer's state is
        reset: before a forward, or after DDP's final callback of a ``backward()`` that
        failed (what torch's reset is for: a forward after a backward that did not
        succeed)."""
        import torch.distributed as dist

        self.stale_group = False
        self.ddp._update_process_group(dist.group.WORLD)  # noqa: SLF001 (DDP's only way to take a new or reconfigured group)
