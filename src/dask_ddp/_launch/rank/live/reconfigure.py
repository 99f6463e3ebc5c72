"""torch's in-place reconfigure of the default group, in one place (internal).

A live job's default process group is made with ``enable_reconfigure=True`` on the job's
store (under :data:`~dask_ddp._launch.wire.live_keys.PG_PREFIX`), so that torch's
``_reconfigure`` gives the same group object (the one the user's DDP holds) a new set of
peers. torch gives it no public name: every call of it is here, each saying so on its
line. Besides a generation's reconfigure, the solo fallback: a rank alone in a group of
its own (:func:`go_solo`), which a rank leaving a broken generation, a joining rank
before its admission and a leaving rank use.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dask_ddp._launch.wire.live_keys import PG_PREFIX

#: The communicator ids of the one-rank groups a rank leaves a broken generation with.
SOLO_UUID = 1 << 40


def init_group(backend: str, store: Any, rank: int, world_size: int, timeout: float) -> None:
    """Make the default process group, reconfigurable, on the job's store."""
    import torch.distributed as dist
    from torch.distributed import PrefixStore

    dist.init_process_group(backend, store=PrefixStore(PG_PREFIX, store), rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout),
                            enable_reconfigure=True)


def supported() -> bool:
    """Whether the default group's backend can reconfigure in place."""
    import torch.distributed as dist

    return dist._supports_reconfigure()  # noqa: SLF001 (torch's in-place reconfigure has no public name)


def handle() -> str:
    """This rank's handle, which the members of a generation exchange on the store."""
    import torch.distributed as dist

    return dist._get_reconfigure_handle()  # noqa: SLF001 (torch's in-place reconfigure has no public name)


def reconfigure(uuid: int, handles: list[str], timeout: float) -> None:
    """Give the default group the peers of ``handles`` (a collective over them)."""
    import torch.distributed as dist

    dist._reconfigure(uuid=uuid, handles=handles,  # noqa: SLF001 (torch's in-place reconfigure has no public name)
                      timeout=timedelta(seconds=timeout)).wait()


def go_solo(generation: int, uid: int, timeout: float) -> None:
    """Drop this rank's connections of ``generation`` at once: a survivor blocked in a
    collective on this (live) rank wakes with an error now instead of at the group's
    timeout (a group of this rank alone replaces the communicator)."""
    reconfigure(SOLO_UUID + generation * 100_000 + uid, [handle()], timeout)


def torch_version() -> str:
    import torch

    return str(torch.__version__)
