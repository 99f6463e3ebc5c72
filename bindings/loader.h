// The binding's handle on a pipeline::Loader, shared by the ImageLoader binding
// (loader.cc) and the TarShardLoader one (shards.cc), which derives from it.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "convert.h"
#include "image/decode.h"
#include "pipeline/loader.h"
#include "storage.h"

namespace ddp::py {

// Options of the ImageLoader binding, as keyword-only arguments with these defaults.
struct PyLoaderArgs {
  int batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  bool drop_last = false;
  int num_threads = 0;
  int prefetch = 4;
  bool skip_errors = false;
  bool skip_missing = false;
  int max_side = image::DecodeOptions{}.max_side;
  bool scaled_decode = true;
  bool region_decode = true;
  int max_in_flight = 0;
};

pipeline::LoaderOptions MakeLoaderOptions(const PyLoaderArgs& a);

// The Loader is shared: next() holds its own reference while it waits with the GIL
// released, so close() from another thread stops it (next() then raises "closed") and the
// last holder destroys it, never one under the other.
class PyLoader {
 public:
  PyLoader(const PyStore& store, std::vector<std::string> keys, std::vector<int64_t> labels,
           const std::vector<OpSpec>& ops, const PyLoaderArgs& a);

  void StartEpoch(uint64_t epoch, int64_t start_batch);
  void Restart(std::vector<std::string> keys, std::vector<int64_t> labels);
  // (images, labels, batch_index[, fields]) or None at the epoch's end.
  nanobind::object Next();
  void Close();
  // The Loader; ValueError once closed.
  std::shared_ptr<pipeline::Loader> checked() const;

 protected:
  PyLoader() = default;
  std::shared_ptr<pipeline::Loader> loader_;
  bool decode_images_ = true;
  bool fields_ = false;  // next() also returns the batch's fields
};

}  // namespace ddp::py
