// A source of samples other than one object per key (e.g. tar shards): it decides the
// epoch's order and delivers each sample's encoded image with its label. The Loader
// decodes, transforms and batches what it delivers exactly as it does objects of a Store.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ddp/status.h"

namespace ddp::pipeline {

struct SourceSample {
  std::string bytes;  // the encoded image
  int64_t label = -1;
  std::string url;    // names the sample in errors
};

// Called once per requested position, in any order, never concurrently.
using SampleCallback = std::function<void(size_t index, Result<SourceSample> sample)>;

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // This rank's samples for `epoch`, in order (identifiers used for per-sample random
  // draws); the same length on every rank. Resets any state of the previous epoch.
  virtual Result<std::vector<int64_t>> Order(uint64_t epoch) = 0;
  // The length of Order(epoch).
  virtual int64_t NumSamples(uint64_t epoch) const = 0;
  // Delivers the samples at `positions` of the last Order() through `cb` (one call per
  // position, failures included). Calls come from one thread, positions increasing
  // across calls. Stops early (kCancelled to the rest) once `cancel` is true.
  virtual Status Fetch(std::span<const int64_t> positions, const SampleCallback& cb,
                       const std::atomic<bool>& cancel) = 0;
  // Samples the source itself left out (skip_errors), counted by the Loader's skipped().
  virtual int64_t skipped() const { return 0; }
};

}  // namespace ddp::pipeline
