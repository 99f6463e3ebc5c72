#include "pipeline/sampler.h"

#include <numeric>
#include <string>

#include "image/rng.h"

namespace ddp::pipeline {

Result<DistributedSampler> DistributedSampler::Create(int64_t n, const SamplerOptions& o) {
  if (o.world_size < 1) return InvalidArgumentError("world_size must be >= 1, got " + std::to_string(o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgumentError("rank must be in [0, " + std::to_string(o.world_size) + "), got " +
                                std::to_string(o.rank));
  }
  if (n < 0) return InvalidArgumentError("dataset size must be >= 0");
  DistributedSampler s;
  s.n_ = n;
  s.opt_ = o;
  const int64_t ws = o.world_size;
  // As torch: drop_last and an uneven split drop the tail, otherwise pad up.
  if (o.drop_last && n % ws != 0) {
    s.num_samples_ = (n - ws + ws - 1) / ws;  // ceil((n - ws) / ws)
    if (s.num_samples_ < 0) s.num_samples_ = 0;
  } else {
    s.num_samples_ = (n + ws - 1) / ws;
  }
  return s;
}

std::vector<int64_t> DistributedSampler::Indices(uint64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (opt_.shuffle && n_ > 1) {
    // Fisher-Yates with a stream of (seed, epoch); index ~0 keeps it apart from the
    // per-sample augmentation streams.
    image::Rng rng = image::Rng::ForSample(opt_.seed, epoch, ~uint64_t{0});
    for (int64_t i = n_ - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i + 1)));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  const int64_t total = num_samples_ * opt_.world_size;
  if (total > n_ && n_ > 0) {
    const int64_t base = n_;
    for (int64_t k = 0; static_cast<int64_t>(order.size()) < total; ++k) {
      order.push_back(order[static_cast<size_t>(k % base)]);
    }
  }
  order.resize(static_cast<size_t>(total));
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t p = opt_.rank; p < total; p += opt_.world_size) mine.push_back(order[static_cast<size_t>(p)]);
  return mine;
}

}  // namespace ddp::pipeline
