"""``rank_info().device`` and ``Loader(device="cuda")`` name one GPU (``_identity.py``):
under dask-ddp's launcher, torchrun and Lightning, for a made-up count of GPUs."""

from __future__ import annotations

import pytest

from dask_ddp._identity import DEVICE_ENV, device_index, own_cuda_index

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "none"}
#: Lightning's subprocess launcher: LOCAL_RANK and the world, no torchrun run id.
LIGHTNING = {"LOCAL_RANK": "3", "NODE_RANK": "0", "WORLD_SIZE": "4"}
#: A function's rank of dask-ddp that the launcher placed on its GPU 2.
DASK_DDP = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "DASK_DDP_JOB_ID": "j",
            DEVICE_ENV: "2"}


@pytest.mark.parametrize(("env", "gpus", "index"), [
    (TORCHRUN, 2, 1), (TORCHRUN, 4, 1), (LIGHTNING, 4, 3), (DASK_DDP, 4, 2),
    ({**DASK_DDP, DEVICE_ENV: "0"}, 1, 0),
])
def test_the_loaders_cuda_is_the_ranks_device(env: dict[str, str], gpus: int,
                                              index: int) -> None:
    """What ``Loader(device="cuda")`` resolves to (``own_cuda_index``) is what
    ``rank_info().device`` says (``device_index``), not the current device (cuda:0)."""
    assert own_cuda_index(env, gpus) == device_index(env, gpus) == index


def test_a_single_process_keeps_the_current_device() -> None:
    assert own_cuda_index({}, 2) is None  # the Loader takes torch's current device
    assert own_cuda_index(TORCHRUN, 0) is None and device_index(TORCHRUN, 0) is None


def test_a_placement_past_the_visible_gpus_is_not_trusted() -> None:
    # A subprocess with fewer GPUs visible than its rank had: the launcher's rule applies.
    assert device_index({**DASK_DDP, DEVICE_ENV: "3"}, 2) == 0
    assert device_index({"LOCAL_RANK": "3", DEVICE_ENV: "x"}, 2) == 1
