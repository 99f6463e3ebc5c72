// The index work of a rank's epoch over a table, per epoch and linear in its rows: the
// epoch's sequence of row ids window by window (table order, or shuffled inside each
// window), and a window's split into its partitions' pieces (which rows each partition
// gives, where each position finds its row). Python's plan (dask_ddp.data.table.plan)
// decides what an epoch is; this is its arithmetic at memory speed.
//
// Orders are keyed by four words (the seed, the epoch, a salt and the window): the same
// key gives the same order on every host and every run, and any key gives an order of its
// own. A rank lays out only its own positions of an epoch (RankSequence): a window's
// permutation gives any position's row alone (WindowPermutation).
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

// A permutation of the positions [0, size) of a window that gives any position's image
// alone (random access): a rank finds its own positions' rows without the whole window.
// Up to kShuffleInCache positions it is a Fisher-Yates shuffle (ShuffleRows' order of the
// positions, held in a table); beyond, a keyed four-round Feistel network (Luby-Rackoff:
// a pseudorandom permutation) over the fewest bits that hold size, its values beyond
// size walked on through the network (fewer than two steps on average), as TensorFlow's
// index_shuffle and Grain do it.
class WindowPermutation {
 public:
  WindowPermutation(uint64_t size, const ShuffleKey& key);
  uint64_t size() const { return size_; }
  // The image of position j < size().
  uint64_t operator()(uint64_t j) const {
    if (!table_.empty()) return static_cast<uint64_t>(table_[j]);
    uint64_t y = Network(j);
    while (y >= size_) y = Network(y);
    return y;
  }
  // The images of positions first, first + step, ... (n of them, each < size()) into out:
  // the networks of a block computed side by side.
  void Images(uint64_t first, uint64_t step, size_t n, uint64_t* out) const;

 private:
  uint64_t Network(uint64_t x) const;

  uint64_t size_;
  std::vector<int64_t> table_;   // the Fisher-Yates permutation (small windows)
  std::array<uint64_t, 4> round_keys_{};
  unsigned high_bits_ = 0;       // the Feistel halves: high_bits_ + low_bits_ bits
  unsigned low_bits_ = 0;
};

// The rows of the partitions `order` names, `window` partitions at a time: window w holds
// the rows of partitions order[w * window ...] (each partition's rows in table order, the
// partitions in the order given), permuted inside the window when `shuffle` (by the
// WindowPermutation of key {seed, epoch, salt, w}: position j of the window holds the
// laid-out row at its image). rows[i] is a row id of the table (partition p's rows are
// sum(counts[:p]) ...), wins[i] its window. rows and wins hold sum(counts[order[k]])
// entries each. InvalidArgument when a count is negative, an order entry names no
// partition, window is 0 or the outputs' sizes are wrong.
Status WindowedSequence(std::span<const int64_t> counts, std::span<const int64_t> order,
                        size_t window, bool shuffle, uint64_t seed, uint64_t epoch,
                        uint64_t salt, std::span<int64_t> rows, std::span<int64_t> wins);

// Rank `rank`'s share of the epoch WindowedSequence lays out (same arguments), spread over
// `world` ranks as torch's DistributedSampler spreads a sequence S of n rows: S padded by
// repeating its first rows up to a multiple of world (the repeats in the window after the
// last row's), or cut to one when drop_last; the rank takes positions rank, rank + world,
// ... Equal to that sequence's entries, but only the rank's positions are computed
// (through each window's WindowPermutation): time linear in the rank's rows, no
// table-sized array. InvalidArgument as WindowedSequence, or when rank >= world or world
// is 0.
Status RankSequence(std::span<const int64_t> counts, std::span<const int64_t> order,
                    size_t window, bool shuffle, uint64_t seed, uint64_t epoch, uint64_t salt,
                    size_t world, size_t rank, bool drop_last, std::vector<int64_t>* rows,
                    std::vector<int64_t>* wins);

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
