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

// Shards dealt to `rank`: positions rank, rank + W, ... of the (padded) list.
std::vector<int64_t> Deal(std::vector<int64_t> list, int rank, int world, bool pad) {
  if (pad && !list.empty()) {
    const size_t base = list.size();
    for (size_t k = 0; list.size() % static_cast<size_t>(world) != 0; ++k) list.push_back(list[k % base]);
  }
  std::vector<int64_t> mine;
  for (size_t p = static_cast<size_t>(rank); p < list.size(); p += static_cast<size_t>(world)) mine.push_back(list[p]);
  return mine;
}

int64_t Total(const std::vector<int64_t>& counts, const std::vector<int64_t>& shards) {
  int64_t n = 0;
  for (int64_t s : shards) n += counts[static_cast<size_t>(s)];
  return n;
}

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

Result<RankOrder> RankSamples(const std::vector<int64_t>& counts, const std::vector<int64_t>& epoch_shards,
                              uint64_t epoch, const ShardOrderOptions& o) {
  if (o.world_size < 1) return InvalidArgumentError("world_size must be >= 1, got " + std::to_string(o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgumentError("rank must be in [0, " + std::to_string(o.world_size) + "), got " +
                                std::to_string(o.rank));
  }
  for (int64_t s : epoch_shards) {
    if (s < 0 || s >= static_cast<int64_t>(counts.size())) {
      return InvalidArgumentError("shard " + std::to_string(s) + " is outside [0, " + std::to_string(counts.size()) + ")");
    }
  }
  for (int64_t c : counts) {
    if (c < 0) return InvalidArgumentError("a shard's sample count must be >= 0, got " + std::to_string(c));
  }
  // Every rank's count decides the common length.
  int64_t target = -1;
  for (int r = 0; r < o.world_size; ++r) {
    const int64_t n = Total(counts, Deal(epoch_shards, r, o.world_size, !o.drop_last));
    target = target < 0 ? n : (o.drop_last ? std::min(target, n) : std::max(target, n));
  }
  RankOrder out;
  out.shards = Deal(epoch_shards, o.rank, o.world_size, !o.drop_last);
  const std::vector<int64_t> prefix = Prefix(counts);
  std::vector<int64_t>& seq = out.samples;
  seq.reserve(static_cast<size_t>(std::max<int64_t>(target, 0)));
  const bool buffered = o.shuffle && o.shuffle_buffer > 1;
  image::Rng rng = image::Rng::ForSample(o.seed ^ static_cast<uint64_t>(o.rank), epoch, kBufferStream);
  std::vector<int64_t> buffer;
  for (int64_t s : out.shards) {
    for (int64_t i = 0; i < counts[static_cast<size_t>(s)]; ++i) {
      const int64_t id = prefix[static_cast<size_t>(s)] + i;
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
  if (target > static_cast<int64_t>(seq.size())) {
    if (seq.empty()) {
      return InvalidArgumentError("rank " + std::to_string(o.rank) + " has no samples to repeat to " +
                                  std::to_string(target) + " (its shards are empty)");
    }
    const size_t base = seq.size();
    for (size_t k = 0; static_cast<int64_t>(seq.size()) < target; ++k) seq.push_back(seq[k % base]);
  }
  seq.resize(static_cast<size_t>(target));
  return out;
}

}  // namespace ddp::shards
