// Which dataset indices a rank reads in an epoch: torch's DistributedSampler semantics.
//
// Shuffle by (seed, epoch) (our own permutation: deterministic across platforms, not
// torch.randperm's order); without drop_last, pad by repeating the head of the order to a
// multiple of world_size; with drop_last, drop the tail instead; rank r takes positions
// r, r + world_size, ... Every index appears exactly once per epoch across ranks when the
// dataset size is a multiple of world_size; padding repeats a few otherwise, as torch does.
#pragma once

#include <cstdint>
#include <vector>

#include "ddp/status.h"

namespace ddp::pipeline {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  static Result<DistributedSampler> Create(int64_t dataset_size, const SamplerOptions& options);
  // Samples per rank per epoch.
  int64_t num_samples() const { return num_samples_; }
  // This rank's indices for `epoch`, in order.
  std::vector<int64_t> Indices(uint64_t epoch) const;

 private:
  int64_t n_ = 0;
  int64_t num_samples_ = 0;
  SamplerOptions opt_;
};

}  // namespace ddp::pipeline
