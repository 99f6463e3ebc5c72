"""A lost rank's unread rows of a table (live recovery, data/table/loader.py): dealt to
the ranks that go on after their own rows, again when a second rank is lost, a joiner's
deal, and the next epochs read over the new group. Read from Parquet, without a cluster:
every row of an epoch once, plus each deal's padding."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dask_ddp.data import Loader, Table
from table_util import feeding_threads, parquet_table
from waits import wait_until

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 301  # not a multiple of the world sizes: padding too
BS = 8


@pytest.fixture
def table(tmp_path: Path) -> Table:
    return parquet_table(tmp_path, ROWS, 40)


def _loaders(table: Table, world: int, **kw: Any) -> list[Any]:
    return [Loader(table, BS, seed=3, rank=r, world_size=world, num_threads=1, window=2, **kw)
            for r in range(world)]


def _take(it: Any, n: int) -> list[int]:
    return [int(i) for _ in range(n) for i in next(it)["id"].tolist()]


def _rest(it: Any) -> list[int]:
    return [int(i) for b in it for i in b["id"].tolist()]


def _check_once(seen: list[int], padding: int) -> None:
    counts = Counter(seen)
    assert sorted(counts) == list(range(ROWS)), sorted(set(range(ROWS)) - set(counts))
    extra = sum(c - 1 for c in counts.values())
    assert extra <= padding, (extra, padding, [i for i, c in counts.items() if c > 1][:10])


@pytest.mark.parametrize("shuffle", [True, False, "local"])
def test_a_lost_ranks_rows_are_read_by_the_others(table: Table, shuffle: Any) -> None:
    """Three ranks read 3 batches, rank 2 is lost: the two others read their own rows,
    then rank 2's unread ones, dealt between them."""
    loaders = _loaders(table, 3, shuffle=shuffle)
    iters = [iter(lo) for lo in loaders]
    seen = [i for it in iters for i in _take(it, 3)]
    lost = loaders[0].lost_samples(0, 3, [2])
    assert len(lost) == loaders[2].num_samples - 3 * BS
    for new_rank, lo in enumerate(loaders[:2]):
        lo.deal_unread(0, lost, new_rank, 2, members=[0, 1])
    for lo, it in zip(loaders[:2], iters[:2], strict=True):
        seen += _rest(it)
        assert lo.reading_unread
        share = -(-len(lost) // 2)
        assert lo.epoch_progress == len(lo) + -(-share // BS)
    for lo in loaders:
        lo.close()
    _check_once(seen, (3 - 1) + (2 - 1))


@pytest.mark.parametrize("second_at", [10, 15, 17])
def test_a_second_loss_deals_the_lost_members_share_again(table: Table,
                                                          second_at: int) -> None:
    """Rank 2 of 3 lost after 5 batches (own rows: 13 batches), its 61 unread rows dealt
    to ranks 0 and 1 (4 batches each); rank 0 lost after ``second_at`` batches of the
    epoch (inside its own rows, inside its share of the deal, after it): rank 1 alone
    reads the rest."""
    loaders = _loaders(table, 3)
    assert len(loaders[0]) == 13
    iters = [iter(lo) for lo in loaders]
    seen = _take(iters[2], 5)
    loaders[2].close()
    first = loaders[1].lost_samples(0, 5, [2])
    for new_rank, lo in enumerate(loaders[:2]):
        lo.deal_unread(0, first, new_rank, 2, members=[0, 1])
    seen += _take(iters[0], second_at)
    assert loaders[0].epoch_progress == second_at
    loaders[0].close()
    second = loaders[1].lost_samples(0, second_at, [0])
    loaders[1].deal_unread(0, second, 0, 1, members=[1])
    seen += _rest(iters[1])
    loaders[1].close()
    _check_once(seen, (3 - 1) + (2 - 1))


def test_a_joiner_takes_a_share_and_the_next_epoch_has_three(table: Table) -> None:
    """Two ranks read 4 batches; a third joins: the two end their own rows, the epoch's
    unread rows are dealt over three (the joiner's loader made in a group of one); from
    the next epoch every loader reads as a rank of three."""
    loaders = _loaders(table, 2)
    iters = [iter(lo) for lo in loaders]
    seen = [i for it in iters for i in _take(it, 4)]
    unread = loaders[0].lost_samples(0, 4, [0, 1])
    assert len(unread) == ROWS + 1 - 8 * BS
    joiner = Loader(table, BS, seed=3, rank=0, world_size=1, num_threads=1, window=2)
    joiner.load_state_dict({**joiner.state_dict(), "epoch": 0, "batch": len(joiner)})
    members = [*loaders, joiner]
    for new_rank, lo in enumerate(members):
        if lo is not joiner:
            lo.end_reads()
        lo.deal_unread(0, unread, new_rank, 3)
        lo.reshard(new_rank, 3)
    iters.append(iter(joiner))
    for it in iters:
        seen += _rest(it)
    _check_once(seen, (2 - 1) + (3 - 1))
    seen = []
    for new_rank, lo in enumerate(members):
        lo.set_epoch(1)
        assert (lo.rank, lo.world_size) == (new_rank, 3)
        seen += _rest(iter(lo))
        lo.close()
    _check_once(seen, 3 - 1)
    want = Loader(table, BS, seed=3, rank=1, world_size=3, num_threads=1, window=2)
    want.set_epoch(1)
    members[1].set_epoch(1)
    assert _rest(iter(members[1])) == _rest(iter(want))
    want.close()


def _lose_rank_2_then_read_to(table: Table, at: int) -> tuple[list[Any], list[Any],
                                                                list[int]]:
    """Three ranks read 5 batches (own rows: 13); rank 2 is lost and its unread rows
    dealt to ranks 0 and 1, who read on to batch ``at`` of the epoch: the loaders, their
    iterators and the rows read."""
    loaders = _loaders(table, 3)
    assert len(loaders[0]) == 13
    iters = [iter(lo) for lo in loaders]
    seen = [i for it in iters for i in _take(it, 5)]
    loaders[2].close()
    lost = loaders[0].lost_samples(0, 5, [2])
    for new_rank, lo in enumerate(loaders[:2]):
        lo.deal_unread(0, lost, new_rank, 2, members=[0, 1])
    seen += [i for it in iters[:2] for i in _take(it, at - 5)]
    return loaders, iters, seen


@pytest.mark.parametrize("join_at", [8, 13, 15])
def test_a_join_after_a_loss_deals_everything_unread_again(table: Table,
                                                          join_at: int) -> None:
    """Rank 2 of 3 lost after 5 batches (own rows: 13 batches), its unread rows dealt to
    ranks 0 and 1, who read on to batch ``join_at`` of the epoch (inside their own rows,
    at their end, inside the deal); a joiner comes: each member's unread rows, own and
    dealt, are dealt over the three, and the members stop reading theirs; then member 0
    is lost after 1 batch more: its unread share goes to the two left."""
    loaders, iters, seen = _lose_rank_2_then_read_to(table, join_at)
    assert loaders[0].epoch_progress == loaders[1].epoch_progress == join_at
    unread = loaders[0].lost_samples(0, join_at, [0, 1], uids=[0, 1])
    joiner = Loader(table, BS, seed=3, rank=0, world_size=1, num_threads=1, window=2)
    joiner.load_state_dict({**joiner.state_dict(), "epoch": 0, "batch": len(joiner)})
    members = {0: loaders[0], 1: loaders[1], 3: joiner}
    iters_of = {0: iters[0], 1: iters[1], 3: iter(joiner)}
    for new_rank, (uid, lo) in enumerate(members.items()):
        if uid != 3:
            lo.end_reads()
        lo.deal_unread(0, unread, new_rank, 3, members=[0, 1, 3])
    seen += [i for it in iters_of.values() for i in _take(it, 1)]
    members.pop(0).close()
    second = members[1].lost_samples(0, members[1].epoch_progress, [0], uids=[0])
    for new_rank, uid in enumerate((1, 3)):
        members[uid].deal_unread(0, second, new_rank, 2, members=[1, 3])
        seen += _rest(iters_of[uid])
    for lo in members.values():
        lo.close()
    _check_once(seen, (3 - 1) + (2 - 1) + (3 - 1) + (2 - 1))


@pytest.mark.parametrize("saved_at", [8, 15])
def test_a_state_saved_after_a_loss_resumes_every_unread_row_once(table: Table,
                                                                  saved_at: int) -> None:
    """Rank 2 of 3 lost after 5 batches, its unread rows dealt to ranks 0 and 1, who read
    on to batch ``saved_at`` (inside their own rows, inside the deal) and save their
    states: a restart on 2 ranks resumes from them (restore_training_state) with every
    row of the epoch read once, plus the deals' padding."""
    from dask_ddp.checkpoint.resume import restore_training_state, training_state

    loaders, iters, seen = _lose_rank_2_then_read_to(table, saved_at)
    state = training_state(None, loader=None)
    state["world_size"] = 2
    state["ranks"] = [{**state["ranks"][0], "loader": lo.state_dict()} for lo in loaders[:2]]
    for lo in loaders[:2]:
        lo.close()
    for rank in (0, 1):
        # As rank ``rank`` of a restarted 2-rank job (the process group's place taken by
        # the dealing: restore_training_state deals as rank 0 of 1 without a group).
        fresh = Loader(table, BS, seed=3, rank=rank, world_size=2, num_threads=1, window=2)
        samples = [int(i) for r in state["ranks"] for i in r["loader"]["unread"].tolist()]
        fresh.resume_unread(0, samples, rank, 2)
        seen += _rest(iter(fresh))
        fresh.close()
    _check_once(seen, (3 - 1) + (2 - 1) + (2 - 1))
    alone = Loader(table, BS, seed=3, rank=0, world_size=1, num_threads=1, window=2)
    restore_training_state(state, None, loader=alone)
    assert sorted(_rest(iter(alone))) == sorted(samples)
    alone.close()


def test_reshard_is_checked(table: Table) -> None:
    lo = _loaders(table, 1)[0]
    with pytest.raises(ValueError, match="rank must be in"):
        lo.reshard(3, 2)
    lo.close()


def test_leaving_a_deal_early_ends_its_feeding_thread(table: Table) -> None:
    """A loop that leaves the epoch inside a deal (rank 1's rows dealt to rank 0) ends the
    deal's feeding thread then, not at the next epoch; the next epoch reads rank 0's
    rows."""
    loader = Loader(table, BS, seed=3, rank=0, world_size=2, window=1, prefetch=1)
    lost = loader.lost_samples(0, 0, [1])
    loader.deal_unread(0, lost, 0, 1)
    before, dealing, seen = feeding_threads(), set[Any](), list[int]()
    try:
        for batch in loader:
            seen += batch["id"].tolist()
            if loader.reading_unread:
                dealing |= feeding_threads() - before
                break
            before = feeding_threads()  # the own rows' feeding thread among them
        assert len(seen) == loader.num_samples + BS and dealing, "no deal was read"
        wait_until(lambda: [t.name for t in dealing if t.is_alive()], 30,
                   "the deal's feeding thread still runs after the loop left the epoch")
        loader.set_epoch(1)
        assert len(_rest(iter(loader))) == loader.num_samples
    finally:
        loader.close()
