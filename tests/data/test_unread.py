"""The lost rank's unread samples: the Python sampler is the engine's, sample for sample,
and a Loader reads dealt samples after its own shard."""

from __future__ import annotations

import io
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dask_ddp.data import ImageList, Loader, TarShards
from dask_ddp.data import transforms as T
from dask_ddp.data.unread import rank_indices
from images import encode, file_putter, photo, write_folder

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
    lost = loaders[0].lost_samples(0, 2, [2])
    assert lost == rank_indices(N, 0, 2, 3, seed=5)[4:]
    seen = []
    for new_rank, loader in enumerate(loaders[:2]):
        loader.deal_unread(0, lost, new_rank, 2)
        seen += _labels(loader)
        loader.close()
    seen += rank_indices(N, 0, 2, 3, seed=5)[:4]
    assert sorted(set(seen)) == list(range(N))
    assert len(seen) - N <= (3 - 1) + (2 - 1)


@pytest.mark.parametrize("second_at", [3, 5, 6])
def test_a_second_loss_deals_the_lost_members_share_again(images: ImageList,
                                                          second_at: int) -> None:
    """Rank 2 of 3 lost after 1 batch (its 6 unread samples dealt to ranks 0 and 1: 2
    batches each), then rank 0 lost after ``second_at`` batches of the epoch (its own shard
    is 4 batches: 3 is inside it, 5 inside its share of rank 2's samples, 6 after it): rank
    1 alone reads the rest, every sample of the epoch once plus the padding of each deal."""
    tf = T.Compose([T.Resize((4, 4)), T.ToTensor()])
    own = [rank_indices(N, 0, r, 3, seed=5) for r in range(3)]
    survivor = Loader(images, 2, transform=tf, seed=5, rank=1, world_size=3, num_threads=1)
    assert len(survivor) == 4
    first = survivor.lost_samples(0, 1, [2])
    assert len(first) == 6
    survivor.deal_unread(0, first, 1, 2, members=[0, 1])
    share0 = [first[i] for i in rank_indices(len(first), 0, 0, 2, shuffle=False)]
    read0 = (own[0] + share0)[:second_at * 2]  # rank 0's batches before it was lost
    second = survivor.lost_samples(0, second_at, [0])
    assert second == (own[0] + share0)[second_at * 2:]
    survivor.deal_unread(0, second, 0, 1, members=[1])
    batches = iter(survivor)
    seen = [int(v) for _ in range(5) for v in next(batches)[1]]
    assert survivor.reading_unread and survivor.epoch_progress == 5
    seen += [int(v) for _, y in batches for v in y]
    survivor.close()
    counts = Counter(seen + own[2][:2] + read0)
    assert sorted(counts) == list(range(N)), sorted(set(range(N)) - set(counts))
    assert sum(c - 1 for c in counts.values()) <= (3 - 1) + (2 - 1), counts


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _shards(root: Path, sizes: list[int]) -> TarShards:
    """Tar shards of ``sizes`` samples each, labelled by their global ids, with a shuffle
    buffer."""
    first = 0
    for s, n in enumerate(sizes):
        members = []
        for i in range(first, first + n):
            members += [(f"{i:06d}.jpg", encode(photo(6, 6, i), "jpeg")),
                        (f"{i:06d}.cls", str(i).encode())]
        (root / f"shard-{s}.tar").write_bytes(_tar(members))
        first += n
    return TarShards(str(root / f"shard-{{0..{len(sizes) - 1}}}.tar"), shuffle_buffer=3)


def test_tar_shards_dealt_after_own_shard(tmp_path: Path) -> None:
    """Tar shards (uneven, a shuffle buffer): three ranks read 2 batches, rank 2 is lost;
    the two others read their own shards then rank 2's unread samples: each sample once,
    padding aside."""
    sizes = [7, 5, 9, 2]
    shards = _shards(tmp_path, sizes)
    tf = T.Compose([T.Resize((4, 4)), T.ToTensor()])
    loaders = [Loader(shards, 2, transform=tf, seed=4, rank=r, world_size=3, num_threads=1)
               for r in range(3)]
    seen: list[int] = []
    iters = [iter(loader) for loader in loaders]
    for it in iters:
        for _ in range(2):
            seen += [int(v) for v in next(it)[1]]
    lost = loaders[0].lost_samples(0, 2, [2])
    for new_rank, (loader, it) in enumerate(zip(loaders[:2], iters[:2], strict=True)):
        loader.deal_unread(0, lost, new_rank, 2)
        seen += [int(v) for _, y in it for v in y]
    for loader in loaders:
        loader.close()
    n = sum(sizes)
    assert sorted(set(seen)) == list(range(n)), sorted(set(range(n)) - set(seen))
    assert len(seen) - n <= (3 - 1) + (2 - 1), Counter(seen)


@pytest.mark.parametrize("second_at", [3, 5, 6])
def test_tar_shards_a_second_loss_deals_the_lost_members_share_again(
        tmp_path: Path, second_at: int) -> None:
    """Tar shards (uneven, a shuffle buffer): rank 2 of 3 lost after 1 batch, its unread
    samples dealt to ranks 0 and 1; then rank 0 lost after ``second_at`` batches of the
    epoch (its own shard is 4 batches: 3 inside it, 5 inside its share of the deal, 6
    after it): rank 1 alone reads the rest, every sample once plus each deal's padding."""
    sizes = [7, 5, 9, 2]
    n = sum(sizes)
    shards = _shards(tmp_path, sizes)
    tf = T.Compose([T.Resize((4, 4)), T.ToTensor()])
    loaders = [Loader(shards, 2, transform=tf, seed=4, rank=r, world_size=3, num_threads=1)
               for r in range(3)]
    assert len(loaders[1]) == 4
    iters = [iter(loader) for loader in loaders]
    seen: list[int] = [int(v) for v in next(iters[2])[1]]  # rank 2's one batch
    loaders[2].close()
    lost = loaders[1].lost_samples(0, 1, [2])
    for new_rank, loader in enumerate(loaders[:2]):
        loader.deal_unread(0, lost, new_rank, 2, members=[0, 1])
    for _ in range(second_at):  # rank 0 until it is lost
        seen += [int(v) for v in next(iters[0])[1]]
    loaders[0].close()
    second = loaders[1].lost_samples(0, second_at, [0])
    loaders[1].deal_unread(0, second, 0, 1, members=[1])
    seen += [int(v) for _, y in iters[1] for v in y]
    loaders[1].close()
    counts = Counter(seen)
    assert sorted(counts) == list(range(n)), sorted(set(range(n)) - set(counts))
    assert sum(c - 1 for c in counts.values()) <= (3 - 1) + (2 - 1), counts


def _join(images: ImageList, members: dict[int, Loader], iters: dict[int, Any], uid: int,
          unread: Any) -> None:
    """Member ``uid`` joins (its loader made in a group of one, its own shard skipped):
    the members stop reading what they had left, and ``unread`` (rank 0's
    ``lost_samples`` of them all) is dealt over the members and the joiner."""
    tf = T.Compose([T.Resize((4, 4)), T.ToTensor()])
    joiner = Loader(images, 2, transform=tf, seed=5, rank=0, world_size=1, num_threads=1)
    joiner.load_state_dict({**joiner.state_dict(), "epoch": 0, "batch": len(joiner)})
    for lo in members.values():
        lo.end_reads()
    members[uid] = joiner
    order = list(members)
    for r, u in enumerate(order):
        members[u].deal_unread(0, unread, r, len(order), members=order)
    iters[uid] = iter(joiner)


@pytest.mark.parametrize("lost_uid", [0, 2])
def test_a_loss_after_a_join_deals_the_lost_members_share_of_the_join(
        images: ImageList, lost_uid: int) -> None:
    """Members 0 and 1 (of 2) read 2 batches; member 2 joins (its loader made in a group
    of one): the epoch's unread samples are dealt over the three by member id; after one
    batch of that deal, member ``lost_uid`` (an old member, or the joiner) is lost: the
    new rank 0 (member 1) names its unread share, dealt over the two left."""
    tf = T.Compose([T.Resize((4, 4)), T.ToTensor()])
    members = {u: Loader(images, 2, transform=tf, seed=5, rank=u, world_size=2,
                         num_threads=1) for u in (0, 1)}
    iters = {u: iter(lo) for u, lo in members.items()}
    seen = [int(v) for u in (0, 1) for _ in range(2) for v in next(iters[u])[1]]
    _join(images, members, iters, 2, members[1].lost_samples(0, 2, [0, 1], uids=[0, 1]))
    seen += [int(v) for u in (0, 1, 2) for v in next(iters[u])[1]]  # one batch each
    layout = {0: 0, 1: 1}  # the epoch's layout: the joiner has no own shard in it
    lost = members[1].lost_samples(0, members[1].epoch_progress, [layout[u] for u in
                                   [lost_uid] if u in layout], uids=[lost_uid])
    left = [u for u in (0, 1, 2) if u != lost_uid]
    for r, u in enumerate(left):
        members[u].deal_unread(0, lost, r, 2, members=left)
        seen += [int(v) for _, y in iters[u] for v in y]
    for lo in members.values():
        lo.close()
    counts = Counter(seen)
    assert sorted(counts) == list(range(N)), sorted(set(range(N)) - set(counts))
    assert sum(c - 1 for c in counts.values()) <= (2 - 1) + (3 - 1) + (2 - 1), counts


@pytest.mark.parametrize("then_lose", [False, True])
@pytest.mark.parametrize("join_at", [2, 4, 5])
def test_a_join_after_a_loss_deals_everything_unread_again(
        images: ImageList, join_at: int, then_lose: bool) -> None:
    """Members 0-2 (of 3) read 1 batch; member 2 is lost and its unread samples are dealt
    to 0 and 1, who read on to batch ``join_at`` of the epoch (their own shards are 4
    batches: inside them, at their end, inside the deal); member 3 joins: each member's
    unread samples, own and dealt, are dealt over the three, and the members stop reading
    theirs. ``then_lose``: member 0 is lost one batch later: member 1 names its unread
    share, dealt over the two left. Every sample once, plus each deal's padding."""
    tf = T.Compose([T.Resize((4, 4)), T.ToTensor()])
    members = {u: Loader(images, 2, transform=tf, seed=5, rank=u, world_size=3,
                         num_threads=1) for u in (0, 1, 2)}
    assert len(members[0]) == 4
    iters = {u: iter(lo) for u, lo in members.items()}
    seen = [int(v) for u in (0, 1, 2) for v in next(iters[u])[1]]
    members.pop(2).close()
    lost = members[0].lost_samples(0, 1, [2])
    for r, u in enumerate((0, 1)):
        members[u].deal_unread(0, lost, r, 2, members=[0, 1])
    seen += [int(v) for u in (0, 1) for _ in range(join_at - 1) for v in next(iters[u])[1]]
    assert members[0].epoch_progress == members[1].epoch_progress == join_at
    _join(images, members, iters, 3,
          members[0].lost_samples(0, members[0].epoch_progress, [0, 1], uids=[0, 1]))
    pads = (2 - 1) + (3 - 1)
    left = [0, 1, 3]
    if then_lose:
        seen += [int(v) for u in left for v in next(iters[u])[1]]  # one batch each
        members.pop(0).close()
        second = members[1].lost_samples(0, members[1].epoch_progress, [0], uids=[0])
        left = [1, 3]
        for r, u in enumerate(left):
            members[u].deal_unread(0, second, r, 2, members=left)
        pads += 2 - 1
    for u in left:
        seen += [int(v) for _, y in iters[u] for v in y]
    for lo in members.values():
        lo.close()
    counts = Counter(seen)
    assert sorted(counts) == list(range(N)), sorted(set(range(N)) - set(counts))
    assert sum(c - 1 for c in counts.values()) <= pads, counts


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("saved_at", [2, 5])
def test_a_state_saved_after_a_loss_resumes_every_unread_sample_once(
        images: ImageList, saved_at: int, world: int) -> None:
    """Members 0-2 (of 3) read 1 batch; member 2 is lost, its unread samples dealt to 0
    and 1, who read on to batch ``saved_at`` (inside their own shards, inside the deal)
    and save their states (a whole restart's checkpoint): each lists its unread samples;
    ``world`` fresh loaders resume from them together (restore_training_state's way),
    and one alone resumes from a single state by ``load_state_dict``. Every sample of the
    epoch once, plus the deals' padding."""
    from dask_ddp.checkpoint.resume import restore_training_state, training_state

    tf = T.Compose([T.Resize((4, 4)), T.ToTensor()])
    members = [Loader(images, 2, transform=tf, seed=5, rank=u, world_size=3, num_threads=1)
               for u in (0, 1, 2)]
    iters = [iter(lo) for lo in members]
    seen = [int(v) for it in iters for v in next(it)[1]]
    members[2].close()
    lost = members[0].lost_samples(0, 1, [2])
    for r in (0, 1):
        members[r].deal_unread(0, lost, r, 2, members=[0, 1])
    seen += [int(v) for it in iters[:2] for _ in range(saved_at - 1) for v in next(it)[1]]
    states = [members[r].state_dict() for r in (0, 1)]
    for lo in members[:2]:
        lo.close()
    assert all(s["unread"] is not None for s in states), states
    samples = [int(i) for s in states for i in s["unread"].tolist()]
    resumed = [Loader(images, 2, transform=tf, seed=5, rank=r, world_size=world,
                      num_threads=1) for r in range(world)]
    for r, lo in enumerate(resumed):
        lo.resume_unread(0, samples, r, world)
    again = seen + [int(v) for lo in resumed for _, y in lo for v in y]
    counts = Counter(again)
    assert sorted(counts) == list(range(N)), sorted(set(range(N)) - set(counts))
    assert sum(c - 1 for c in counts.values()) <= (3 - 1) + (2 - 1) + (world - 1), counts
    # restore_training_state (no process group: rank 0 of 1) deals both saved ranks'.
    state = training_state(None, loader=None)
    state["world_size"] = 2
    state["ranks"] = [{**state["ranks"][0], "loader": s} for s in states]
    alone = Loader(images, 2, transform=tf, seed=5, rank=0, world_size=1, num_threads=1)
    restore_training_state(state, None, loader=alone)
    assert sorted(int(v) for _, y in alone for v in y) == sorted(samples)
    # One state by itself: that rank's unread samples.
    one = Loader(images, 2, transform=tf, seed=5, rank=0, world_size=3, num_threads=1)
    one.load_state_dict(states[1])
    assert sorted(int(v) for _, y in one for v in y) == sorted(states[1]["unread"].tolist())
    for lo in [*resumed, alone, one]:
        lo.close()


def test_the_engines_order_is_the_specified_one_over_sizes_seeds_and_worlds() -> None:
    """Every rank's order from the engine equals the specification's (a Python oracle),
    over dataset sizes around the world sizes, seeds, epochs, shuffle and drop_last."""
    from dask_ddp import _core
    from sampler_reference import reference_indices

    cases = 0
    for n in (0, 1, 2, 3, 7, 16, 23, 64, 101, 1000):
        for world in (1, 2, 3, 5, 8):
            for seed, epoch in ((0, 0), (11, 3), (2**63 + 5, 2**40)):
                for shuffle in (True, False):
                    for drop_last in (False, True):
                        for rank in range(world):
                            got = _core.sampler_indices(n, epoch, rank, world, shuffle=shuffle,
                                                        seed=seed, drop_last=drop_last)
                            want = reference_indices(n, epoch, rank, world, shuffle=shuffle,
                                                     seed=seed, drop_last=drop_last)
                            assert got.tolist() == want, (n, world, seed, epoch, shuffle,
                                                          drop_last, rank)
                            cases += 1
    assert cases == 10 * 19 * 3 * 2 * 2
