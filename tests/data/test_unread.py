"""The lost rank's unread samples: the Python sampler is the engine's, sample for sample,
and a Loader reads dealt samples after its own shard."""

from __future__ import annotations

from pathlib import Path

import pytest

from dask_ddp.data import ImageList, Loader
from dask_ddp.data import transforms as T
from dask_ddp.data.unread import lost_positions, rank_indices
from images import file_putter, write_folder

N = 23  # not a multiple of the world sizes: padding too


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> ImageList:
    root = tmp_path_factory.mktemp("imgs")
    keys = [k for k, _ in write_folder(file_putter(str(root)), ["a"], N, sizes=((6, 6),))]
    return ImageList(str(root), keys, list(range(N)))


def _labels(loader: Loader) -> list[int]:
    return [int(v) for _, y in loader for v in y]


@pytest.mark.parametrize(("world", "shuffle", "drop_last", "epoch"),
                         [(3, True, False, 0), (4, True, True, 2), (2, False, False, 1),
                          (5, True, False, 7)])
def test_rank_indices_are_the_engines(images: ImageList, world: int, shuffle: bool,
                                      drop_last: bool, epoch: int) -> None:
    tf = T.Compose([T.Resize((4, 4)), T.ToTensor()])
    for rank in range(world):
        loader = Loader(images, 3, transform=tf, shuffle=shuffle, seed=11, rank=rank,
                        world_size=world, drop_last=drop_last, num_threads=1)
        loader.set_epoch(epoch)
        got = _labels(loader)
        want = rank_indices(N, epoch, rank, world, shuffle=shuffle, seed=11,
                            drop_last=drop_last)
        if drop_last:  # the engine also drops the last short batch
            want = want[:len(want) // 3 * 3]
        assert got == want, (rank, world)
        loader.close()


def test_dealt_samples_follow_own_shard(images: ImageList) -> None:
    """Two survivors of three: their own shards, then rank 2's unread after 2 batches."""
    tf = T.Compose([T.Resize((4, 4)), T.ToTensor()])
    loaders = [Loader(images, 2, transform=tf, seed=5, rank=r, world_size=3, num_threads=1)
               for r in range(3)]
    lost = lost_positions(loaders[0], 0, 2, [2])
    assert lost == rank_indices(N, 0, 2, 3, seed=5)[4:]
    seen = []
    for new_rank, loader in enumerate(loaders[:2]):
        loader.deal_unread(0, lost, new_rank, 2)
        seen += _labels(loader)
        loader.close()
    seen += rank_indices(N, 0, 2, 3, seed=5)[:4]
    assert sorted(set(seen)) == list(range(N))
    assert len(seen) - N <= (3 - 1) + (2 - 1)
