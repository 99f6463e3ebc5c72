#include "shards/order.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "image/rng.h"

namespace ddp::shards {

namespace {

// Stream indices apart from the per-sample augmentation streams (which use the id).
constexpr uint64_t kShardStream = ~uint64_t{0} - 1;
constexpr uint64_t kBufferStream = ~uint64_t{0} - 2;

}  // namespace

std::vector<int64_t> Prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> prefix(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) prefix[i + 1] = prefix[i] + counts[i];
  return prefix;
}

int64_t ShardOf(const std::vector<int64_t>& prefix, int64_t id) {
  const auto it = std::upper_bound(prefix.begin(), prefix.end(), id);
  return static_cast<int64_t>(it - prefix.begin()) - 1;
}

std::vector<int64_t> EpochShards(int64_t num_shards, bool shuffle, uint64_t seed, uint64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(num_shards, 0)));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle) {
    image::Rng rng = image::Rng::ForSample(seed, epoch, kShardStream);
    for (size_t i = order.size(); i > 1; --i) {
      const size_t j = rng.Below(i);
      std::swap(order[i - 1], order[j]);
    }
  }
  return order;
}

std::vector<Segment> EpochSegments(const std::vector<int64_t>& counts, bool shuffle, uint64_t seed,
                                   uint64_t epoch) {
  std::vector<Segment> out;
  for (int64_t s : EpochShards(static_cast<int64_t>(counts.size()), shuffle, seed, epoch)) {
    out.push_back({s, 0, counts[static_cast<size_t>(s)]});
  }
  return out;
}

Status CheckSegments(const std::vector<int64_t>& counts, const std::vector<Segment>& segments) {
  for (int64_t c : counts) {
    if (c < 0) return InvalidArgumentError("a shard's sample count must be >= 0, got " + std::to_string(c));
  }
  for (const Segment& g : segments) {
    if (g.shard < 0 || g.shard >= static_cast<int64_t>(counts.size())) {
      return InvalidArgumentError("shard " + std::to_string(g.shard) + " is outside [0, " +
                                  std::to_string(counts.size()) + ")");
    }
    const int64_t c = counts[static_cast<size_t>(g.shard)];
    if (g.begin < 0 || g.begin > g.end || g.end > c) {
      return InvalidArgumentError("segment [" + std::to_string(g.begin) + ", " + std::to_string(g.end) +
                                  ") of shard " + std::to_string(g.shard) + " is outside its " +
                                  std::to_string(c) + " samples");
    }
  }
  return Status::Ok();
}

namespace {

Status CheckRank(const ShardOrderOptions& o) {
  if (o.world_size < 1) return InvalidArgumentError("world_size must be >= 1, got " + std::to_string(o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgumentError("rank must be in [0, " + std::to_string(o.world_size) + "), got " +
                                std::to_string(o.rank));
  }
  return Status::Ok();
}

// Positions [from, to) of the concatenation of `segments` (total `n` samples), wrapping
// to the head past its end (the padding), as segments.
std::vector<Segment> Slice(const std::vector<Segment>& segments, int64_t n, int64_t from, int64_t to) {
  std::vector<Segment> out;
  if (n <= 0) return out;
  int64_t pos = from;
  while (pos < to) {
    int64_t at = pos % n;  // position within one pass over the segments
    const int64_t pass_left = n - at;
    int64_t want = std::min(to - pos, pass_left);
    for (const Segment& g : segments) {
      if (want == 0) break;
      if (at >= g.size()) {
        at -= g.size();
        continue;
      }
      const int64_t take = std::min(want, g.size() - at);
      Segment part{g.shard, g.begin + at, g.begin + at + take};
      if (!out.empty() && out.back().shard == part.shard && out.back().end == part.begin) {
        out.back().end = part.end;
      } else {
        out.push_back(part);
      }
      pos += take;
      want -= take;
      at = 0;
    }
  }
  return out;
}

}  // namespace

Result<RankOrder> RankSamples(const std::vector<int64_t>& counts, const std::vector<Segment>& segments,
                              uint64_t epoch, const ShardOrderOptions& o) {
  DDP_RETURN_IF_ERROR(CheckRank(o));
  DDP_RETURN_IF_ERROR(CheckSegments(counts, segments));
  int64_t n = 0;
  for (const Segment& g : segments) n += g.size();
  const int64_t w = o.world_size;
  const int64_t per = o.drop_last ? n / w : (n + w - 1) / w;
  RankOrder out;
  out.parts = Slice(segments, n, o.rank * per, (o.rank + 1) * per);
  const std::vector<int64_t> prefix = Prefix(counts);
  std::vector<int64_t>& seq = out.samples;
  seq.reserve(static_cast<size_t>(per));
  const bool buffered = o.shuffle && o.shuffle_buffer > 1;
  image::Rng rng = image::Rng::ForSample(o.seed ^ static_cast<uint64_t>(o.rank), epoch, kBufferStream);
  std::vector<int64_t> buffer;
  for (const Segment& g : out.parts) {
    for (int64_t i = g.begin; i < g.end; ++i) {
      const int64_t id = prefix[static_cast<size_t>(g.shard)] + i;
      if (!buffered) {
        seq.push_back(id);
      } else if (static_cast<int64_t>(buffer.size()) < o.shuffle_buffer) {
        buffer.push_back(id);
      } else {
        const size_t j = rng.Below(buffer.size());
        seq.push_back(buffer[j]);
        buffer[j] = id;
      }
    }
  }
  while (!buffer.empty()) {
    const size_t j = rng.Below(buffer.size());
    seq.push_back(buffer[j]);
    buffer[j] = buffer.back();
    buffer.pop_back();
  }
  return out;
}

Result<std::vector<Segment>> UnreadSegments(const std::vector<int64_t>& counts, const std::vector<Segment>& segments,
                                            uint64_t epoch, const ShardOrderOptions& options, int64_t position) {
  if (position < 0) return InvalidArgumentError("position must be >= 0, got " + std::to_string(position));
  DDP_RETURN_IF_ERROR(CheckRank({.rank = 0, .world_size = options.world_size}));
  DDP_RETURN_IF_ERROR(CheckSegments(counts, segments));
  const std::vector<int64_t> prefix = Prefix(counts);
  std::vector<bool> seen(static_cast<size_t>(prefix.back()), false);
  for (int r = 0; r < options.world_size; ++r) {
    ShardOrderOptions o = options;
    o.rank = r;
    DDP_ASSIGN_OR_RETURN(RankOrder order, RankSamples(counts, segments, epoch, o));
    const size_t k = std::min(order.samples.size(), static_cast<size_t>(position));
    for (size_t i = 0; i < k; ++i) seen[static_cast<size_t>(order.samples[i])] = true;
  }
  std::vector<Segment> out;
  for (const Segment& g : segments) {
    const int64_t base = prefix[static_cast<size_t>(g.shard)];
    for (int64_t i = g.begin; i < g.end; ++i) {
      if (seen[static_cast<size_t>(base + i)]) continue;
      if (!out.empty() && out.back().shard == g.shard && out.back().end == i) {
        ++out.back().end;
      } else {
        out.push_back({g.shard, i, i + 1});
      }
    }
  }
  return out;
}

}  // namespace ddp::shards
