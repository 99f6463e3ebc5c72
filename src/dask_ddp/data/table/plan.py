"""The epoch plan of a table: which rows each rank reads, in which order (internal).

Semantics are ``torch.utils.data.DistributedSampler``'s over the whole table: an epoch is
one sequence ``S`` of global row ids (every row once), padded by repeating its first rows
up to a multiple of the world size (``drop_last=False``) or cut down to one
(``drop_last=True``); rank ``r`` reads ``S[r::world]``. The sequence is a function of
``(seed, epoch)`` and the table's row counts only.

- ``shuffle=False``: ``S`` is the rows in table order, exactly DistributedSampler's.
- ``shuffle=True``: the partitions are permuted, cut into windows of ``window``
  partitions, and the rows of each window permuted: each rank reads rows of every
  partition over the epoch while holding only a window's rows at a time.
- ``shuffle="local"``: each rank keeps one set of rows for the whole run, taken first
  from the partitions its own worker holds (:func:`local_assignment`); the order of its
  rows changes each epoch (windows as above, within its set).

Every position carries a window id; a rank fetches a window's rows of each partition in
one piece, so a partition reaches a rank at most once per window (once an epoch when the
windows hold each partition once, which they do without resume or padding).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EpochSequence:
    """An epoch over every rank: global row ids, window ids, and which are padding."""

    rows: np.ndarray  # int64 [T]
    window: np.ndarray  # int64 [T], non-decreasing along each rank's positions
    pad: np.ndarray  # bool [T]: a repeat added to make the ranks equal

    def for_rank(self, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s rows and their window ids."""
        return self.rows[rank::world], self.window[rank::world]


def _rng(seed: int, epoch: int, salt: int = 0) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([int(seed) & 0xFFFFFFFF, int(epoch), salt]))


def _windows(parts: np.ndarray, window: int) -> list[np.ndarray]:
    return [parts[i:i + window] for i in range(0, len(parts), window)] or [parts]


def pad_to(rows: np.ndarray, window: np.ndarray, world: int, drop_last: bool
           ) -> EpochSequence:
    """``rows`` over ``world`` ranks, ``DistributedSampler``'s way: padded by repeating
    the first rows, or cut to a multiple of ``world`` with ``drop_last``."""
    n = len(rows)
    if drop_last:
        total = (n // world) * world
        return EpochSequence(rows[:total], window[:total], np.zeros(total, bool))
    total = -(-n // world) * world
    pad = total - n
    if pad == 0:
        return EpochSequence(rows, window, np.zeros(n, bool))
    # As DistributedSampler: the first rows again (cycled when the table is tiny).
    reps = np.resize(np.arange(n), pad) if n else np.zeros(0, np.int64)
    last = (window[-1] + 1) if n else 0
    return EpochSequence(
        np.concatenate([rows, rows[reps]]),
        np.concatenate([window, np.full(pad, last, np.int64)]),
        np.concatenate([np.zeros(n, bool), np.ones(pad, bool)]))


def _partition_order(counts: np.ndarray, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The order of the partitions in the epoch: table order, or permuted by (seed, epoch)."""
    parts = np.arange(len(counts), dtype=np.int64)
    if shuffle:
        parts = _rng(seed, epoch).permutation(parts)
    return np.ascontiguousarray(parts, np.int64)


def base_sequence(counts: Sequence[int], *, shuffle: bool, seed: int, epoch: int,
                  window: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row of the table once, in the epoch's order, with window ids (no padding).

    The partitions' order comes from ``(seed, epoch)``; the rows of each window are laid
    out and shuffled by the engine (keyed by seed, epoch and window: linear time, no
    Python per row)."""
    from dask_ddp import _core

    counts_a = np.ascontiguousarray(counts, np.int64)
    parts = _partition_order(counts_a, shuffle, seed, epoch)
    total = int(counts_a.sum())
    rows = np.empty(total, np.int64)
    wins = np.empty(total, np.int64)
    _core.windowed_sequence(counts_a, parts, max(1, window), bool(shuffle), *_key(seed, epoch),
                            0, rows, wins)
    return rows, wins


def rank_sequence(counts: Sequence[int], *, world: int, rank: int, shuffle: bool, seed: int,
                  epoch: int, drop_last: bool, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s rows of :func:`epoch_sequence` and their window ids, equal to
    ``epoch_sequence(...).for_rank(rank, world)`` but made by the engine from the rank's
    positions alone (each window's permutation gives a position's row without the others):
    time linear in the rank's rows, not the table's."""
    from dask_ddp import _core

    counts_a = np.ascontiguousarray(counts, np.int64)
    parts = _partition_order(counts_a, shuffle, seed, epoch)
    rows, wins = _core.rank_sequence(counts_a, parts, max(1, window), bool(shuffle),
                                     *_key(seed, epoch), 0, world, rank, drop_last)
    return rows, wins


def _key(seed: int, epoch: int) -> tuple[int, int]:
    """The engine's shuffle key words of ``(seed, epoch)``."""
    return int(seed) & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFFFFFFFFFF


def epoch_sequence(counts: Sequence[int], *, world: int, shuffle: bool, seed: int, epoch: int,
                   drop_last: bool, window: int) -> EpochSequence:
    """The epoch over the whole table for ``shuffle`` True or False."""
    rows, wins = base_sequence(counts, shuffle=shuffle, seed=seed, epoch=epoch, window=window)
    return pad_to(rows, wins, world, drop_last)


def local_assignment(counts: Sequence[int], holders: Sequence[str | None],
                     rank_workers: Sequence[str], *, drop_last: bool
                     ) -> list[list[tuple[int, int, int]]]:
    """Each rank's rows for ``shuffle="local"``, as (partition, start, stop) pieces.

    Each rank gets ``ceil(n / world)`` rows (``floor`` with ``drop_last``); partitions go
    whole to a rank on the worker holding them while it has room (largest first), the
    rest is split at row granularity over the ranks still short, so the rows that cross
    between workers are the fewest that equal counts allow. Padding (at most world - 1
    rows) repeats the table's first rows. A function of the metadata and the ranks'
    workers only.
    """
    world = len(rank_workers)
    n = int(sum(counts))
    quota = n // world if drop_last else -(-n // world)
    room = [quota] * world
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    by_worker: dict[str, list[int]] = {}
    for r, w in enumerate(rank_workers):
        by_worker.setdefault(w, []).append(r)
    left: list[tuple[int, int, int]] = []
    for p in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        start, stop = 0, int(counts[p])
        ranks = by_worker.get(holders[p] or "", [])
        while start < stop and ranks:
            r = max(ranks, key=lambda k: (room[k], -k))
            if room[r] == 0:
                break
            take = min(room[r], stop - start)
            pieces[r].append((p, start, start + take))
            room[r] -= take
            start += take
        if start < stop:
            left.append((p, start, stop))
    for p, start, stop in left:
        for r in range(world):
            if start >= stop:
                break
            take = min(room[r], stop - start)
            if take > 0:
                pieces[r].append((p, start, start + take))
                room[r] -= take
                start += take
    # Padding: the table's first rows again, for the ranks still short.
    cursor = 0
    offsets = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))])
    for r in range(world):
        while room[r] > 0 and n > 0:
            g = cursor % n
            p = int(np.searchsorted(offsets, g, side="right") - 1)
            start = int(g - offsets[p])
            take = min(room[r], int(counts[p]) - start)
            pieces[r].append((p, start, start + take))
            room[r] -= take
            cursor += take
    for r in range(world):
        pieces[r].sort()
    return pieces


def local_sequence(counts: Sequence[int], pieces: list[list[tuple[int, int, int]]], *,
                   seed: int, epoch: int, window: int) -> EpochSequence:
    """The epoch for ``shuffle="local"``: each rank's own rows, reordered by (seed, epoch),
    interleaved so that rank ``r`` reads ``S[r::world]`` as in the other modes."""
    from dask_ddp import _core

    offsets = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))])
    world = len(pieces)
    per_rank_rows, per_rank_wins = [], []
    n = int(offsets[-1])
    for r, mine in enumerate(pieces):
        rng = _rng(seed, epoch, r + 1)
        order = rng.permutation(len(mine)) if mine else np.zeros(0, np.int64)
        rows, wins = [], []
        for w, group in enumerate(_windows(order, max(1, window))):
            ids = np.concatenate([np.arange(offsets[mine[i][0]] + mine[i][1],
                                            offsets[mine[i][0]] + mine[i][2]) for i in group]
                                 ).astype(np.int64, copy=False)
            _core.shuffle_rows(ids, *_key(seed, epoch), r + 1, w)
            rows.append(ids)
            wins.append(np.full(len(ids), w, np.int64))
        rr = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        per_rank_rows.append(rr)
        per_rank_wins.append(np.concatenate(wins) if wins else np.zeros(0, np.int64))
    # Padding rows are the ones beyond n: mark the repeats (the rows seen twice).
    m = len(per_rank_rows[0]) if world else 0
    rows_all = np.empty(m * world, np.int64)
    wins_all = np.empty(m * world, np.int64)
    pad_all = np.zeros(m * world, bool)
    for r in range(world):
        rows_all[r::world] = per_rank_rows[r]
        wins_all[r::world] = per_rank_wins[r]
    if m * world > n:
        # The repeats: every occurrence of a row after its first.
        pad_all[:] = True
        pad_all[np.unique(rows_all, return_index=True)[1]] = False
    return EpochSequence(rows_all, wins_all, pad_all)


def resumed_sequence(full: EpochSequence, *, consumed_per_rank: int, old_world: int,
                     new_world: int, drop_last: bool) -> EpochSequence:
    """The rest of an epoch saved on ``old_world`` ranks after each read
    ``consumed_per_rank`` rows, dealt to ``new_world`` ranks: every row not yet read (the
    padding left out), padded again for the new world size."""
    start = min(len(full.rows), consumed_per_rank * old_world)
    keep = ~full.pad[start:]
    rows = full.rows[start:][keep]
    wins = full.window[start:][keep]
    # Grouped by window (a no-op unless shuffle="local", whose ranks' windows interleave),
    # so each new rank still fetches a window's partitions in one piece.
    order = np.argsort(wins, kind="stable")
    return pad_to(rows[order], wins[order], new_world, drop_last)
