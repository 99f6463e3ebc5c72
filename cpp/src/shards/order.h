// The order of a sharded dataset's samples in an epoch, computed from per-shard sample
// counts alone (no data), so it is exact on resume and identical on every run.
//
// The epoch's shards are shuffled by (seed, epoch) and dealt to ranks (positions r,
// r + W, ...); without drop_last the shard list is first padded to a multiple of W by
// repeating its head (as torch's DistributedSampler pads indices). Each rank streams its
// shards' samples through a shuffle buffer (size `shuffle_buffer`, random by (seed,
// epoch, rank)). Every rank yields the same number of samples: without drop_last the
// largest rank's count (the others repeat their own sequence from its start), with
// drop_last the smallest (the others drop their tail).
//
// A sample is identified by a global id: the sum of the counts of the shards before its
// shard, plus its ordinal within the shard.
#pragma once

#include <cstdint>
#include <vector>

#include "ddp/status.h"

namespace ddp::shards {

struct ShardOrderOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  bool drop_last = false;
  int64_t shuffle_buffer = 1000;  // <= 1: no sample shuffle within the rank
};

// The shards of `epoch` in order: 0..num_shards-1, shuffled when `shuffle`.
std::vector<int64_t> EpochShards(int64_t num_shards, bool shuffle, uint64_t seed, uint64_t epoch);

struct RankOrder {
  std::vector<int64_t> samples;  // global ids, in order
  std::vector<int64_t> shards;   // this rank's shards, in reading order
};

// Rank `options.rank`'s samples for `epoch`, reading the shards `epoch_shards` (normally
// EpochShards(...); a subset after a change of world size) with `counts[s]` samples each.
Result<RankOrder> RankSamples(const std::vector<int64_t>& counts, const std::vector<int64_t>& epoch_shards,
                              uint64_t epoch, const ShardOrderOptions& options);

// The shard of global id `id` (prefix[s] = samples before shard s; size num_shards + 1).
int64_t ShardOf(const std::vector<int64_t>& prefix, int64_t id);
std::vector<int64_t> Prefix(const std::vector<int64_t>& counts);

}  // namespace ddp::shards
