"""Who this process is in its job: rank identity, process group, share of the cores."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _cpu() -> torch.device:
    import torch

    return torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """Where this process sits in its job (see :func:`rank_info`)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    job_name: str
    job_id: str
    restart: int
    #: A ``recovery="live"`` job's current group: 0 at the start, +1 per membership change.
    generation: int = 0
    #: This rank's own device: its GPU (the one dask-ddp's launcher placed it on, see
    #: :func:`device_index`), or ``cpu`` where torch sees no CUDA device.
    device: torch.device = dataclasses.field(default_factory=_cpu)


def rank_info() -> RankInfo:
    """Return this rank's place in its job, from the environment the launcher set.

    Works in any rank started by :func:`dask_ddp.submit`, :func:`dask_ddp.dispatch.run` or
    :func:`dask_ddp.run_command`, and under torchrun (job name and id are then empty).

    ``device`` is the rank's own ``torch.device``: put the model and the batches there,
    and give DDP ``device_ids=[device.index]`` on a GPU. In a dask-ddp rank it is the GPU
    the launcher placed the rank on and selected (``torch.cuda.set_device``): the ranks of
    one host get distinct GPUs where it has enough, across workers (see the GPU page of
    the user guide). Under torchrun or Lightning (every rank sees every GPU) it is
    ``cuda:<LOCAL_RANK>``. Without CUDA it is ``cpu``. ``Loader(device="cuda")`` means
    the same GPU. Asking for it does not initialize CUDA.

    Raises
    ------
    RuntimeError
        Outside a rank process (``RANK`` or ``WORLD_SIZE`` is not set).

    Examples
    --------
    >>> info = dask_ddp.rank_info()  # doctest: +SKIP
    >>> info.rank, info.world_size  # doctest: +SKIP
    (0, 2)
    >>> device = info.device  # doctest: +SKIP
    >>> ids = [device.index] if device.type == "cuda" else None  # doctest: +SKIP
    >>> model = DDP(net.to(device), device_ids=ids)  # doctest: +SKIP
    """
    env = os.environ
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
    if missing:
        raise RuntimeError(
            f"rank_info() called outside a rank process: {', '.join(missing)} not set "
            "(call it inside the function given to dask_ddp.submit or dispatch.run)")
    rank = int(env["RANK"])
    world = int(env["WORLD_SIZE"])
    return RankInfo(
        rank=rank,
        local_rank=int(env.get("LOCAL_RANK", rank)),
        world_size=world,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
        job_name=env.get("DASK_DDP_JOB_NAME", ""),
        job_id=env.get("DASK_DDP_JOB_ID", ""),
        restart=int(env.get("DASK_DDP_RESTART", "0")),
        generation=int(env.get("DASK_DDP_GENERATION", "0")),
        device=_rank_device(env),
    )


#: Set by dask-ddp's rank process to the index of the GPU its launcher placed it on
#: (:mod:`dask_ddp._launch.rank.gpu_placement`), after ``torch.cuda.set_device`` selected it.
DEVICE_ENV = "DASK_DDP_CUDA_DEVICE"


def device_index(env: Mapping[str, str], cuda_devices: int) -> int | None:
    """The index, among the CUDA devices this process sees, of the rank's own GPU; None
    without one.

    A function's rank under dask-ddp's launcher has a recorded GPU (:data:`DEVICE_ENV`):
    the launcher gave the ranks of a host distinct GPUs where it has enough, across its
    workers. Another rank of dask-ddp (a ``run_command`` process) sees its own GPU first:
    with ``nprocs_per_worker > 1`` the launcher rotates ``CUDA_VISIBLE_DEVICES`` per
    process, and a dask-cuda worker's first visible GPU is its own. Any other launcher
    (torchrun, Lightning) shows every rank every GPU: ``LOCAL_RANK`` picks one.

    Examples
    --------
    >>> device_index({"RANK": "1", "LOCAL_RANK": "1"}, 2)  # torchrun
    1
    >>> device_index({"DASK_DDP_JOB_ID": "j", "DASK_DDP_CUDA_DEVICE": "3"}, 4)
    3
    >>> device_index({"LOCAL_RANK": "1"}, 0) is None
    True
    """
    if cuda_devices <= 0:
        return None
    placed = env.get(DEVICE_ENV)
    if placed is not None and placed.isdigit() and int(placed) < cuda_devices:
        return int(placed)
    if env.get("DASK_DDP_JOB_ID"):
        return 0
    return int(env.get("LOCAL_RANK", "0")) % cuda_devices


def own_cuda_index(env: Mapping[str, str], cuda_devices: int) -> int | None:
    """The GPU ``"cuda"`` without an index means in this process (``Loader(device="cuda")``):
    the rank's own (:func:`device_index`, as ``rank_info().device``) in a rank process of
    dask-ddp or torchrun (``LOCAL_RANK`` set); ``None`` elsewhere (then the current CUDA
    device: a single process, or a launcher that selected it with ``set_device``).

    Examples
    --------
    >>> own_cuda_index({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, 2)
    1
    >>> own_cuda_index({}, 2) is None
    True
    """
    if DEVICE_ENV in env or "DASK_DDP_JOB_ID" in env or "LOCAL_RANK" in env:
        return device_index(env, cuda_devices)
    return None


def _rank_device(env: Mapping[str, str]) -> torch.device:
    import torch

    # device_count() asks the driver (or NVML) without creating a CUDA context.
    index = device_index(env, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    return torch.device("cpu") if index is None else torch.device("cuda", index)


def process_group() -> tuple[int, int] | None:
    """(rank, world size) of the default process group when one is up, else ``None``.

    Imports ``torch.distributed`` only when called: the data and checkpoint layers ask
    this, and importing them must stay cheap.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def cores_per_rank() -> int:
    """This rank's share of the host's usable cores: cores / ``LOCAL_WORLD_SIZE``, >= 1.

    Outside a launched rank (no ``LOCAL_WORLD_SIZE``) the process has every usable core.
    """
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, usable_cores() // local)
