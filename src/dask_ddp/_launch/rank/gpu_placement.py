"""Which GPU each rank takes, and the backend that follows (internal; the rank process).

Every rank publishes what it sees on the job's store (rank 0's ``TCPStore``, or a live
job's): its host and the UUIDs of its visible GPUs, in its own ``cuda:<i>`` order
(:class:`RankGpus`). Every rank then reads them all and computes the same answer:

- :func:`place` gives the ranks distinct GPUs wherever their hosts have enough, across
  workers and not only within one, and respects what each rank may see (dask-cuda's
  per-worker ``CUDA_VISIBLE_DEVICES``): a GPU is named by its UUID, so two workers that
  see the same GPU under different indices still count as sharing it.
- :func:`choose_backend` turns the requested backend and the placement into the one the
  job uses: ``"auto"`` is ``"cpu:gloo,cuda:nccl"`` where every rank has a GPU of its own
  (CPU tensors and models keep working), and ``"gloo"`` with one warning where two ranks
  would share a GPU (NCCL stops there: "Duplicate GPU detected"); an explicit NCCL backend
  fails before any collective, naming both ranks and the GPU.

Both are pure: the tests run them over made-up hosts and UUIDs.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Sequence
from typing import Any

from dask_ddp import _identity as identity

#: The store key of rank ``r``'s :class:`RankGpus`.
GPUS_KEY = "dask_ddp/gpus/{rank}"
#: The environment variable the rank process sets to its placed GPU's index (read by
#: :func:`dask_ddp._identity.device_index`): ``rank_info().device`` and
#: ``Loader(device="cuda")`` then name the GPU ``torch.cuda.set_device`` selected.
DEVICE_ENV = identity.DEVICE_ENV


@dataclasses.dataclass(frozen=True)
class RankGpus:
    """What one rank sees: its host and its visible GPUs' UUIDs (index ``i`` is its
    ``cuda:i``); no GPUs where torch sees no CUDA device."""

    host: str
    gpus: tuple[str, ...] = ()

    def dumps(self) -> str:
        return json.dumps({"host": self.host, "gpus": list(self.gpus)})

    @classmethod
    def loads(cls, raw: bytes | str, rank: int) -> RankGpus:
        """The record rank ``rank`` published; raises :class:`ValueError` naming it."""
        try:
            value = json.loads(raw)
            host, gpus = value["host"], value["gpus"]
            if not isinstance(host, str) or not all(isinstance(g, str) for g in gpus):
                raise TypeError("host and gpus must be strings")
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"rank {rank}'s GPU record on the job's store is not one: "
                             f"{raw!r} ({exc})") from None
        return cls(host, tuple(gpus))


@dataclasses.dataclass(frozen=True)
class Shared:
    """Rank ``rank`` would use the GPU ``gpu`` of ``host`` that rank ``other`` holds."""

    rank: int
    other: int
    host: str
    gpu: str

    def __str__(self) -> str:
        return f"ranks {self.other} and {self.rank} on GPU {self.gpu} of host {self.host}"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Every rank's GPU: ``devices[r]`` is the index among rank ``r``'s visible GPUs
    (``None``: it has none), ``shared`` the ranks that would use a GPU another holds."""

    devices: tuple[int | None, ...]
    shared: tuple[Shared, ...] = ()


def place(seen: Sequence[RankGpus]) -> Placement:
    """Give each rank (``seen[r]`` what rank ``r`` sees) a GPU of its own where it can.

    A maximum matching of ranks to GPUs: each rank first takes the first free GPU in its
    own order (a dask-cuda worker's own GPU, a rotated ``CUDA_VISIBLE_DEVICES``' first),
    then a rank left without one moves the holders along (an augmenting path), so a
    rank never shares while a placement without sharing exists. A rank still without
    one takes its first visible GPU and is reported in ``shared`` with its holder.

    Examples
    --------
    >>> one_gpu = RankGpus("h", ("GPU-a",))
    >>> place([one_gpu, one_gpu]).shared
    (Shared(rank=1, other=0, host='h', gpu='GPU-a'),)
    >>> two = RankGpus("h", ("GPU-a", "GPU-b"))
    >>> place([two, two]).devices
    (0, 1)
    """
    holder: dict[str, int] = {}  # GPU uuid -> the rank that has it
    choice: dict[int, str] = {}

    def augment(rank: int, visited: set[str]) -> bool:
        for gpu in seen[rank].gpus:
            if gpu in visited:
                continue
            visited.add(gpu)
            if gpu not in holder or augment(holder[gpu], visited):
                holder[gpu], choice[rank] = rank, gpu
                return True
        return False

    for rank, view in enumerate(seen):
        free = next((g for g in view.gpus if g not in holder), None)
        if free is not None:
            holder[free], choice[rank] = rank, free
        elif view.gpus:
            augment(rank, set())
    shared = []
    for rank, view in enumerate(seen):
        if view.gpus and rank not in choice:
            gpu = view.gpus[0]
            shared.append(Shared(rank, holder[gpu], view.host, gpu))
            choice[rank] = gpu
    devices = tuple(seen[r].gpus.index(choice[r]) if r in choice else None
                    for r in range(len(seen)))
    return Placement(devices, tuple(shared))


#: What ``backend="auto"`` is where every rank has a GPU of its own.
AUTO_WITH_NCCL = "cpu:gloo,cuda:nccl"


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """The backend a job's ranks pass to ``init_process_group``, and the warning (once,
    rank 0 gives it) that says why ``auto`` did not take NCCL, if one is due."""

    backend: str
    warning: str | None = None

    @property
    def uses_nccl(self) -> bool:
        """Whether CUDA tensors go through NCCL (the group may take ``device_id=``)."""
        return "nccl" in self.backend


def choose_backend(requested: str, seen: Sequence[RankGpus],
                   placement: Placement) -> BackendChoice:
    """The job's backend for ``requested`` (``"auto"``, or what the user named).

    Raises
    ------
    RuntimeError
        A requested NCCL backend where a rank has no GPU or two ranks would share one
        (naming them, the host and the GPU), before any collective runs.

    Examples
    --------
    >>> two = RankGpus("h", ("GPU-a", "GPU-b"))
    >>> choose_backend("auto", [two, two], place([two, two])).backend
    'cpu:gloo,cuda:nccl'
    >>> choose_backend("auto", [RankGpus("h")] * 2, place([RankGpus("h")] * 2)).backend
    'gloo'
    """
    without = [r for r, view in enumerate(seen) if not view.gpus]
    shares = "; ".join(str(s) for s in placement.shared)
    if requested == "auto":
        if without:
            return BackendChoice("gloo")  # a CPU job, or some ranks without a GPU
        if placement.shared:
            return BackendChoice("gloo", (
                f"backend='auto' uses gloo, not NCCL: {shares} would share a GPU "
                "(NCCL needs one GPU per rank). Give each worker its own GPU (dask-cuda's "
                "LocalCUDACluster or dask-cuda-worker), or fewer ranks per host than it "
                "has GPUs; pass backend='gloo' to choose this yourself"))
        return BackendChoice(AUTO_WITH_NCCL)
    if "nccl" in requested:
        if without:
            named = ", ".join(f"rank {r} on host {seen[r].host}" for r in without)
            raise RuntimeError(
                f"backend={requested!r} needs CUDA on every rank, but no CUDA device is "
                f"visible to {named} (torch.cuda.is_available() is False); use "
                "backend='gloo' or 'auto'")
        if placement.shared:
            raise RuntimeError(
                f"backend={requested!r} needs one GPU per rank, but {shares} would share "
                "a GPU (NCCL stops with 'Duplicate GPU detected'); give each worker its "
                "own GPU (dask-cuda), run fewer ranks per host, or use backend='auto' "
                "(gloo where GPUs would be shared)")
    return BackendChoice(requested)


# -------------------------------------------------------------- the rank process's side


def visible_gpus() -> tuple[str, ...]:
    """The UUIDs of this process's visible GPUs, in its ``cuda:<i>`` order.

    Read from the device properties (the driver's, without a CUDA context on any GPU);
    a GPU whose UUID torch cannot give is named by its PCI address.
    """
    import torch

    if not torch.cuda.is_available():
        return ()
    names = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        uuid = str(getattr(props, "uuid", "") or "")
        names.append(uuid or "pci:{}:{}:{}".format(getattr(props, "pci_domain_id", "?"),
                                                   getattr(props, "pci_bus_id", "?"),
                                                   getattr(props, "pci_device_id", "?")))
    return tuple(names)


def gather(store: Any, rank: int, world: int) -> list[RankGpus]:
    """Publish this rank's :class:`RankGpus` on ``store`` and read every rank's (waits for
    them within the store's timeout)."""
    mine = RankGpus(socket.gethostname(), visible_gpus())
    store.set(GPUS_KEY.format(rank=rank), mine.dumps())
    keys = [GPUS_KEY.format(rank=r) for r in range(world)]
    store.wait(keys)
    return [RankGpus.loads(store.get(k), r) for r, k in enumerate(keys)]
