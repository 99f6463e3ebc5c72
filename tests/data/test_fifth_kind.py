"""A fifth data kind is one file: a :class:`~dask_ddp.data.Source` defined here alone (an
in-memory list of arrays), with nothing in ``src/`` made for it, works with the Loader
(its order over two ranks, a checkpoint's resume mid-epoch), the device stage
(``device="cpu"``), ``predict`` and live recovery (the audit of tests/launch: every id once
per epoch after a rank is killed).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import dask_ddp
from cluster_util import client_fixture
from dask_ddp.data import Loader, Source

# The live audit's rank function and checks, shared (its module is not a package's).
sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
import test_live_audit as audit  # noqa: E402

client = client_fixture(audit.WORLD)


class Arrays(Source):
    """Samples held in memory: ``images[i]`` (float32, 3 x 6 x 6) and its id ``i``, the
    label. The least a Source writes: its length and how to read a batch of ids."""

    def __init__(self, n: int) -> None:
        self.images = np.arange(n * 3 * 6 * 6, dtype=np.float32).reshape(n, 3, 6, 6) / n

    def __len__(self) -> int:
        return len(self.images)

    def read(self, ids: Any) -> tuple[np.ndarray, np.ndarray]:
        picked = np.asarray(ids, dtype=np.int64)
        return self.images[picked], picked


def _ids(loader: Loader) -> list[list[int]]:
    return [[int(i) for i in y] for _, y in loader]


def test_every_id_once_per_epoch_shuffled_by_seed_over_two_ranks() -> None:
    source = Arrays(10)
    loaders = [Loader(source, 2, seed=5, rank=r, world_size=2) for r in (0, 1)]
    seen: dict[int, list[list[list[int]]]] = {}
    for epoch in (0, 1):
        for loader in loaders:
            loader.set_epoch(epoch)
        seen[epoch] = [_ids(loader) for loader in loaders]
    for epoch, ranks in seen.items():
        flat = [i for rank in ranks for batch in rank for i in batch]
        assert sorted(flat) == list(range(10)), (epoch, ranks)
        assert [len(rank) for rank in ranks] == [3, 3]  # 5 ids each: 2, 2 and 1
        assert [len(loader) for loader in loaders] == [3, 3]
    assert seen[0] != seen[1], "the epoch did not change the order"
    again = Loader(source, 2, seed=5, rank=0, world_size=2)
    assert _ids(again) == seen[0][0], "the same seed gave another order"
    other = [_ids(Loader(source, 2, seed=6, rank=r, world_size=2)) for r in (0, 1)]
    assert other != seen[0]
    plain = Loader(source, 2, shuffle=False, rank=1, world_size=2)
    assert _ids(plain) == [[1, 3], [5, 7], [9]]  # DistributedSampler's, unshuffled


def test_a_checkpoint_resumes_mid_epoch_with_the_unread_ids() -> None:
    source = Arrays(12)
    whole = Loader(source, 2, seed=1, rank=1, world_size=2)
    whole.set_epoch(3)
    expected = _ids(whole)
    first = Loader(source, 2, seed=1, rank=1, world_size=2)
    first.set_epoch(3)
    it = iter(first)
    taken = [[int(i) for i in next(it)[1]] for _ in range(2)]
    state = first.state_dict()
    first.close()
    assert state["epoch"] == 3 and state["batch"] == 2
    resumed = Loader(source, 2, seed=1, rank=1, world_size=2)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)  # a loop's set_epoch keeps the restored position
    assert taken + _ids(resumed) == expected
    with pytest.raises(ValueError, match="seed=1"):
        Loader(source, 2, seed=2, rank=1, world_size=2).load_state_dict(state)


def test_device_cpu_goes_through_the_device_stage() -> None:
    loader = Loader(Arrays(6), 4, shuffle=False, device="cpu", channels_last=True)
    assert loader.device == torch.device("cpu")
    images, ids = next(iter(loader))
    # channels_last is the stage's doing: the Source read contiguous arrays.
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert not images.is_contiguous()
    assert ids.tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(images, torch.from_numpy(Arrays(6).images[:4]))
    with pytest.raises(ValueError, match="takes no transform"):
        Loader(Arrays(6), 4, transform=object())  # type: ignore[arg-type]


@pytest.mark.gpu
def test_device_cuda_hands_the_batches_over_on_the_gpu() -> None:
    loader = Loader(Arrays(6), 4, shuffle=False, device="cuda", channels_last=True)
    images, ids = next(iter(loader))
    assert images.is_cuda and ids.is_cuda
    assert images.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(images.cpu(), torch.from_numpy(Arrays(6).images[:4]))
    assert ids.tolist() == [0, 1, 2, 3]
    loader.close()


def test_predict_reads_a_source() -> None:
    import dask

    source = Arrays(7)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 6 * 6, 2))
    out = dask_ddp.predict(model, source, batch_size=2, partition_size=3, device="cpu")
    with dask.config.set(scheduler="sync"):
        frame = out.compute()
    assert frame.index.tolist() == list(range(7))
    with torch.no_grad():
        want = model(torch.from_numpy(source.images)).numpy()
    np.testing.assert_allclose(frame[["out_0", "out_1"]].to_numpy(), want, rtol=1e-5)


def test_predict_reads_a_source_on_the_cluster(client: Any) -> None:
    source = Arrays(9)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 6 * 6, 1))
    out = dask_ddp.predict(model, source, batch_size=4, partition_size=4)
    frame = client.compute(out).result(timeout=120)  # the Source pickled to the workers
    assert out.npartitions == 3 and sorted(frame.index) == list(range(9))
    with torch.no_grad():
        want = model(torch.from_numpy(source.images)).numpy()[:, 0]
    np.testing.assert_allclose(frame.sort_index().to_numpy()[:, 0], want, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_live_recovery_reads_every_id_once_after_a_kill(client: Any, tmp_path: Path) -> None:
    seed = audit._seeds()[0]
    run = dataclasses.replace(audit.plan("kill", seed), kind="source")
    audit._full_size(client)
    job, struck_at = audit._strike(client, run, Arrays(audit.N), tmp_path)
    try:
        audit._check(job, run, tmp_path, struck_at)
    except AssertionError as e:
        raise AssertionError(f"{run} (replay: DASK_DDP_AUDIT_SEED={seed}): {e}") from e
