"""What a regroup hands on: rank 0's state, on every member of the new group (internal).

Once a generation is formed, its rank 0 (the most advanced survivor) broadcasts its
committed step, the epoch's position, the user's step counter, its parameters and
buffers, and (pickled) its optimizer and LR scheduler state, torch's CPU generator and
the samples to deal (:func:`hand_on`).

Each goes on the device its group needs. The header (an int64 tensor) and the pickled
state go over the control group, gloo, from the CPU: the pickled state's tensors are
copied to the CPU first (a pickled CUDA tensor would be unpickled onto rank 0's device
index, another rank's GPU, and NCCL takes no CPU tensor); the optimizer's
``load_state_dict`` moves them to its parameters' device. The parameters and buffers go
over the gradients' group where they are (on the GPU with NCCL: no copy to the host and
back, at the GPUs' bandwidth, and the new communicator's first collective checks it
before the next step needs it). The group
(:class:`~dask_ddp._launch.rank.live.group.LiveGroup`) runs it; what it asks of the model,
optimizer and loader hooked into it is :class:`Participant`
(:class:`~dask_ddp._launch.rank.live.attach.Attached` is one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

if TYPE_CHECKING:
    import torch

    from dask_ddp.data.unread import Samples


class SharedState(TypedDict):
    """What every member takes from rank 0 besides the tensors (pickled over the group)."""

    optimizer: dict[str, Any] | None
    scheduler: dict[str, Any] | None
    rng: torch.Tensor
    #: With joined ranks: the epoch's unread samples, dealt again over the new group.
    deal: tuple[int, Samples] | None
    #: With lost ones: their unread samples of the epoch, for the survivors.
    lost_deal: tuple[int, Samples] | None


class Participant(Protocol):
    """The model, optimizer and loader hooked into a live group (see the module)."""

    #: The user's step counter at committed step 0 (the step its Checkpointer restored).
    base_step: int

    def position(self) -> tuple[int, int]:
        """The loader's (epoch, batches read of it); (0, 0) without a loader."""
        ...

    def tensors(self) -> list[torch.Tensor]:
        """The model's parameters and buffers, in an order every member shares."""
        ...

    def shared_state(self, joined: list[int], lost: list[int],
                     position: tuple[int, int]) -> SharedState:
        """Rank 0: what every member takes besides the tensors, at the group's
        ``position`` (epoch, batches read)."""
        ...

    def take_shared_state(self, state: SharedState, rank: int, world: int, *,
                          joined: bool, joining: bool) -> None:
        """Every member: take rank 0's state, as ``rank`` of ``world``."""
        ...

    def can_redeal(self) -> bool:
        """Rank 0: whether the epoch's unread samples can be dealt again now."""
        ...

    def joined(self, committed: int) -> None:
        """This rank joined the group at its committed step ``committed``."""
        ...

    def group_rebuilt(self) -> None:
        """The default group is a new object: DDP takes it before its next forward."""
        ...

    def drop_group(self) -> None:
        """The groups were dropped for a group of this rank alone: DDP takes it now."""
        ...


def hand_on(att: Participant | None, committed: int, rank: int, world: int, *,
            joined: list[int], lost: list[int], joining: bool,
            control: Any = None) -> tuple[int, tuple[int, int]]:
    """Rank 0's committed step and state on every member (a collective of the new group);
    the agreed step and the group's position in the epoch. With ``joined`` ranks
    (``joining``: this rank is one), the epoch's unread samples are dealt again over the
    new group; with ``lost`` ones, theirs are named for the survivors. ``control``: the
    gloo group of the header and the pickled state (``None``: the default group, gloo)."""
    import torch
    import torch.distributed as dist

    # The batches read of the epoch: the own shard's, then (a Loader's) those of the
    # samples dealt to it, counted on (what a member lost now had not read).
    epoch, batch = att.position() if att is not None else (0, 0)
    base = att.base_step if att is not None else 0
    agreed_t = torch.tensor([committed, epoch, batch, base], dtype=torch.int64)
    dist.broadcast(agreed_t, 0, group=control)
    agreed, position = int(agreed_t[0]), (int(agreed_t[1]), int(agreed_t[2]))
    if att is not None:
        att.base_step = int(agreed_t[3])
        with torch.no_grad():
            for t in att.tensors():
                dist.broadcast(t, 0)
        box: list[SharedState | None] = [
            on_cpu(att.shared_state(joined, lost, position)) if rank == 0 else None]
        dist.broadcast_object_list(box, 0, group=control)
        att.take_shared_state(cast("SharedState", box[0]), rank, world,  # rank 0's, on all
                              joined=bool(joined), joining=joining)
    return agreed, position


def on_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in its dicts, lists and tuples on the CPU (a CPU tensor
    is itself: no copy on a CPU-only rank)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if type(obj) is dict:
        return {k: on_cpu(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(on_cpu(v) for v in obj)
    return obj
