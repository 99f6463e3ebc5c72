// The order of a sharded dataset's samples in an epoch, computed from per-shard sample
// counts alone (no data), so it is exact on resume and identical on every run.
//
// An epoch reads a list of segments, each a range of one shard's samples (normally every
// shard whole, shuffled by (seed, epoch); after a change of world size, the samples no
// rank had yielded). Their samples, concatenated in list order, are split across ranks at
// sample granularity, as torch's DistributedSampler splits indices: each rank takes the
// same number of samples, ceil(N / W) (without drop_last: the sequence is padded by
// repeating its head, at most W - 1 samples) or floor(N / W) (with drop_last: at most
// W - 1 samples of the tail are dropped). Rank r takes the contiguous run
// [r * n, (r + 1) * n), so it reads consecutive segments, the first and last possibly in
// part: a shard on a boundary between two ranks is read by both, each taking its range
// (at most W - 1 such shards per epoch, plus the head again for the padding). Each rank
// streams its samples through a shuffle buffer (size `shuffle_buffer`, random by
// (seed, epoch, rank)).
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

// Samples [begin, end) of shard `shard` (ordinals within the shard).
struct Segment {
  int64_t shard = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  friend bool operator==(const Segment&, const Segment&) = default;
};

// The shards of `epoch` in order: 0..num_shards-1, shuffled when `shuffle`.
std::vector<int64_t> EpochShards(int64_t num_shards, bool shuffle, uint64_t seed, uint64_t epoch);
// EpochShards as segments, each shard whole.
std::vector<Segment> EpochSegments(const std::vector<int64_t>& counts, bool shuffle, uint64_t seed,
                                   uint64_t epoch);

struct RankOrder {
  std::vector<int64_t> samples;  // global ids, in order
  std::vector<Segment> parts;    // what this rank reads, in reading order (padding included)
};

// Checks `segments` against `counts` (shard in range, 0 <= begin <= end <= count).
Status CheckSegments(const std::vector<int64_t>& counts, const std::vector<Segment>& segments);

// Rank `options.rank`'s samples for `epoch`, reading `segments` (normally
// EpochSegments(...)) of shards with `counts[s]` samples each.
Result<RankOrder> RankSamples(const std::vector<int64_t>& counts, const std::vector<Segment>& segments,
                              uint64_t epoch, const ShardOrderOptions& options);

// The samples of `segments` that no rank of `options.world_size` had yielded once each
// had yielded its first `position` samples of `epoch`, as segments in the epoch's order
// (maximal runs of unseen ordinals). Samples no rank would have yielded (drop_last's
// tail) count as unseen.
Result<std::vector<Segment>> UnreadSegments(const std::vector<int64_t>& counts, const std::vector<Segment>& segments,
                                            uint64_t epoch, const ShardOrderOptions& options, int64_t position);

// The shard of global id `id` (prefix[s] = samples before shard s; size num_shards + 1).
int64_t ShardOf(const std::vector<int64_t>& prefix, int64_t id);
std::vector<int64_t> Prefix(const std::vector<int64_t>& counts);

}  // namespace ddp::shards
