// The index work of a rank's epoch over a table, per epoch and linear in its rows: the
// epoch's sequence of row ids window by window (table order, or shuffled inside each
// window), and a window's split into its partitions' pieces (which rows each partition
// gives, where each position finds its row). Python's plan (dask_ddp.data.table.plan)
// decides what an epoch is; this is its arithmetic at memory speed.
//
// Shuffles are Fisher-Yates over a counter-based generator keyed by four words (the seed,
// the epoch, a salt and the window): the same key gives the same order on every host and
// every run, and any key gives an order of its own.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ddp/status.h"

namespace ddp::table {

using ShuffleKey = std::array<uint64_t, 4>;

// Ids a Fisher-Yates shuffle swaps at cache speed (512 KiB).
inline constexpr size_t kShuffleInCache = size_t{1} << 16;

// Permutes `ids` in place, uniformly, in the order `key` gives: Fisher-Yates (unbiased
// bounded draws) up to `in_cache` ids; beyond, the ids are first spread over buckets of
// about that size in one pass, then each bucket is shuffled alone (tests lower in_cache).
void ShuffleRows(std::span<int64_t> ids, const ShuffleKey& key,
                 size_t in_cache = kShuffleInCache);

// The rows of the partitions `order` names, `window` partitions at a time: window w holds
// the rows of partitions order[w * window ...] (each partition's rows in table order, the
// partitions in the order given), shuffled inside the window when `shuffle` (key {seed,
// epoch, salt, w}). rows[i] is a row id of the table (partition p's rows are
// sum(counts[:p]) ...), wins[i] its window. rows and wins hold sum(counts[order[k]])
// entries each. InvalidArgument when a count is negative, an order entry names no
// partition, window is 0 or the outputs' sizes are wrong.
Status WindowedSequence(std::span<const int64_t> counts, std::span<const int64_t> order,
                        size_t window, bool shuffle, uint64_t seed, uint64_t epoch,
                        uint64_t salt, std::span<int64_t> rows, std::span<int64_t> wins);

// A window's rows split by partition.
struct WindowIndex {
  std::vector<int64_t> partitions;  // the partitions with rows in the window, table order
  std::vector<int64_t> sizes;       // rows of each partition's piece
  std::vector<int32_t> seg;         // for each position: its partition's index in partitions
  std::vector<int64_t> row;         // for each position: its row in its partition's piece
  // Not whole: each piece's rows (distinct, sorted, within the partition), end to end.
  std::vector<int64_t> piece_rows;
};

// Splits `rows` (table row ids, repeats allowed) by the partitions of `offsets` (the
// first row of each partition, then the table's rows; non-decreasing from 0). whole: a
// piece is its whole partition (a position's row is its row in the partition); else a
// piece is the partition's distinct rows in the window, sorted. Linear in the rows and
// the present partitions' sizes. OutOfRange names the first position whose row is not
// in the table; InvalidArgument for bad offsets.
Status IndexWindow(std::span<const int64_t> rows, std::span<const int64_t> offsets, bool whole,
                   WindowIndex* out);

}  // namespace ddp::table
