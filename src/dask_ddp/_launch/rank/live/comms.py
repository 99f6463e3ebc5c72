"""A live rank's process groups, and how they follow a change of members (internal).

A live group talks over two channels: the **gradients** group (torch's default group, the
one the user's ``DistributedDataParallel`` and its own collectives use, on the job's
backend) and the **control** group (gloo, CPU tensors: the state handoff's header and its
pickled Python state, see :mod:`.handoff`). The membership itself is decided on the job's
store, not over either group (:mod:`.generations`). Two ways to follow a change:

- :class:`InPlace`: one reconfigurable gloo group is both; torch's in-place reconfigure
  gives the same object new peers (:mod:`.reconfigure`), so DDP keeps its group.
- :class:`Rebuilt`: for a backend whose group cannot be reconfigured (torch's
  ``ProcessGroupNCCL`` refuses ``enable_reconfigure``): every generation gets new group
  objects over its members, a default group on the job's backend and a gloo control group
  beside it; the old ones are aborted first (``abort()``: no collective, which a group with
  a dead member could not complete), and DDP is given the new default group
  (:attr:`Comms.rebuilds`). A rank that leaves a broken generation takes a group of itself
  at once and gives it to DDP: an aborted gloo group closes its connections only once
  nothing holds it, and a peer blocked on this rank waits until then. With gloo as the
  backend it stands in for NCCL: the same code path on the CPU, at the cost of two group
  formations per change (about 15-25 ms for a few ranks on one host) instead of one
  reconfigure.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol

from dask_ddp._launch.rank.live import reconfigure
from dask_ddp._launch.rank.live.errors import LiveRecoveryError
from dask_ddp._launch.wire.live_keys import PG_PREFIX

#: Backends whose default group a live job reconfigures in place.
IN_PLACE_BACKENDS = ("gloo",)


class Comms(Protocol):
    """How a live rank's groups follow its group's generations (see the module)."""

    #: Whether a change gives the default group a new object (DDP must be told).
    rebuilds: bool

    @property
    def control(self) -> Any:
        """The gloo group of the control messages (``None``: the default group)."""
        ...

    def start(self, rank: int, world: int) -> None:
        """Make the groups of the first generation's ``world`` members (not formed yet:
        :meth:`form` forms them)."""
        ...

    def form(self, generation: int, handles: list[str], rank: int) -> None:
        """Form ``generation``'s groups over the members whose ``handles`` are given, in
        rank order (a collective over them)."""
        ...

    def handle(self) -> str:
        """This rank's handle, which the members of a generation exchange on the store."""
        ...

    def drop(self, generation: int, uid: int) -> None:
        """Drop this rank's connections of ``generation`` at once (a peer blocked on this
        rank wakes with an error)."""
        ...

    def solo(self, uid: int) -> None:
        """A group of this rank alone (a joining rank until its admission)."""
        ...


def for_backend(backend: str, store: Any, timeout: float, rebuild: bool | None = None) -> Comms:
    """The groups of a live rank on ``backend``: reconfigured in place where the backend
    can, rebuilt otherwise; ``rebuild=True`` rebuilds a gloo group too (the NCCL path,
    gloo standing in)."""
    if rebuild is None:
        rebuild = backend not in IN_PLACE_BACKENDS
    if rebuild:
        return Rebuilt(backend, store, timeout)
    return InPlace(backend, store, timeout)


class InPlace:
    """One reconfigurable gloo default group: gradients and control alike (see the
    module)."""

    rebuilds = False

    def __init__(self, backend: str, store: Any, timeout: float) -> None:
        self.backend, self.store, self.timeout = backend, store, timeout

    @property
    def control(self) -> Any:
        return None

    def start(self, rank: int, world: int) -> None:
        reconfigure.init_group(self.backend, self.store, rank, world, self.timeout)
        if not reconfigure.supported():
            raise LiveRecoveryError(
                f"recovery='live' needs a backend that can reconfigure its group in place; "
                f"{self.backend!r} in torch {reconfigure.torch_version()} cannot (use gloo, "
                "or recovery='restart')")

    def form(self, generation: int, handles: list[str], rank: int) -> None:
        reconfigure.reconfigure(generation, handles, self.timeout)

    def handle(self) -> str:
        return reconfigure.handle()

    def drop(self, generation: int, uid: int) -> None:
        reconfigure.go_solo(generation, uid, self.timeout)

    def solo(self, uid: int) -> None:
        reconfigure.init_group(self.backend, self.store, 0, 1, self.timeout)
        self.drop(-1, uid)  # a reconfigurable group has no communicator until reconfigured


class Rebuilt:
    """New groups for every generation: a default group on ``backend`` and a gloo control
    group beside it, the old ones aborted (see the module).

    Parameters
    ----------
    backend
        The gradients' backend (``"nccl"`` on GPUs; ``"gloo"`` standing in for it).
    store
        The job's store; each generation's groups rendezvous under a prefix of their own.
    timeout
        The groups' timeout in seconds.
    """

    rebuilds = True

    def __init__(self, backend: str, store: Any, timeout: float) -> None:
        self.backend, self.store, self.timeout = backend, store, timeout
        self._control: Any = None

    @property
    def control(self) -> Any:
        return self._control

    def start(self, rank: int, world: int) -> None:
        """Nothing to make before the first :meth:`form` (no group is reconfigured)."""

    def handle(self) -> str:
        # The exchange on the store only says the member is ready: each generation's groups
        # rendezvous under a prefix of their own, ranks in the decided order.
        return "ready"

    def form(self, generation: int, handles: list[str], rank: int) -> None:
        self._make(f"{PG_PREFIX}/r{generation}", rank, len(handles), settle=True)

    def drop(self, generation: int, uid: int) -> None:
        # Aborted, a gloo group keeps its connections while anything holds it (DDP does):
        # only a freed one closes them, and a peer blocked on this rank waits until then
        # (the group's timeout). So the rank takes a group of itself at once, which the
        # caller gives DDP (see ``LiveGroup._go_solo``). Not settled: a broken
        # generation's kernels may wait for a dead peer, which only the abort releases.
        self._make(f"{PG_PREFIX}/drop{uid}/{generation}", 0, 1, settle=False)

    def solo(self, uid: int) -> None:
        self._make(f"{PG_PREFIX}/solo{uid}", 0, 1, settle=True)

    def _make(self, prefix: str, rank: int, world: int, *, settle: bool) -> None:
        # Imported with a default group present (DDP's constructor imports it), torch's
        # dynamo keeps references to that group for good: an aborted gloo group closes
        # its connections only once freed, so the first group would hold its peers to the
        # timeout. Imported before any group, it pins none.
        import torch._dynamo  # noqa: F401
        import torch.distributed as dist
        from torch.distributed import PrefixStore

        if settle:
            self._settle()
        self._abort()
        dist.init_process_group(self.backend, store=PrefixStore(prefix, self.store), rank=rank,
                                world_size=world, timeout=timedelta(seconds=self.timeout))
        # Every member makes it right after the default group, in the same order: its
        # rendezvous is under the default group's prefix, unique to this generation.
        self._control = dist.new_group(backend="gloo",
                                       timeout=timedelta(seconds=self.timeout))

    @staticmethod
    def _settle() -> None:
        """Let this rank's GPU work end before a healthy group is aborted (a planned
        change, or a group of one after a drop): the host runs ahead of the GPU, and
        ``ncclCommAbort`` ends the collectives still running there, which would leave the
        last step's gradients half reduced. Nothing to wait for without CUDA."""
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def _abort(self) -> None:
        """Abort every group of this rank (the default group, the control group and any
        the user made over them): no collective, so a dead member cannot hold it up (an
        NCCL group's communicator is aborted; a gloo group's connections close once the
        group is freed)."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        self._control = None
        if dist.is_initialized():
            distributed_c10d._abort_process_group()  # noqa: SLF001 (torch's only abort of every group; no collective, unlike destroy_process_group's shutdown)
