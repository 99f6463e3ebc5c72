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

// A member of a sample other than its image, as the Loader batches it: arrays (a .npy,
// parsed and checked by the source) stacked into one tensor per batch, integers into an
// int64 tensor, anything else handed over per sample as bytes.
enum class FieldKind { kArray, kInt, kBytes };

struct SampleField {
  FieldKind kind = FieldKind::kBytes;
  std::string bytes;             // the member as stored (kArray: the whole .npy)
  int64_t value = 0;             // kInt
  char dtype_kind = 'f';         // kArray: 'b' bool, 'i', 'u', 'f'
  int itemsize = 0;              // kArray: bytes per element
  std::vector<int64_t> shape;    // kArray
  uint64_t data_offset = 0;      // kArray: of the array's bytes within `bytes`
};

struct SourceSample {
  std::string bytes;  // the encoded image (none when the Loader decodes no images)
  int64_t label = -1;
  std::string url;    // names the sample in errors
  std::vector<SampleField> fields;  // the members the Loader was asked for, in order
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
