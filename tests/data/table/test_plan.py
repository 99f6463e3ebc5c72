"""The table epoch plan: DistributedSampler's semantics from metadata alone (no cluster)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from dask_ddp.data.table import plan as table_plan

COUNTS = [7, 0, 13, 5, 9, 11]  # 45 rows, an empty partition among them


def _ranks(seq: table_plan.EpochSequence, world: int) -> list[np.ndarray]:
    return [seq.for_rank(r, world)[0] for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 4, 7])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_row_once_plus_at_most_world_minus_one_repeats(world: int, shuffle: bool) -> None:
    seq = table_plan.epoch_sequence(COUNTS, world=world, shuffle=shuffle, seed=3, epoch=1,
                                    drop_last=False, window=2)
    ranks = _ranks(seq, world)
    assert len({len(r) for r in ranks}) == 1  # equal counts
    rows = np.concatenate(ranks)
    assert set(rows.tolist()) == set(range(sum(COUNTS)))
    assert len(rows) - sum(COUNTS) <= world - 1
    assert int(seq.pad.sum()) == len(rows) - sum(COUNTS)
    for _, wins in (seq.for_rank(r, world) for r in range(world)):
        assert np.all(np.diff(wins) >= 0)  # windows in order: each fetched in one piece


def test_drop_last_drops_the_tail_and_repeats_nothing() -> None:
    seq = table_plan.epoch_sequence(COUNTS, world=4, shuffle=True, seed=0, epoch=0,
                                    drop_last=True, window=3)
    rows = np.concatenate(_ranks(seq, 4))
    assert len(rows) == 44 and len(set(rows.tolist())) == 44


def test_unshuffled_is_distributed_samplers_order() -> None:
    n = sum(COUNTS)
    for world in (2, 3):
        seq = table_plan.epoch_sequence(COUNTS, world=world, shuffle=False, seed=0, epoch=0,
                                        drop_last=False, window=2)
        for r in range(world):
            want = list(DistributedSampler(range(n), world, r, shuffle=False))
            assert seq.for_rank(r, world)[0].tolist() == want


def test_order_is_a_function_of_seed_and_epoch_and_covers_the_whole_table() -> None:
    def rank0(seed: int, epoch: int) -> list[int]:
        seq = table_plan.epoch_sequence(COUNTS, world=2, shuffle=True, seed=seed, epoch=epoch,
                                        drop_last=False, window=2)
        return seq.for_rank(0, 2)[0].tolist()

    assert rank0(1, 2) == rank0(1, 2)
    assert rank0(1, 2) != rank0(1, 3) and rank0(1, 2) != rank0(2, 2)
    # Over epochs, rank 0 reads rows of every partition (not a fixed subset).
    offsets = np.cumsum([0, *COUNTS])
    parts = {int(np.searchsorted(offsets, g, side="right") - 1) for g in rank0(0, 0)}
    assert parts == {0, 2, 3, 4, 5}
    assert set(rank0(0, 0)) != set(rank0(0, 1))


@pytest.mark.parametrize("world", [1, 2, 3, 7, 50])  # 50: more ranks than rows
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_a_ranks_share_made_alone_is_its_share_of_the_whole(world: int, shuffle: bool,
                                                            drop_last: bool) -> None:
    for epoch, window in ((0, 1), (1, 2), (2, 4)):
        seq = table_plan.epoch_sequence(COUNTS, world=world, shuffle=shuffle, seed=5,
                                        epoch=epoch, drop_last=drop_last, window=window)
        for r in range(world):
            rows, wins = table_plan.rank_sequence(COUNTS, world=world, rank=r, shuffle=shuffle,
                                                  seed=5, epoch=epoch, drop_last=drop_last,
                                                  window=window)
            want_rows, want_wins = seq.for_rank(r, world)
            assert rows.tolist() == want_rows.tolist(), (epoch, window, r)
            assert wins.tolist() == want_wins.tolist(), (epoch, window, r)


def test_a_bad_rank_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="rank 3 of a world of 3"):
        table_plan.rank_sequence(COUNTS, world=3, rank=3, shuffle=True, seed=0, epoch=0,
                                 drop_last=False, window=2)


@pytest.mark.parametrize("old_world,new_world", [(2, 3), (4, 1), (3, 2)])
@pytest.mark.parametrize("consumed", [0, 4, 9])
def test_resume_on_another_world_reads_every_unseen_row(old_world: int, new_world: int,
                                                       consumed: int) -> None:
    full = table_plan.epoch_sequence(COUNTS, world=old_world, shuffle=True, seed=5, epoch=2,
                                     drop_last=False, window=2)
    seen = set(np.concatenate([r[:consumed] for r in _ranks(full, old_world)]).tolist())
    rest = table_plan.resumed_sequence(full, consumed_per_rank=consumed, old_world=old_world,
                                       new_world=new_world, drop_last=False)
    ranks = _ranks(rest, new_world)
    assert len({len(r) for r in ranks}) == 1
    got = set(np.concatenate(ranks).tolist())
    assert got | seen == set(range(sum(COUNTS)))
    assert len(np.concatenate(ranks)) - len(set(range(sum(COUNTS))) - seen) <= new_world - 1


def test_local_assignment_keeps_rows_on_their_worker_and_balances() -> None:
    counts = [10] * 10
    holders = ["a"] * 9 + ["b"]  # skewed: 90% of the partitions on one worker
    pieces = table_plan.local_assignment(counts, holders, ["a", "b"], drop_last=False)
    sizes = [sum(z - a for _, a, z in ps) for ps in pieces]
    assert sizes == [50, 50]
    assert all(holders[p] == "a" for p, _, _ in pieces[0])
    seq = table_plan.local_sequence(counts, pieces, seed=0, epoch=0, window=2)
    rows = np.concatenate(_ranks(seq, 2))
    assert sorted(rows.tolist()) == list(range(100))
    # The same rows each epoch, in another order.
    seq1 = table_plan.local_sequence(counts, pieces, seed=0, epoch=1, window=2)
    r0, r1 = seq.for_rank(0, 2)[0], seq1.for_rank(0, 2)[0]
    assert set(r0.tolist()) == set(r1.tolist()) and r0.tolist() != r1.tolist()


def test_local_assignment_pads_uneven_tables() -> None:
    counts = [3, 4]
    pieces = table_plan.local_assignment(counts, ["a", "b"], ["a", "b", "b"], drop_last=False)
    seq = table_plan.local_sequence(counts, pieces, seed=0, epoch=0, window=4)
    ranks = _ranks(seq, 3)
    assert [len(r) for r in ranks] == [3, 3, 3]
    assert set(np.concatenate(ranks).tolist()) == set(range(7))
    assert int(seq.pad.sum()) == 2
    rest = table_plan.resumed_sequence(seq, consumed_per_rank=1, old_world=3, new_world=2,
                                       drop_last=False)
    seen = {int(r[0]) for r in ranks}
    assert set(np.concatenate(_ranks(rest, 2)).tolist()) == set(range(7)) - seen


def test_torch_is_not_needed_for_the_plan() -> None:
    # The plan is numpy alone (it runs in the rank before any tensor exists).
    assert table_plan.np is np and torch is not None
